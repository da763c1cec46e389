"""Speculative decoding with n-gram prompt lookup (proposer.py, verify.py, the scheduler's `num_draft`
chunks), in process over the tiny decoder in either KV layout: greedy requests get exactly the dense
step-by-step oracle's tokens whether their proposals are kept or rejected, beside requests that get none in
the same steps; stops inside a kept run end the request where one token at a time would; sampled requests
keep the target's distribution (chi-square over many seeded draws, deterministic); and the acceptance is
counted in EngineStats."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from conftest import EXAMPLES
from engine.errors import EngineError
from engine.generate.core.backoff import BackoffProposer
from engine.generate.core.draft_proposer import DraftModelProposer
from engine.generate.core.engine import CacheConfig, GenerationEngine
from engine.generate.core.grammar import GrammarKind, GrammarSpec
from engine.generate.core.proposer import NgramProposer, Proposer, SpeculativeConfig
from engine.generate.core.request import FinishReason, Request, SamplingParams
from engine.generate.core.runner import DecoderRunner
from engine.generate.core.scheduler import SchedulerConfig
from engine.generate.core.verify import verify
from engine.generate.serving.model_folder import load_engine
from hubserve_models import examples
from hubserve_models.tiny_decoder import TinyDecoderShape, tiny_decoder_model
from test_generate_engine import (
    GREEDY,
    KV,
    MODEL,
    SHARED_MODEL,
    TOKENIZER,
    assert_no_leaks,
    options,
    prompts,
    reference_greedy,
)

SPEC = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
NGRAM = NgramProposer(SPEC)


class OracleProposer:
    """Proposes what greedy decoding will give (`want`, by prompt), with every `wrong_every`-th proposal
    replaced by another token: runs of k kept, or cut where the test says, so stops land inside them."""

    def __init__(self, want: dict[tuple[int, ...], list[int]], k: int = 4, wrong_every: int = 0) -> None:
        self.want, self.k, self.wrong_every = want, k, wrong_every

    def release(self, request_id: str) -> None:
        pass

    def propose(self, request_id: str, token_ids: Sequence[int], limit: int) -> list[int]:
        for prompt, out in self.want.items():
            if tuple(token_ids[:len(prompt)]) == prompt:
                done = len(token_ids) - len(prompt)
                proposals = out[done:done + min(limit, self.k)]
                return [(t + 1) % 256 if self.wrong_every and (done + i) % self.wrong_every == 0 else t
                        for i, t in enumerate(proposals, 1)]
        return []


def spec_engine(kv: str = "dense", spec: Proposer | None = NGRAM, budget: int = 64,
                num_blocks: int = 256, block_size: int = 8, seqs: int = 16, steps: int = 1,
                ) -> GenerationEngine:
    shared = kv == "shared"
    runner = DecoderRunner(SHARED_MODEL if shared else MODEL, num_blocks, block_size, options(),
                           shared_kv=shared, max_len=512, max_rows=seqs)
    return GenerationEngine(runner, TOKENIZER, CacheConfig(block_size, num_blocks, 512),
                            SchedulerConfig(seqs, budget, num_scheduler_steps=steps), proposer=spec)


def repetitive(count: int, seed: int = 7) -> list[list[int]]:
    """Prompts that repeat a short phrase: their suffix is found earlier, so proposals are made."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        phrase = rng.integers(32, 127, size=int(rng.integers(2, 6))).tolist()
        out.append([256, *phrase * int(rng.integers(2, 6))])
    return out


def run(engine: GenerationEngine, batch: list[list[int]], params: list[SamplingParams],
        ) -> list[tuple[int, ...]]:
    for i, (prompt, p) in enumerate(zip(batch, params, strict=True)):
        engine.add_request(f"r{i}", prompt, p)
    done = engine.run_to_completion()
    return [done[f"r{i}"].output_token_ids for i in range(len(batch))]


# ------------------------------------------------------------------------------------------ the proposer

