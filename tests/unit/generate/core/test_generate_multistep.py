"""The multi-step decode (engine.py `_steps`, runner.py `execute_steps`; `num_scheduler_steps`): a plan of
decodes runs several steps with each sampled token fed back and no schedule between, and every request gets
exactly what one step at a time gives it, in either KV layout: the dense step-by-step oracle's tokens when
greedy, the same draws when seeded, the same end (stop token, stop string, max_tokens, context) with the
tokens computed past it dropped, and the same blocks for prefix sharing. In process; the server's side is
in test_generate_shared_kv.py (a folder with num_scheduler_steps answering the `openai` client)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.generate.core.engine import GenerationEngine
from engine.generate.core.request import FinishReason, SamplingParams
from engine.generate.serving.model_folder import load_engine
from test_generate_engine import (
    GREEDY,
    KV,
    TOKENIZER,
    assert_no_leaks,
    generate,
    make_engine,
    prompts,
    reference_greedy,
)
from test_generate_shared_kv import run_with_joins, shared_folder

STEPS = pytest.mark.parametrize("steps", [3, 8])


def engine_with(steps: int, kv: str = "shared", **kwargs: int) -> GenerationEngine:
    return make_engine(kv=kv, steps=steps, **kwargs)


@KV
@STEPS
def test_greedy_equals_the_step_by_step_loop(reference_session, steps, kv):
    batch = prompts(12, seed=5)
    engine = engine_with(steps, kv)
    done = generate(engine, batch)
    for prompt, tokens in zip(batch, done, strict=True):
        assert list(tokens) == reference_greedy(reference_session, prompt, GREEDY.max_tokens)
    stats = engine.runner.stats
    assert stats.runs >= 2 * stats.steps  # most schedules ran several decode steps
    assert_no_leaks(engine)


@KV
def test_requests_joining_and_leaving_mid_run_get_the_same_tokens(reference_session, kv):
    jobs = [(p, 8 + 5 * (i % 6)) for i, p in enumerate(prompts(14, seed=9))]
    done = run_with_joins(engine_with(8, kv), jobs, every=3)
    for i, (prompt, max_tokens) in enumerate(jobs):
        assert list(done[f"r{i}"]) == reference_greedy(reference_session, prompt, max_tokens)


def test_seeded_sampling_draws_the_same_tokens_as_one_step_at_a_time():
    batch = prompts(6, seed=13)
    params = [SamplingParams(max_tokens=30, temperature=0.9, top_p=0.9, top_k=40, seed=100 + i,
                             ignore_eos=True) for i in range(len(batch))]
    outs = []
    for steps in (1, 8):
        engine = engine_with(steps)
        for i, (prompt, p) in enumerate(zip(batch, params, strict=True)):
            engine.add_request(f"r{i}", prompt, p)
        done = engine.run_to_completion()
        outs.append([done[f"r{i}"].output_token_ids for i in range(len(batch))])
    assert outs[0] == outs[1]


def test_stops_inside_a_multi_step_decode_end_where_one_step_would():
    """A stop token and a stop string land mid-way through the steps of one schedule, and what was computed
    past them is dropped; max_tokens caps the steps instead, so nothing is computed past it. Tokens, text and
    reason are one step at a time's."""
    prompt = [256, *b"Once upon"]
    free = generate(engine_with(1), [prompt], SamplingParams(max_tokens=40, ignore_eos=True))[0]
    text = TOKENIZER.decode(list(free[:15]))
    stop = text[-2:]  # ends with the 15th token
    assert text.find(stop) == len(text) - 2
    cases = [
        SamplingParams(max_tokens=40, stop_token_ids=(free[10],), ignore_eos=True),
        SamplingParams(max_tokens=40, stop=(stop,), ignore_eos=True),
        SamplingParams(max_tokens=11, ignore_eos=True),
    ]
    for params in cases:
        got = []
        for steps in (1, 8):
            engine = engine_with(steps)
            engine.add_request("r", prompt, params)
            out = engine.run_to_completion()["r"]
            got.append((out.output_token_ids, out.output_text, out.finish_reason))
            assert_no_leaks(engine)
        assert got[0] == got[1]
        assert len(got[1][0]) < 16  # it ended early, inside the second schedule's steps
    assert got[1][2] is FinishReason.LENGTH and len(got[1][0]) == 11
    # the prompt, then one token fed back per token generated but the last: not one more
    assert engine.runner.stats.tokens == len(prompt) + 11 - 1


