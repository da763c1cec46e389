"""The generation engine end to end over the tiny decoder (engine/generate/core/engine.py), in process: no
sockets, no event loop. The oracle is a plain step-by-step loop over the same ONNX model, one sequence at a
time with dense past tensors, written here without any engine code. The tests marked with `kv` run for both
KV layouts the runner takes: `dense` (Optimum's form, `present` = past + new) and `shared` (the same weights
as GroupQueryAttention over a buffer written in place: shared_group.py); the oracle is the dense model for
both, so the shared form must give the same tokens as another graph of the same weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from conftest import EXAMPLES
from engine.errors import EngineError
from engine.generate.core.engine import CacheConfig, GenerationEngine
from engine.generate.core.request import FinishReason, SamplingParams
from engine.generate.core.runner import DecoderRunner
from engine.generate.core.scheduler import SchedulerConfig
from engine.generate.core.tokenizer import ByteTokenizer
from engine.generate.serving.model_folder import load_engine
from engine.generate.triton.request_options import sampling_params
from hubserve_models import examples
from hubserve_models.tiny_decoder import TinyDecoderShape, tiny_decoder_model

MODEL = examples.model_bytes(tiny_decoder_model())
SHARED_MODEL = examples.model_bytes(tiny_decoder_model(TinyDecoderShape(shared_kv=True)))
KV = pytest.mark.parametrize("kv", ["dense", "shared"])
TOKENIZER = ByteTokenizer()
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


def options() -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return opts


def make_engine(num_blocks: int = 256, block_size: int = 8, seqs: int = 16, budget: int = 64,
                chunked: bool = True, prefix: bool = True, max_model_len: int = 512,
                kv: str = "dense", steps: int = 1) -> GenerationEngine:
    shared = kv == "shared"
    runner = DecoderRunner(SHARED_MODEL if shared else MODEL, num_blocks, block_size, options(),
                           shared_kv=shared, max_len=max_model_len, max_rows=seqs)
    return GenerationEngine(runner, TOKENIZER, CacheConfig(block_size, num_blocks, max_model_len, prefix),
                            SchedulerConfig(seqs, budget, chunked, steps))


def reference_loop(sess: ort.InferenceSession, prompt: list[int], max_tokens: int,
                   pick: Callable[[np.ndarray, list[int]], int]) -> list[int]:
    """Prefill the whole prompt, then feed each picked token back with `present` as the next `past`;
    `pick` gets each step's logits row and the tokens so far."""
    names = [o.name for o in sess.get_outputs()]
    past = {f"past_key_values.{i}.{p}": np.zeros((1, 4, 0, 16), np.float32)
            for i in range(2) for p in ("key", "value")}
    out: list[int] = []
    feed_ids, position = prompt, 0
    while len(out) < max_tokens:
        n = len(feed_ids)
        result = dict(zip(names, sess.run(None, {
            "input_ids": np.array([feed_ids], np.int64),
            "attention_mask": np.ones((1, position + n), np.int64),
            "position_ids": np.arange(position, position + n, dtype=np.int64)[None], **past}), strict=True))
        out.append(pick(result["logits"][0, -1], out))
        past = {name: result[name.replace("past_key_values", "present")] for name in past}
        position, feed_ids = position + n, [out[-1]]
    return out


def reference_greedy(sess: ort.InferenceSession, prompt: list[int], max_tokens: int) -> list[int]:
    return reference_loop(sess, prompt, max_tokens, lambda row, _: int(row.argmax()))