def test_ngram_lookup_takes_the_longest_suffix_at_its_latest_earlier_occurrence():
    proposer = NgramProposer(SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1,
                                               prompt_lookup_max=2))
    # the 2-gram (5, 6) occurs at 0 and at 4: the latest one's followers (9, 9, 5)
    assert proposer.propose("r", [5, 6, 7, 8, 5, 6, 9, 9, 5, 6], 10) == [9, 9, 5]
    assert proposer.propose("r", [5, 6, 7, 8, 5, 6, 9, 9, 5, 6], 2) == [9, 9]  # the caller's limit
    assert proposer.propose("r", [1, 2, 3, 4], 4) == []                        # nothing repeats
    assert proposer.propose("r", [1, 2, 3, 1], 4) == [2, 3, 1]                 # the 1-gram when no 2-gram
    assert NgramProposer(SpeculativeConfig(prompt_lookup_min=2)).propose("r", [1, 2, 3, 1], 4) == []


@pytest.mark.parametrize("fields", [dict(method="eagle"), dict(num_speculative_tokens=0),
                                    dict(prompt_lookup_min=3, prompt_lookup_max=2)])
def test_speculative_config_is_checked(fields):
    with pytest.raises(ValueError):
        SpeculativeConfig(**fields)


# ------------------------------------------------------------------------------------------ greedy

@KV
def test_greedy_equals_the_step_by_step_loop_with_proposals_kept_and_rejected(reference_session, kv):
    batch = repetitive(10) + prompts(8, seed=11)
    want = [reference_greedy(reference_session, p, GREEDY.max_tokens) for p in batch]
    engine = spec_engine(kv)
    assert run(engine, batch, [GREEDY] * len(batch)) == [tuple(w) for w in want]
    stats = engine.stats()
    assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens  # some kept, some rejected
    assert_no_leaks(engine)


class Sometimes:
    """Another proposer's proposals, only when the sequence's length is a multiple of `every`."""

    def __init__(self, proposer: Proposer, every: int) -> None:
        self.proposer, self.every = proposer, every

    def release(self, request_id: str) -> None:
        self.proposer.release(request_id)

    def propose(self, request_id: str, token_ids: Sequence[int], limit: int) -> list[int]:
        if len(token_ids) % self.every:
            return []
        return self.proposer.propose(request_id, token_ids, limit)


@KV
@pytest.mark.parametrize("every", [1, 2])
def test_one_stream_continues_its_last_chunks_keys_and_values(reference_session, kv, every):
    """One request at a time, its proposals every third one wrong, at every step or every other one (a
    plain decode step between: the token it computes sits where a rejected proposal's slot was): in the
    dense layout a step's chunk takes the last one's `present` as its past when it continues it, the
    rejected proposals' slots masked out (counted as padding: a gathered single row has none), and the
    tokens are the oracle's."""
    batch = repetitive(3, seed=35) + prompts(2, seed=36)
    want = {tuple(p): reference_greedy(reference_session, p, GREEDY.max_tokens) for p in batch}
    engine = spec_engine(kv, Sometimes(OracleProposer(want, wrong_every=3), every))
    for prompt in batch:
        assert run(engine, [prompt], [GREEDY]) == [tuple(want[tuple(prompt)])]
    stats = engine.stats()
    assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens
    # one verification per step with proposals, of up to 4 (OracleProposer's k; fewer near max_tokens)
    assert stats.spec_drafts < stats.spec_draft_tokens <= 4 * stats.spec_drafts
    assert (engine.runner.stats.padded_slots > 0) is (kv == "dense")
    assert_no_leaks(engine)


def test_a_long_streams_kept_mask_outgrows_its_headroom(reference_session):
    """One stream, 120 tokens, its proposals seldom wrong: in the dense layout every step's chunk
    continues the last one's present, so the kept attention-mask row grows past the slots it was made
    with (dense_layout.py's headroom) while a few rejected slots stay masked in it; the tokens are the
    oracle's."""
    prompt = repetitive(1, seed=41)[0]
    params = SamplingParams(max_tokens=120, ignore_eos=True)
    want = {tuple(prompt): reference_greedy(reference_session, prompt, 120)}
    engine = spec_engine("dense", OracleProposer(want, wrong_every=23))
    assert run(engine, [prompt], [params]) == [tuple(want[tuple(prompt)])]
    stats = engine.stats()
    assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens
    assert engine.runner.stats.padded_slots > 0  # the rejected slots, masked in the kept past
    assert_no_leaks(engine)