def test_the_context_limit_caps_the_steps(reference_session):
    """A request 3 positions from the end of its context runs no step past it."""
    prompt = [256, *range(40, 100)]
    engine = engine_with(8, max_model_len=len(prompt) + 3)
    engine.add_request("r", prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    out = engine.run_to_completion()["r"]
    assert out.finish_reason is FinishReason.LENGTH
    assert list(out.output_token_ids) == reference_greedy(reference_session, prompt, 3)


@KV
def test_blocks_a_multi_step_decode_fills_are_shared_by_a_later_prompt(reference_session, kv):
    """The steps' tokens reach the blocks when their schedule's steps end, before the scheduler registers
    the blocks, so a prompt repeating the answer shares them and computes from the right keys and values."""
    engine = engine_with(8, kv, block_size=8)
    first = [256, *b"Tell me"]
    engine.add_request("a", first, SamplingParams(max_tokens=40, ignore_eos=True))
    answer = list(engine.run_to_completion()["a"].output_token_ids)
    follow = first + answer[:33]  # five full blocks, the last four written by multi-step decodes
    engine.add_request("b", follow, GREEDY)
    hits = engine.kv.prefix_hits
    got = engine.run_to_completion()["b"].output_token_ids
    assert engine.kv.prefix_hits - hits == 40
    assert list(got) == reference_greedy(reference_session, follow, GREEDY.max_tokens)


@KV
def test_a_pool_without_blocks_for_the_steps_runs_one_step_and_preempts_as_before(reference_session, kv):
    """With too few blocks, a schedule that cannot reserve every request's steps runs one step; the
    preemptions and recomputes that follow lose nothing."""
    batch = prompts(8, seed=17)
    engine = engine_with(8, kv, num_blocks=24, block_size=8)
    done = generate(engine, batch)
    for prompt, tokens in zip(batch, done, strict=True):
        assert list(tokens) == reference_greedy(reference_session, prompt, GREEDY.max_tokens)
    assert engine.scheduler.num_preemptions > 0
    assert_no_leaks(engine)


def test_a_waiting_request_takes_a_freed_seat_at_the_next_schedule(reference_session):
    """A request waiting for a seat is admitted at the schedule after the steps in which a seat freed: it
    waits at most one multi-step decode longer than one step at a time would make it."""
    engine = engine_with(8, seqs=2)
    batch = prompts(3, seed=21)
    for i, (prompt, max_tokens) in enumerate(zip(batch, (3, 24, 24), strict=True)):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    while not any(o.finished for o in engine.step() if o.request_id == "r0"):
        pass
    assert engine.scheduler.num_waiting == 1
    first = {o.request_id: o.new_token_ids for o in engine.step()}
    assert len(first["r2"]) == 1  # its prompt ran, and sampled its first token
    done = engine.run_to_completion()
    assert list(done["r2"].output_token_ids) == reference_greedy(reference_session, batch[2], 24)


def test_the_folder_parameter_sets_the_steps(tmp_path: Path):
    engine = load_engine(shared_folder(tmp_path, "steps", steps=4))
    assert engine.scheduler.config.num_scheduler_steps == 4
    with pytest.raises(EngineError, match="parameter num_scheduler_steps must be a positive integer"):
        load_engine(shared_folder(tmp_path, "no_steps", steps=0))