def reference_penalized(sess: ort.InferenceSession, prompt: list[int], max_tokens: int, presence: float,
                        frequency: float, repetition: float) -> list[int]:
    """Greedy with the penalties applied to each step's logits: the repetition penalty over the prompt and
    the output (a positive logit divided, a negative one multiplied), then OpenAI's
    logit[j] -= count[j] × frequency + (count[j] > 0) × presence over the output."""
    def pick(row: np.ndarray, out: list[int]) -> int:
        logits = [float(x) for x in row]
        for token in set(prompt) | set(out):
            logits[token] = logits[token] / repetition if logits[token] > 0 else logits[token] * repetition
        for token in set(out):
            logits[token] -= out.count(token) * frequency + presence
        return max(range(len(logits)), key=lambda j: (logits[j], -j))

    return reference_loop(sess, prompt, max_tokens, pick)


def prompts(count: int, seed: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[256, *rng.integers(32, 127, size=int(rng.integers(1, 60))).tolist()] for _ in range(count)]


def generate(engine: GenerationEngine, batch: list[list[int]], params: SamplingParams = GREEDY,
             ) -> list[tuple[int, ...]]:
    for i, prompt in enumerate(batch):
        engine.add_request(f"r{i}", prompt, params)
    done = engine.run_to_completion()
    return [done[f"r{i}"].output_token_ids for i in range(len(batch))]


def assert_no_leaks(engine: GenerationEngine) -> None:
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)
    assert stats.kv_blocks_free == engine.cache_config.num_blocks


# ------------------------------------------------------------------------------------------ correctness

@KV
def test_greedy_equals_a_step_by_step_loop_for_many_concurrent_sequences(reference_session, kv):
    batch = prompts(20)
    engine = make_engine(kv=kv)
    got = generate(engine, batch)
    for prompt, tokens in zip(batch, got, strict=True):
        assert list(tokens) == reference_greedy(reference_session, prompt, GREEDY.max_tokens)
    assert engine.runner.stats.runs > engine.runner.stats.steps  # prefills ran beside decodes
    assert_no_leaks(engine)


@KV
@pytest.mark.parametrize("steps", [1, 4])
def test_penalties_equal_a_step_by_step_loop_that_applies_them(reference_session, kv, steps):
    """Penalized and plain requests in one batch, with multi-step decode on or off: a penalized request's
    logits depend on its tokens so far, so a plan holding one runs one step (engine.py `_steps`)."""
    batch = prompts(12, seed=8)
    engine = make_engine(kv=kv, steps=steps)
    penalties = [(0.0, 1.5, 1.0), (0.8, 0.0, 1.0), (0.0, 0.0, 1.6), (0.3, 0.4, 1.2)]
    for i, prompt in enumerate(batch):
        presence, frequency, repetition = penalties[i % 4] if i % 3 else (0.0, 0.0, 1.0)
        engine.add_request(f"r{i}", prompt, SamplingParams(
            max_tokens=24, ignore_eos=True, presence_penalty=presence, frequency_penalty=frequency,
            repetition_penalty=repetition))
    done = engine.run_to_completion()
    changed = 0
    for i, prompt in enumerate(batch):
        presence, frequency, repetition = penalties[i % 4] if i % 3 else (0.0, 0.0, 1.0)
        want = reference_penalized(reference_session, prompt, 24, presence, frequency, repetition)
        assert list(done[f"r{i}"].output_token_ids) == want, f"r{i}"
        changed += want != reference_greedy(reference_session, prompt, 24)
    assert changed >= 6  # the penalties changed most of the penalized answers: the test can tell
    assert_no_leaks(engine)