@KV
def test_multi_step_decodes_and_proposals_take_turns(reference_session, kv):
    """num_scheduler_steps 4 with proposals on some steps only: a plan without any runs several decode runs
    (fewer schedules than at 1), one with proposals one step; the oracle's tokens either way."""
    batch = repetitive(3, seed=17)
    want = [reference_greedy(reference_session, p, 40) for p in batch]
    oracle = OracleProposer({tuple(p): w for p, w in zip(batch, want, strict=True)}, wrong_every=3)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    schedules = {}
    for steps in (1, 4):
        engine = spec_engine(kv, Sometimes(oracle, 7), steps=steps)
        for i, prompt in enumerate(batch):
            engine.add_request(f"r{i}", prompt, params)
        done, schedules[steps] = {}, 0
        while engine.has_unfinished():
            done.update({o.request_id: o.output_token_ids for o in engine.step() if o.finished})
            schedules[steps] += 1
        assert [done[f"r{i}"] for i in range(len(batch))] == [tuple(w) for w in want]
        assert engine.stats().spec_accepted_tokens > 0
        assert_no_leaks(engine)
    assert schedules[4] < schedules[1]  # some plans without proposals ran several decode runs


def test_an_abort_between_steps_frees_a_request_with_proposals(reference_session):
    prompt = repetitive(10)[4]
    want = reference_greedy(reference_session, prompt, 30)
    engine = spec_engine(spec=OracleProposer({tuple(prompt): want}))
    engine.add_request("gone", prompt, SamplingParams(max_tokens=30, ignore_eos=True))
    engine.add_request("kept", prompt, SamplingParams(max_tokens=30, ignore_eos=True))
    engine.step()
    engine.step()  # both have proposals now
    engine.abort_request("gone")
    done = engine.run_to_completion()
    assert list(done["kept"].output_token_ids) == want and "gone" not in done
    assert_no_leaks(engine)


@KV
def test_requests_without_proposals_share_the_steps_and_keep_their_tokens(reference_session, kv):
    """logprobs make a request stepwise: it never gets proposals, and decodes beside the ones that do."""
    batch = repetitive(6, seed=3) + repetitive(6, seed=4)
    params = [GREEDY] * 6 + [SamplingParams(max_tokens=24, ignore_eos=True, logprobs=0)] * 6
    want = [reference_greedy(reference_session, p, 24) for p in batch]
    engine = spec_engine(kv, seqs=12, budget=128)
    mixed = 0
    for i, (prompt, p) in enumerate(zip(batch, params, strict=True)):
        engine.add_request(f"r{i}", prompt, p)
    done = {}
    while engine.has_unfinished():
        plan_drafts = engine.stats().spec_draft_tokens
        outputs = engine.step()
        sizes = {len(o.new_token_ids) for o in outputs if o.new_token_ids}
        if engine.stats().spec_draft_tokens > plan_drafts and 1 in sizes:
            mixed += 1
        done.update({o.request_id: o for o in outputs if o.finished})
    assert [done[f"r{i}"].output_token_ids for i in range(12)] == [tuple(w) for w in want]
    assert mixed > 0  # steps in which proposals were verified while others decoded one token
    assert_no_leaks(engine)


@pytest.mark.parametrize("budget", [2, 5])
def test_proposals_fit_the_token_budget(reference_session, budget):
    """A budget of 2 leaves room for one proposal beside the last token; the oracle's tokens either way."""
    batch = repetitive(4, seed=9)
    want = [reference_greedy(reference_session, p, 24) for p in batch]
    engine = spec_engine(spec=OracleProposer({tuple(p): w for p, w in zip(batch, want, strict=True)}),
                         budget=budget)
    assert run(engine, batch, [GREEDY] * 4) == [tuple(w) for w in want]
    assert engine.stats().spec_accepted_tokens > 0
    assert_no_leaks(engine)


