"""The next step's grammar masks computed on their own thread while the model runs
(engine/generate/core/mask_thread.py, handed the step's rows by the sampler), in process over the
tiny decoder (random weights, byte tokenizer): the same tokens as masks computed inline, a matcher never
used by two threads at once (llguidance's matchers raise "Already borrowed" when they are), a request
aborted while its mask is computed, a grammar that fails on the mask thread failing its request alone, and
no thread left once the engine is closed."""

from __future__ import annotations

import json
import threading

import jsonschema
import onnxruntime as ort

from engine.errors import ErrorCode
from engine.generate.core.engine import CacheConfig, GenerationEngine
from engine.generate.core.grammar import GrammarCompiler, GrammarKind, GrammarSpec, constraint_for_json_schema
from engine.generate.core.mask_thread import MASK_THREAD_NAME, start_next_masks
from engine.generate.core.request import FinishReason, SamplingParams
from engine.generate.core.runner import DecoderRunner
from engine.generate.core.scheduler import SchedulerConfig
from engine.generate.core.tokenizer import ByteTokenizer
from hubserve_models import examples
from hubserve_models.tiny_decoder import tiny_decoder_model

MODEL = examples.model_bytes(tiny_decoder_model())
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "kind": {"enum": ["cat", "dog"]}}, "required": ["name", "age", "kind"], "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False}}
# "a", then one of 2,100 alternatives: it compiles (the first row is small), and fails as it takes the "a"
# (llguidance's limit of 2,000 Earley items in a row): a grammar error found while the request runs
FAILS_AFTER_ONE = GrammarSpec(GrammarKind.GRAMMAR, 'start: "a" t\nt: ' +
                              " | ".join(f'"b{i}"' for i in range(2100)) + "\n", "structured_outputs.grammar")
# "a" first, then masks of tens of milliseconds (200 right-recursive alternatives): long enough that the
# engine's thread is sure to come while the mask thread holds the matcher
SLOW = GrammarSpec(GrammarKind.GRAMMAR, 'start: s\ns: "a" | ' +
                   " | ".join(f'"a" s "x{i}"' for i in range(200)) + "\n")


def make_engine() -> GenerationEngine:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    runner = DecoderRunner(MODEL, 256, 8, opts, max_len=512, max_rows=16)
    return GenerationEngine(runner, ByteTokenizer(), CacheConfig(8, 256, 512),
                            SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64))


def mask_threads(before: frozenset[threading.Thread] = frozenset()) -> set[threading.Thread]:
    """The mask threads alive now but not among `before` (those of engines of other tests, which end when
    their engines are collected)."""
    return {t for t in threading.enumerate() if t.name.startswith(MASK_THREAD_NAME)} - before


def threads_now() -> frozenset[threading.Thread]:
    return frozenset(mask_threads())


def test_masks_on_the_thread_give_the_tokens_of_masks_computed_inline() -> None:
    """16 seeded JSON requests in one batch, their masks on the thread, against the same with the thread
    closed beforehand (every mask computed inline when asked): the same tokens, each answer valid."""
    asks = {f"r{s}": SamplingParams(max_tokens=120, temperature=1.0, seed=s,
                                    structured=constraint_for_json_schema(SCHEMA)) for s in range(16)}
    results = []
    for threaded in (True, False):
        before = threads_now()
        engine = make_engine()
        if not threaded:
            engine.close()
        for rid, params in asks.items():
            engine.add_request(rid, "Answer: ", params)
        results.append(engine.run_to_completion())
        assert bool(mask_threads(before)) == threaded  # the thread ran the masks (or was never started)
        engine.close()
    threaded_outs, inline_outs = results
    for rid, out in threaded_outs.items():
        assert out.output_token_ids == inline_outs[rid].output_token_ids
        assert out.finish_reason is FinishReason.STOP, out.output_text
        jsonschema.validate(json.loads(out.output_text), SCHEMA)