def reference_logprobs(sess: ort.InferenceSession, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """The log-softmax of the dense model's logits before each of `tokens`, fed one by one after the
    prompt (each row: the distribution the token was picked from)."""
    rows: list[np.ndarray] = []

    def pick(row: np.ndarray, out: list[int]) -> int:
        x = row.astype(np.float64)
        rows.append(x - np.log(np.exp(x - x.max()).sum()) - x.max())
        return tokens[len(out)]

    reference_loop(sess, prompt, len(tokens), pick)
    return rows


@KV
@pytest.mark.parametrize("steps", [1, 4])
def test_logprobs_are_the_models_for_every_token_sampled_or_greedy(reference_session, kv, steps):
    batch = prompts(6, seed=9)
    engine = make_engine(kv=kv, steps=steps)
    for i, prompt in enumerate(batch):  # greedy and sampled, asking for 0 or 3 most likely, beside plain
        params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.0 if i % 2 else 1.0, seed=i,
                                logprobs=None if i == 5 else 3 * (i % 2))
        engine.add_request(f"r{i}", prompt, params)
    seen: dict[str, list] = {f"r{i}": [] for i in range(6)}
    while engine.has_unfinished():
        for out in engine.step():
            assert len(out.logprobs) == (len(out.new_token_ids) if out.request_id != "r5" else 0)
            seen[out.request_id].extend(out.logprobs)
    for i, prompt in enumerate(batch[:5]):
        got = seen[f"r{i}"]
        rows = reference_logprobs(reference_session, prompt, [lp.token_id for lp in got])
        assert len(got) == 12
        for lp, row in zip(got, rows, strict=True):
            assert abs(lp.logprob - row[lp.token_id]) < 1e-4
            assert len(lp.top) == 3 * (i % 2)
            for token, logprob in lp.top:
                assert abs(logprob - row[token]) < 1e-4
            if lp.top:  # greedy: the token is the most likely, and the top are the three largest
                assert lp.top[0][0] == lp.token_id == int(row.argmax())
                assert sorted(row, reverse=True)[2] == pytest.approx(lp.top[2][1], abs=1e-4)


@KV
def test_sequences_arriving_while_others_run_get_the_same_tokens(reference_session, kv):
    batch = prompts(12, seed=5)
    engine = make_engine(seqs=4, kv=kv)
    done = {}
    for i, prompt in enumerate(batch):  # one new request every step: joins mid-flight
        engine.add_request(f"r{i}", prompt, GREEDY)
        done.update({o.request_id: o for o in engine.step() if o.finished})
    done.update(engine.run_to_completion())
    for i, prompt in enumerate(batch):
        assert list(done[f"r{i}"].output_token_ids) == reference_greedy(reference_session, prompt, 24)


@KV
def test_preemption_under_kv_exhaustion_loses_nothing(kv):
    batch = prompts(10, seed=7)
    roomy = generate(make_engine(num_blocks=256), batch)
    tight = make_engine(num_blocks=24, block_size=4, kv=kv)  # 96 slots for 10 sequences of up to ~85 tokens
    assert generate(tight, batch) == roomy
    assert tight.stats().preemptions > 0
    assert_no_leaks(tight)