def test_proposals_never_take_a_running_requests_decode(reference_session):
    """A budget of 12 for 4 decoding requests with proposals always at hand (k = 4): every step each of
    them gets a token; proposals take only what the ones after it leave."""
    batch = [[256, 65 + i, 70 + i] for i in range(4)]  # 12 prompt tokens: all four admitted at once
    want = [reference_greedy(reference_session, p, 60) for p in batch]
    engine = spec_engine(spec=OracleProposer({tuple(p): w for p, w in zip(batch, want, strict=True)}),
                         budget=12)
    for i, prompt in enumerate(batch):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=60, ignore_eos=True))
    done = {}
    while engine.has_unfinished():
        outputs = engine.step()
        assert len(outputs) == len(batch) - len(done) and all(o.new_token_ids for o in outputs)
        done.update({o.request_id: o.output_token_ids for o in outputs if o.finished})
    assert [done[f"r{i}"] for i in range(len(batch))] == [tuple(w) for w in want]
    assert engine.stats().spec_accepted_tokens > 0
    assert_no_leaks(engine)


def test_structured_output_beside_proposals_matches_its_grammar(reference_session):
    """A grammar's mask depends on each token before the next: such requests get no proposals, and match
    their regex while greedy requests with proposals decode beside them."""
    batch = repetitive(4, seed=41)
    want = [tuple(reference_greedy(reference_session, p, 24)) for p in batch]
    regex = GrammarSpec(GrammarKind.REGEX, r"[a-z]{2,6}-\d{3}")
    engine = spec_engine(spec=OracleProposer({tuple(p): list(w) for p, w in zip(batch, want, strict=True)}))
    for i, prompt in enumerate(batch):
        engine.add_request(f"r{i}", prompt, GREEDY)
        engine.add_request(f"re{i}", prompt, SamplingParams(max_tokens=24, temperature=1.0, seed=i,
                                                            structured=regex))
    done = engine.run_to_completion()
    assert [done[f"r{i}"].output_token_ids for i in range(len(batch))] == want
    for i in range(len(batch)):
        assert re.fullmatch(r"[a-z]{2,6}-\d{3}", done[f"re{i}"].output_text), done[f"re{i}"].output_text
    assert engine.stats().spec_accepted_tokens > 0
    assert_no_leaks(engine)


def test_without_a_proposer_nothing_is_proposed(reference_session):
    batch = repetitive(4, seed=9)
    want = [tuple(reference_greedy(reference_session, p, 24)) for p in batch]
    plain = spec_engine(spec=None)
    assert run(plain, batch, [GREEDY] * 4) == want and plain.stats().spec_draft_tokens == 0


# ------------------------------------------------------------------------------------------ a draft model

OTHER_DRAFT = examples.model_bytes(tiny_decoder_model(seed=5))  # the same shape, other random weights


@KV
@pytest.mark.parametrize("draft", ["itself", "other"])
def test_a_draft_models_proposals_give_the_oracles_tokens(reference_session, kv, draft):
    """The target as its own draft: every proposal kept. Another model: most rejected, its state rolled
    back each step. The oracle's tokens either way; the draft's state freed with its requests."""
    batch = repetitive(4, seed=31) + prompts(4, seed=32)
    want = [tuple(reference_greedy(reference_session, p, GREEDY.max_tokens)) for p in batch]
    proposer = DraftModelProposer(MODEL if draft == "itself" else OTHER_DRAFT, options(), 3,
                                  TOKENIZER.vocab_size)
    engine = spec_engine(kv, proposer)
    assert run(engine, batch, [GREEDY] * len(batch)) == want
    stats = engine.stats()
    assert stats.spec_draft_tokens > 0
    if draft == "itself":
        assert stats.spec_accepted_tokens == stats.spec_draft_tokens
    else:
        assert stats.spec_accepted_tokens < stats.spec_draft_tokens
    assert proposer.requests_held == 0
    assert_no_leaks(engine)