def test_the_engine_reads_a_grammar_while_the_thread_holds_its_matcher() -> None:
    """While its next mask is computed (tens of ms), the stop check's `complete` reads what the advance
    kept and `allowed` waits for the job: neither touches the matcher, which would raise "Already
    borrowed" from llguidance. The mask is the one computed inline for the same tokens."""
    before = threads_now()
    compiler = GrammarCompiler(ByteTokenizer())
    ahead, inline = compiler.constraint(SLOW), compiler.constraint(SLOW)
    for grammar in (ahead, inline):
        assert grammar.allowed().ids(258).tolist() == [ord("a")]
        grammar.advance(ord("a"))
    start_next_masks([ahead])
    assert mask_threads(before)
    assert not ahead.complete
    assert ahead.allowed().ids(258).tolist() == inline.allowed().ids(258).tolist()
    assert ahead.error is None
    compiler.close()
    assert not mask_threads(before)


def test_a_request_aborted_while_its_mask_is_computed_leaves_the_others_as_they_were() -> None:
    before = threads_now()
    engine = make_engine()
    free = SamplingParams(max_tokens=16, temperature=1.0, seed=1)
    json_ask = SamplingParams(max_tokens=120, temperature=1.0, seed=2,
                              structured=constraint_for_json_schema(SCHEMA))
    engine.add_request("slow", "Answer: ", SamplingParams(max_tokens=40, structured=SLOW))
    engine.add_request("free", "Answer: ", free)
    engine.add_request("json", "Answer: ", json_ask)
    first = {out.request_id: out.new_token_ids for out in engine.step()}
    assert first["slow"] == (ord("a"),)  # its next mask is now being computed, for tens of milliseconds
    engine.abort_request("slow")
    outs = engine.run_to_completion()
    assert set(outs) == {"free", "json"}
    jsonschema.validate(json.loads(outs["json"].output_text), SCHEMA)
    alone = make_engine()  # the same two without the aborted one: the same tokens
    alone.add_request("free", "Answer: ", free)
    alone.add_request("json", "Answer: ", json_ask)
    for rid, out in alone.run_to_completion().items():
        assert out.output_token_ids == outs[rid].output_token_ids
    engine.close()
    alone.close()
    assert not mask_threads(before)


def test_a_grammar_that_fails_while_followed_fails_its_request_alone() -> None:
    """It fails at its first token: that request ends with an INVALID_ARG error that names llguidance's
    limit (finish reason ERROR, never "stop" with a text its grammar did not finish, nor the whole step
    failed as before); a JSON request and a free one in the same batch finish as they would have."""
    engine = make_engine()
    engine.add_request("fails", "Answer: ", SamplingParams(max_tokens=40, structured=FAILS_AFTER_ONE))
    engine.add_request("json", "Answer: ", SamplingParams(max_tokens=120, temperature=1.0, seed=3,
                                                          structured=constraint_for_json_schema(SCHEMA)))
    engine.add_request("free", "Answer: ", SamplingParams(max_tokens=12, temperature=1.0, seed=4))
    outs = engine.run_to_completion()
    failed = outs["fails"]
    assert failed.finish_reason is FinishReason.ERROR and failed.error is not None
    assert failed.error.code is ErrorCode.INVALID_ARG
    assert "the grammar failed at output token 1: " in failed.error.message
    assert "max is 2000" in failed.error.message, failed.error.message
    assert outs["json"].finish_reason is FinishReason.STOP
    jsonschema.validate(json.loads(outs["json"].output_text), SCHEMA)
    assert outs["free"].finish_reason is FinishReason.LENGTH and len(outs["free"].output_token_ids) == 12
    engine.close()


def test_closing_the_engine_ends_the_mask_thread_and_later_masks_are_computed_inline() -> None:
    before = threads_now()
    engine = make_engine()
    engine.add_request("a", "Answer: ", SamplingParams(max_tokens=30,
                                                       structured=constraint_for_json_schema(SCHEMA)))
    engine.step()
    assert mask_threads(before)
    engine.close()
    assert not mask_threads(before)
    outs = engine.run_to_completion()  # a request in flight goes on, its masks computed when asked
    assert outs["a"].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert len(outs["a"].output_token_ids) > 1
    assert not mask_threads(before)