@KV
def test_prefix_sharing_gives_identical_outputs_with_fewer_blocks(kv):
    system = [256, *b"You are a helpful assistant. Answer briefly and politely."]  # 58 tokens
    batch = [system + list(q) for q in (b"Hi", b"What is 2+2?", b"Name a color.", b"Bye")]
    peaks = {}
    outputs = {}
    for prefix in (False, True):
        engine = make_engine(block_size=8, prefix=prefix, kv=kv)
        engine.add_request("first", batch[0], GREEDY)
        engine.step()  # the shared prefix is computed and cached
        for i, prompt in enumerate(batch[1:], 1):
            engine.add_request(f"r{i}", prompt, GREEDY)
        peak, done = 0, {}
        while engine.has_unfinished():
            done.update({o.request_id: o.output_token_ids for o in engine.step() if o.finished})
            peak = max(peak, engine.stats().kv_blocks_used)
        outputs[prefix] = done
        peaks[prefix] = peak
        if prefix:
            assert engine.stats().prefix_cache_hit_rate > 0.5
        assert_no_leaks(engine)
    assert outputs[True] == outputs[False]
    assert peaks[True] <= peaks[False] - 2 * (len(system) // 8)  # sharers skip 7 full blocks each


@KV
def test_chunked_prefill_equals_unchunked(kv):
    batch = prompts(8, seed=11) + [[256, *range(40, 240)]]  # one 201-token prompt
    unchunked = generate(make_engine(budget=512, chunked=False), batch)
    engine = make_engine(budget=16, kv=kv)
    assert generate(engine, batch) == unchunked
    assert_no_leaks(engine)


@KV
@pytest.mark.parametrize("params", [GREEDY, SamplingParams(max_tokens=24, logprobs=2, ignore_eos=True),
                                    SamplingParams(max_tokens=24, temperature=0.8, seed=5, ignore_eos=True)],
                         ids=["greedy", "logprobs", "sampled"])
def test_a_prompt_longer_than_the_budget_alone_runs_steps_in_which_nobody_samples(reference_session, kv,
                                                                                  params):
    """Its first chunks sample nothing, and nothing else runs beside them (issue 27, hole 10: such a step
    raised 'attempt to get argmax of an empty sequence')."""
    prompt = [256, *range(40, 240)]  # 201 tokens: 4 chunks of the budget of 64
    engine = make_engine(budget=64, kv=kv)
    engine.add_request("long", prompt, params)
    silent = [engine.step() for _ in range(3)]
    assert all(not out.new_token_ids and not out.finished for step in silent for out in step)
    done = engine.run_to_completion()["long"]
    assert len(done.output_token_ids) == 24
    if params.greedy:
        assert list(done.output_token_ids) == reference_greedy(reference_session, prompt, 24)
    assert_no_leaks(engine)


# ------------------------------------------------------------------------------------------ sampling

def test_seeds_reproduce_whatever_runs_beside():
    params = SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    alone = generate(make_engine(), [[256, *b"Once upon a time"]], params)[0]
    engine = make_engine()
    crowd = [[256, *b"Once upon a time"], *prompts(6, seed=13)]
    for i, prompt in enumerate(crowd):
        engine.add_request(f"r{i}", prompt, params if i == 0 else SamplingParams(
            max_tokens=30, temperature=1.2, ignore_eos=True))  # no seed: the engine's own generator
    assert engine.run_to_completion()["r0"].output_token_ids == alone
    reseeded = SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, top_k=50, seed=99, ignore_eos=True)
    assert generate(make_engine(), [[256, *b"Once upon a time"]], reseeded) != [alone]


def test_top_k_one_is_greedy():
    batch = prompts(3, seed=17)
    sampled = generate(make_engine(), batch, SamplingParams(max_tokens=12, temperature=1.5, top_k=1,
                                                            ignore_eos=True))
    assert sampled == generate(make_engine(), batch, SamplingParams(max_tokens=12, ignore_eos=True))


# ------------------------------------------------------------------------------------------ stopping