def test_a_rolled_back_draft_proposes_what_a_fresh_one_does():
    """Each step the target keeps part of the proposals (all, some, none) and adds a token of its own; the
    request's kept draft state, cut back and fed only what it has not seen, proposes what a request fed
    every token at once does: its past is exactly the kept tokens' (verification would hide a wrong one,
    only at a cost)."""
    proposer = DraftModelProposer(OTHER_DRAFT, options(), 4, TOKENIZER.vocab_size)
    tokens = repetitive(1, seed=35)[0]
    proposals = proposer.propose("kept", tokens, 4)
    for step, kept in enumerate((4, 2, 0, 3, 1, 4)):
        tokens = tokens + proposals[:kept] + [(proposals[kept] + 1) % 256 if kept < 4 else 65]
        proposals = proposer.propose("kept", tokens, 4)
        assert proposals == proposer.propose(f"fresh {step}", tokens, 4), f"step {step}, {kept} kept"
        proposer.release(f"fresh {step}")
    proposer.release("kept")
    assert proposer.requests_held == 0


@KV
@pytest.mark.parametrize("source", ["ngram", "other draft"])
def test_backed_off_proposals_give_the_oracles_tokens(reference_session, kv, source):
    """Behind the back-off (backoff.py) requests stop and resume proposing at steps the measured costs
    choose: the draft catches up over the tokens it skipped in one run, and the tokens stay the oracle's;
    a draft that keeps next to nothing proposes far less than at every step."""
    batch = repetitive(4, seed=33) + prompts(4, seed=34)
    want = [tuple(reference_greedy(reference_session, p, GREEDY.max_tokens)) for p in batch]
    vocab = TOKENIZER.vocab_size
    inner = NGRAM if source == "ngram" else DraftModelProposer(OTHER_DRAFT, options(), 3, vocab)
    engine = spec_engine(kv, BackoffProposer(inner, min_backoff=2))
    assert run(engine, batch, [GREEDY] * len(batch)) == want
    if isinstance(inner, DraftModelProposer):
        stats = engine.stats()
        assert 0 < stats.spec_draft_tokens < GREEDY.max_tokens * len(batch)  # bare: about 3 per token
        assert inner.requests_held == 0
    assert_no_leaks(engine)


def test_a_draft_model_must_share_the_vocabulary():
    other = examples.model_bytes(tiny_decoder_model(TinyDecoderShape(vocab_size=300)))
    with pytest.raises(EngineError, match="vocabulary has 300 tokens, the model's 258"):
        DraftModelProposer(other, options(), 3, TOKENIZER.vocab_size)


# ------------------------------------------------------------------------------------------ stopping

