"""The runner's step-loop savings (engine/generate/core/runner.py, decode_group.py): a decode group's past
kept between steps, leavers' rows reused by joiners in place, and prefill chunks batched by length (the tests
marked `kv` also for the shared-KV layout: test_generate_shared_kv.py has its own). Every test
checks the tokens against the plain step-by-step loop of test_generate_engine.py, and the savings through
the runner's public statistics."""

from __future__ import annotations

import numpy as np

from engine.generate.core.request import Request, SamplingParams
from engine.generate.core.runner import prefill_groups
from engine.generate.core.scheduler import ScheduledChunk
from test_generate_engine import (
    GREEDY,
    KV,
    assert_no_leaks,
    make_engine,
    prompts,
    reference_greedy,
)


def same_length_prompts(count: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[256, *rng.integers(32, 127, size=length - 1).tolist()] for _ in range(count)]


def test_a_steady_decode_group_gathers_nothing_after_its_first_step(reference_session):
    batch = same_length_prompts(4, 20, seed=21)
    engine = make_engine(budget=256)
    for i, prompt in enumerate(batch):
        engine.add_request(f"r{i}", prompt, GREEDY)
    engine.step()
    stats = engine.runner.stats
    assert stats.runs == 1  # four prompts of one length: one prefill run
    done = engine.run_to_completion()
    for i, prompt in enumerate(batch):
        assert list(done[f"r{i}"].output_token_ids) == reference_greedy(reference_session, prompt, 24)
    assert stats.decode_rows == 4 * (GREEDY.max_tokens - 1)
    assert stats.gathered_rows == 4 and stats.rebuilds == 1  # gathered once, then fed back
    assert_no_leaks(engine)


def test_a_joiner_takes_a_leavers_row_in_place(reference_session):
    batch = same_length_prompts(8, 20, seed=41)
    engine = make_engine(budget=256)
    for i, prompt in enumerate(batch):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=6 if i == 0 else 30, ignore_eos=True))
    done = {}
    while "r0" not in done:
        done.update({o.request_id: o.output_token_ids for o in engine.step() if o.finished})
    joiner = prompts(1, seed=43)[0][:12]
    engine.add_request("late", joiner, GREEDY)
    done.update({k: v.output_token_ids for k, v in engine.run_to_completion().items()})
    for i, prompt in enumerate(batch):
        assert list(done[f"r{i}"]) == reference_greedy(reference_session, prompt, 6 if i == 0 else 30)
    assert list(done["late"]) == reference_greedy(reference_session, joiner, 24)
    stats = engine.runner.stats
    assert stats.gathered_rows == 9 and stats.free_rows > 0
    assert stats.rebuilds == 1  # built once; the leave and the join moved no other row


def test_members_leaving_and_joining_at_other_lengths_keep_every_token(reference_session):
    """Short prompts with long outputs; a long prompt joins (the group's past widens), ends early (it
    narrows again), and others keep joining and leaving."""
    engine = make_engine(budget=256)
    jobs = [(p, 30) for p in prompts(3, seed=23)]
    for i, (prompt, max_tokens) in enumerate(jobs):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    done: dict[str, tuple[int, ...]] = {}
    late = [([256, *range(40, 160)], 5), *((p, 4 + 3 * i) for i, p in enumerate(prompts(4, seed=29)))]
    for step in range(200):
        if step % 3 == 2 and late:
            prompt, max_tokens = late.pop(0)
            jobs.append((prompt, max_tokens))
            engine.add_request(f"r{len(jobs) - 1}", prompt, SamplingParams(max_tokens=max_tokens,
                                                                            ignore_eos=True))
        done.update({o.request_id: o.output_token_ids for o in engine.step() if o.finished})
        if not engine.has_unfinished() and not late:
            break
    for i, (prompt, max_tokens) in enumerate(jobs):
        assert list(done[f"r{i}"]) == reference_greedy(reference_session, prompt, max_tokens)
    stats = engine.runner.stats
    assert stats.gathered_rows < stats.decode_rows / 2
    assert stats.free_rows > 0 and stats.rebuilds > 1  # leaves left free rows; widening forced rebuilds
    assert_no_leaks(engine)


@KV
def test_a_recycled_request_id_is_gathered_afresh(reference_session, kv):
    engine = make_engine(kv=kv)
    first, second = prompts(2, seed=31)
    engine.add_request("a", first, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("b", first, SamplingParams(max_tokens=10, ignore_eos=True))
    for _ in range(5):
        engine.step()
    engine.abort_request("a")
    engine.add_request("a", second, GREEDY)  # same id, other tokens, at another position
    done = engine.run_to_completion()
    assert list(done["a"].output_token_ids) == reference_greedy(reference_session, second, 24)
    assert list(done["b"].output_token_ids) == reference_greedy(reference_session, first, 10)
    assert_no_leaks(engine)


@KV
def test_preempted_rows_are_recomputed_not_reused(reference_session, kv):
    batch = prompts(10, seed=37)
    tight = make_engine(num_blocks=24, block_size=4, kv=kv)  # 96 slots for 10 sequences of up to ~85 tokens
    for i, prompt in enumerate(batch):
        tight.add_request(f"r{i}", prompt, GREEDY)
    done = tight.run_to_completion()
    assert tight.stats().preemptions > 0
    for i, prompt in enumerate(batch):
        assert list(done[f"r{i}"].output_token_ids) == reference_greedy(reference_session, prompt, 24)
    assert_no_leaks(tight)


def test_prefill_chunks_of_similar_length_share_a_run():
    def chunk(length: int, start: int = 0) -> ScheduledChunk:
        request = Request("r", [1] * (start + length), GREEDY, np.random.default_rng(0))
        return ScheduledChunk(request, start, (1,) * length, (0,), sample=True)

    chunks = [chunk(60), chunk(10), chunk(12), chunk(11), chunk(58), chunk(30, start=100)]
    assert prefill_groups(chunks, range(len(chunks))) == [[1, 3, 2], [5], [4, 0]]
    assert prefill_groups(chunks, [0]) == [[0]]
    assert prefill_groups(chunks, []) == []