@KV
def test_stop_tokens_stop_strings_and_max_tokens(reference_session, kv):
    prompt = [256, *b"Hello"]
    want = reference_greedy(reference_session, prompt, 30)
    engine = make_engine(kv=kv)
    engine.add_request("len", prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    stop_token = want[9]
    engine.add_request("tok", prompt, SamplingParams(max_tokens=30, stop_token_ids=(stop_token,),
                                                     ignore_eos=True))
    text = TOKENIZER.decode(want)
    stop_text = next(chr(t) for t in want[2:] if 32 <= t < 127)  # ASCII: never inside a multi-byte char
    engine.add_request("str", prompt, SamplingParams(max_tokens=30, stop=(stop_text,), ignore_eos=True))
    done = engine.run_to_completion()
    assert done["len"].finish_reason is FinishReason.LENGTH and list(done["len"].output_token_ids) == want[:5]
    first = want.index(stop_token)
    assert done["tok"].finish_reason is FinishReason.STOP
    assert list(done["tok"].output_token_ids) == want[:first + 1]
    assert done["str"].finish_reason is FinishReason.STOP
    assert done["str"].output_text == text[:text.index(stop_text)]
    assert stop_text not in done["str"].output_text
    assert_no_leaks(engine)


@KV
def test_the_context_limit_ends_a_request_with_length(kv):
    engine = make_engine(max_model_len=40, kv=kv)
    engine.add_request("r", [256] * 30, SamplingParams(max_tokens=10, ignore_eos=True))
    done = engine.run_to_completion()["r"]
    assert done.finish_reason is FinishReason.LENGTH and len(done.output_token_ids) == 10


def test_abort_frees_the_blocks_at_once():
    engine = make_engine()
    engine.add_request("a", prompts(1)[0], SamplingParams(max_tokens=100, ignore_eos=True))
    engine.step()
    assert engine.stats().kv_blocks_used > 0
    engine.abort_request("a")
    assert_no_leaks(engine)
    assert engine.step() == []


# ------------------------------------------------------------------------------------------ refusals

@pytest.mark.parametrize(("prompt", "params", "message"), [
    ([], GREEDY, "prompt is empty"),
    ([256, 999], GREEDY, "outside the vocabulary"),
    ([256] * 500, SamplingParams(max_tokens=20), "exceed the model's context of 512"),
])
def test_requests_that_could_never_run_are_refused(prompt, params, message):
    with pytest.raises(EngineError, match=message):
        make_engine().add_request("r", prompt, params)


def test_sampling_params_are_checked():
    for bad in ({"max_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_k": -1}, {"stop": ("",)}):
        with pytest.raises(EngineError):
            SamplingParams(**bad)  # type: ignore[arg-type]


def test_stop_rules_are_bounded_and_stop_tokens_are_a_set():
    """What the engine checks after every token stays small whoever made the params (issue 27, hole 4)."""
    for bad, message in (({"stop_token_ids": tuple(range(129))}, "129 stop token ids; send at most 128"),
                         ({"stop": ("x" * 257,)}, "a stop string of 257 characters; each may have at most"),
                         ({"stop": tuple("abcdefghi")}, "9 stop strings")):
        with pytest.raises(EngineError, match=message):
            SamplingParams(**bad)  # type: ignore[arg-type]
    params = SamplingParams(stop=tuple("abcdefgh"), stop_token_ids=(5, 5, 7))  # type: ignore[arg-type]
    assert params.stop_token_ids == frozenset({5, 7})
    at_bounds = SamplingParams(stop=("x" * 256,), stop_token_ids=frozenset(range(128)))
    assert at_bounds.stop == ("x" * 256,) and len(at_bounds.stop_token_ids) == 128


@pytest.mark.parametrize(("raw", "message"), [
    ({"stop": ["a", "b", "c", "d", "e"]}, "'stop' has 5 strings; send at most 4"),
    ({"stop": "q" * 300}, "'stop' has a string of 300 characters; each may have at most 256"),
    ({"stop_token_ids": list(range(1_000_000))}, "'stop_token_ids' has 1000000 token ids; send at most 128"),
])
def test_tritons_sampling_parameters_are_bounded(raw, message):
    with pytest.raises(EngineError, match=message):
        sampling_params(raw)
    assert sampling_params({"stop": ["a"] * 4, "stop_token_ids": [1] * 128}).stop_token_ids == {1}


def test_the_example_folder_loads_into_an_engine(tmp_path: Path):
    folder = tmp_path / "tiny_decoder"
    folder.mkdir()
    (folder / "config.pbtxt").write_bytes((EXAMPLES / "tiny_decoder" / "config.pbtxt").read_bytes())
    examples.build_repository(tmp_path, ["tiny_decoder"])
    engine = load_engine(folder)
    assert engine.cache_config == CacheConfig(16, 1024, 512, True)
    engine.add_request("r", "Hello", SamplingParams(max_tokens=8, ignore_eos=True))
    done = engine.run_to_completion()["r"]
    assert len(done.output_token_ids) == 8 and done.output_text == TOKENIZER.decode(done.output_token_ids)