@KV
@pytest.mark.parametrize("wrong_every", [0, 3])
def test_stops_inside_a_kept_run_end_the_request_where_one_token_at_a_time_would(reference_session, kv,
                                                                                  wrong_every):
    """Proposals from the oracle (all kept, or every third wrong), one request per stop token of the
    output, per stop character and per max_tokens, beside one that runs free: each ends exactly where the
    oracle's tokens say, some inside a run of several tokens the free one got in one step (so tokens
    verified past the stop were dropped). n-gram lookup alone rarely puts a first occurrence inside a run:
    what it proposes has been seen before."""
    prompt = repetitive(10)[4]
    want = reference_greedy(reference_session, prompt, 30)
    text = TOKENIZER.decode(want)
    proposer = OracleProposer({tuple(prompt): want}, wrong_every=wrong_every)
    engine = spec_engine(kv, proposer, seqs=128, budget=8192, num_blocks=1024)
    engine.add_request("free", prompt, SamplingParams(max_tokens=30, ignore_eos=True))
    tokens = sorted(set(want))
    chars = sorted({c for c in text if c.isascii() and c.isprintable()})
    for t in tokens:
        engine.add_request(f"tok{t}", prompt, SamplingParams(max_tokens=30, stop_token_ids=(t,),
                                                             ignore_eos=True))
    for c in chars:
        engine.add_request(f"str{ord(c)}", prompt, SamplingParams(max_tokens=30, stop=(c,), ignore_eos=True))
    for m in range(1, 31):
        engine.add_request(f"len{m}", prompt, SamplingParams(max_tokens=m, ignore_eos=True))
    ends, count, done = set(), 0, {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.request_id == "free":
                count += len(output.new_token_ids)
                ends.add(count)
            if output.finished:
                done[output.request_id] = output
    stats = engine.stats()
    assert stats.spec_accepted_tokens > 0
    assert (stats.spec_accepted_tokens < stats.spec_draft_tokens) == bool(wrong_every)
    assert list(done["free"].output_token_ids) == want
    for m in range(1, 31):
        assert done[f"len{m}"].finish_reason is FinishReason.LENGTH
        assert list(done[f"len{m}"].output_token_ids) == want[:m]
    inside = 0
    for t in tokens:
        first = want.index(t)
        assert done[f"tok{t}"].finish_reason is FinishReason.STOP
        assert list(done[f"tok{t}"].output_token_ids) == want[:first + 1]
        inside += first + 1 not in ends
    assert inside > 0
    for c in chars:
        assert done[f"str{ord(c)}"].finish_reason is FinishReason.STOP
        assert done[f"str{ord(c)}"].output_text == text[:text.index(c)]
    assert_no_leaks(engine)


def test_preemption_and_prefix_sharing_lose_nothing(reference_session):
    batch = repetitive(12, seed=21)
    want = [tuple(reference_greedy(reference_session, p, 24)) for p in batch]
    engine = spec_engine(num_blocks=24, block_size=4)
    assert run(engine, batch, [GREEDY] * len(batch)) == want
    assert engine.stats().preemptions > 0 and engine.stats().spec_accepted_tokens > 0
    assert_no_leaks(engine)


# ------------------------------------------------------------------------------------------ sampling

def chi_square_critical(df: int, z: float = 3.29) -> float:
    """The chi-square distribution's upper quantile at standard normal z (3.29: p = 0.0005), by
    Wilson–Hilferty."""
    c = 2 / (9 * df)
    return df * (1 - c + z * math.sqrt(c)) ** 3


def chi_square(counts: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token the target gives no probability was drawn"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()), int(keep.sum()) - 1


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("proposal", [0, 3, 5])  # the most likely token, a likely one, one top_k cuts
def test_rejection_sampling_keeps_the_targets_distribution(proposal):
    """Two proposals over fixed logits: the first output token is distributed as p0 (temperature and
    top_k applied) and, given it, the second as p1; what a verifier that kept every proposal, or drew the
    replacement from p without removing the proposal, would fail."""
    logits = np.array([[3.0, 2.5, 2.0, 1.5, 1.0, -1.0, -2.0, -3.0],
                       [0.0, 1.0, 2.0, 0.5, 0.1, 1.5, -1.0, 0.3],
                       [1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
    params = SamplingParams(max_tokens=8, temperature=0.8, top_k=5)
    request = Request("r", [1], params, np.random.default_rng(1234))
    draws = 20000
    first = np.zeros(8)
    second = np.zeros(8)
    for _ in range(draws):
        out = verify(logits, [proposal, 2], request)
        first[out[0]] += 1
        if len(out) > 1:  # the first proposal was kept
            second[out[1]] += 1

    def target(row: np.ndarray) -> np.ndarray:
        scaled = row.astype(np.float64) / 0.8
        top = np.argsort(-scaled, kind="stable")[:5]
        p = np.zeros(8)
        p[top] = softmax(scaled[top])
        return p

    stat, df = chi_square(first, draws * target(logits[0]))
    assert stat < chi_square_critical(df)
    if second.sum() > 500:  # the second token is judged only after the first proposal was kept
        stat, df = chi_square(second, second.sum() * target(logits[1]))
        assert stat < chi_square_critical(df)


@pytest.mark.parametrize("proposing", ["oracle", "draft"])
def test_sampled_requests_draw_what_plain_sampling_draws(reference_session, proposing):
    """End to end: the second and third tokens of many seeded sampled requests, each proposed the greedy
    continuation of its prompt (the oracle) or of its tokens so far (the model as its own draft): likely
    tokens, many kept, some rejected; against the same requests without speculation, two-sample
    chi-square."""
    prompt = repetitive(10)[4]
    want = reference_greedy(reference_session, prompt, 4)
    count = 800

    def params(base: int) -> list[SamplingParams]:
        return [SamplingParams(max_tokens=3, temperature=0.8, top_k=6, seed=base + s, ignore_eos=True)
                for s in range(count)]

    proposer: Proposer = OracleProposer({tuple(prompt): want}) if proposing == "oracle" else \
        DraftModelProposer(MODEL, options(), 4, TOKENIZER.vocab_size)
    spec = spec_engine(spec=proposer, seqs=64, budget=1024)
    got = run(spec, [prompt] * count, params(0))
    base = run(spec_engine(spec=None, seqs=64, budget=1024), [prompt] * count, params(10_000))
    stats = spec.stats()
    assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens
    for position in (1, 2):
        a = np.bincount([t[position] for t in got], minlength=TOKENIZER.vocab_size).astype(np.float64)
        b = np.bincount([t[position] for t in base], minlength=TOKENIZER.vocab_size).astype(np.float64)
        seen = (a + b) > 0
        a, b = a[seen], b[seen]
        stat = float((((a - b) ** 2) / (a + b)).sum())  # two samples of equal size
        assert stat < chi_square_critical(max(int(seen.sum()) - 1, 1))




# ------------------------------------------------------------------------------------------ the model folder

def speculative_folder(tmp_path: Path, params: dict[str, str]) -> Path:
    folder = tmp_path / "tiny_decoder"
    folder.mkdir()
    config = (EXAMPLES / "tiny_decoder" / "config.pbtxt").read_text()
    config += "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'
                      for k, v in params.items())
    (folder / "config.pbtxt").write_text(config)
    examples.build_repository(tmp_path, ["tiny_decoder"])
    return folder


def test_a_folder_asks_for_ngram_speculation_and_gets_the_same_tokens(tmp_path: Path, reference_session):
    folder = speculative_folder(tmp_path, {"speculative_method": "ngram", "num_speculative_tokens": "3",
                                           "prompt_lookup_max": "2"})
    engine = load_engine(folder)
    batch = repetitive(6, seed=13)
    want = [tuple(reference_greedy(reference_session, p, 24)) for p in batch]
    assert run(engine, batch, [GREEDY] * len(batch)) == want
    assert engine.stats().spec_draft_tokens > 0


def test_a_folder_asks_for_a_draft_model(tmp_path: Path, reference_session):
    folder = speculative_folder(tmp_path, {"speculative_method": "draft_model",
                                           "speculative_model": "draft/model.onnx",
                                           "num_speculative_tokens": "3"})
    (folder / "draft").mkdir()
    (folder / "draft" / "model.onnx").write_bytes(OTHER_DRAFT)
    engine = load_engine(folder)
    batch = repetitive(3, seed=13)
    want = [tuple(reference_greedy(reference_session, p, 24)) for p in batch]
    assert run(engine, batch, [GREEDY] * len(batch)) == want
    assert engine.stats().spec_draft_tokens > 0


@pytest.mark.parametrize(("params", "message"), [
    ({"speculative_method": "eagle"}, "speculative_method must be one of ngram, draft_model"),
    ({"speculative_method": "draft_model"}, "needs parameter speculative_model"),
    ({"speculative_method": "draft_model", "speculative_model": "../outside.onnx"},
     "is not a file in the model's folder"),
    ({"speculative_method": "ngram", "num_speculative_tokens": "0"},
     "num_speculative_tokens must be a positive"),
    ({"speculative_method": "ngram", "prompt_lookup_min": "4", "prompt_lookup_max": "2"},
     r"prompt_lookup_min \(4\) must not exceed prompt_lookup_max \(2\)"),
])
def test_a_folders_speculative_parameters_are_checked(tmp_path: Path, params, message):
    (tmp_path / "outside.onnx").write_bytes(MODEL)  # a file, but not the folder's
    with pytest.raises(EngineError, match=message):
        load_engine(speculative_folder(tmp_path, params))
