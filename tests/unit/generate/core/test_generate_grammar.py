"""Structured output in the engine (engine/generate/core/grammar.py, the sampler's draw among a grammar's
allowed tokens, the stop check), in process over the tiny decoder (random weights, byte tokenizer): seeded
samples at temperature 1, each parsed and checked against what it was asked to match; constrained and
unconstrained requests in one batch; max_tokens cutting a constrained answer short; specs that do not
compile; a grammar that fails while it generates failing its request alone; the sampler's constrained draw
against the row masked as it once was."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import onnxruntime as ort
import pytest

from engine.errors import EngineError, ErrorCode
from engine.generate.core.engine import CacheConfig, GenerationEngine
from engine.generate.core.grammar import (
    Constraint,
    GrammarCompiler,
    GrammarKind,
    GrammarSpec,
    constraint_for_json_schema,
)
from engine.generate.core.request import FinishReason, Request, RequestOutput, SamplingParams
from engine.generate.core.runner import DecoderRunner
from engine.generate.core.sampler import sample
from engine.generate.core.scheduler import SchedulerConfig
from engine.generate.core.tokenizer import ByteTokenizer
from hubserve_models import examples
from hubserve_models.tiny_decoder import tiny_decoder_model

MODEL = examples.model_bytes(tiny_decoder_model())
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "kind": {"enum": ["cat", "dog"]}, "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
    "required": ["name", "age", "kind", "tags"], "additionalProperties": False}
# Compact JSON (llguidance's whitespace_flexible off, through the schema's x-guidance): a random model's
# answers would otherwise wander in whitespace until max_tokens
COMPACT = {**SCHEMA, "x-guidance": {"whitespace_flexible": False}}


def make_engine(steps: int = 1) -> GenerationEngine:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    runner = DecoderRunner(MODEL, 256, 8, opts, max_len=512, max_rows=16)
    return GenerationEngine(runner, ByteTokenizer(), CacheConfig(8, 256, 512),
                            SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64,
                                            num_scheduler_steps=steps))


def run(engine: GenerationEngine, asks: dict[str, SamplingParams],
        prompt: str = "Answer: ") -> dict[str, RequestOutput]:
    for rid, params in asks.items():
        engine.add_request(rid, prompt, params)
    return engine.run_to_completion()


def sampled(spec: GrammarSpec, seed: int, max_tokens: int = 200) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, structured=spec)


def test_seeded_json_samples_are_valid_under_their_schema() -> None:
    engine = make_engine()
    outs = run(engine, {f"r{s}": sampled(constraint_for_json_schema(COMPACT), s) for s in range(24)})
    for out in outs.values():
        assert out.finish_reason is FinishReason.STOP, out.output_text
        jsonschema.validate(json.loads(out.output_text), SCHEMA)


def test_regex_choice_and_grammar_samples_match() -> None:
    engine = make_engine()
    regex = GrammarSpec(GrammarKind.REGEX, r"[a-z]{2,6}-\d{3}")
    choice = GrammarSpec(GrammarKind.CHOICE, json.dumps(["yes", "no", "maybe so"]))
    grammar = GrammarSpec(GrammarKind.GRAMMAR, 'root ::= "(" digit ("+" digit)* ")"\ndigit ::= [0-9]')
    asks = {f"{kind}{s}": sampled(spec, s) for s in range(12)
            for kind, spec in (("re", regex), ("ch", choice), ("gr", grammar))}
    outs = run(engine, asks)
    for rid, out in outs.items():
        text = out.output_text
        assert out.finish_reason is FinishReason.STOP, (rid, text)
        if rid.startswith("re"):
            assert re.fullmatch(r"[a-z]{2,6}-\d{3}", text), text
        elif rid.startswith("ch"):
            assert text in ("yes", "no", "maybe so")
        else:
            assert re.fullmatch(r"\(\d(\+\d)*\)", text), text


def test_constrained_and_unconstrained_rows_share_a_batch_and_each_gets_its_own() -> None:
    """The free rows draw exactly what they draw alone: the constrained rows beside them change nothing."""
    free = {f"free{s}": SamplingParams(max_tokens=30, temperature=1.0, seed=s, ignore_eos=True)
            for s in range(4)}
    alone = run(make_engine(), free)
    mixed = run(make_engine(), free | {f"json{s}": sampled(constraint_for_json_schema(COMPACT), s)
                                       for s in range(4)})
    for rid, out in alone.items():
        assert mixed[rid].output_token_ids == out.output_token_ids
    for s in range(4):
        jsonschema.validate(json.loads(mixed[f"json{s}"].output_text), SCHEMA)


def test_a_constrained_request_runs_one_step_per_schedule_under_multistep() -> None:
    asks = {f"r{s}": sampled(constraint_for_json_schema(COMPACT), s) for s in range(4)}
    outs = run(make_engine(steps=4), asks)
    for out in outs.values():
        jsonschema.validate(json.loads(out.output_text), SCHEMA)


def test_max_tokens_cuts_a_json_short_with_length() -> None:
    out = run(make_engine(), {"r": sampled(constraint_for_json_schema(COMPACT), 1, max_tokens=5)})["r"]
    assert out.finish_reason is FinishReason.LENGTH
    assert len(out.output_token_ids) == 5 and out.output_text.startswith("{")


def test_eos_comes_only_where_the_grammar_may_end() -> None:
    """A regex that may go on (more digits) or end: EOS is allowed only once it matched, so every answer
    is a match, ended by EOS (not in its text) or by its 30th digit."""
    spec = GrammarSpec(GrammarKind.REGEX, r"[0-9]{1,30}")
    outs = run(make_engine(), {f"r{s}": sampled(spec, s, 40) for s in range(16)})
    ends = set()
    for out in outs.values():
        assert out.finish_reason is FinishReason.STOP
        assert re.fullmatch(r"[0-9]{1,30}", out.output_text), out.output_text
        tokens = out.output_token_ids
        assert 257 not in tokens[:-1] and (tokens[-1] == 257 or len(tokens) == 30)
        ends.add(tokens[-1] == 257)
    assert ends == {True, False}  # both ways of ending were seen


@pytest.mark.parametrize(("kind", "text", "words"), [
    (GrammarKind.JSON_SCHEMA, '{"type": "objec"}', "Invalid type"),
    (GrammarKind.JSON_SCHEMA, '{"type": "string", "format": "no-such-format"}', "Unknown format"),
    (GrammarKind.JSON_SCHEMA, '{"$ref": "#/missing"}', "missing"),
    (GrammarKind.REGEX, "[a-z", "regex"),
    (GrammarKind.CHOICE, '["a", 1]', ""),
    (GrammarKind.GRAMMAR, "root ::= undefined_rule", ""),
])
def test_a_spec_that_does_not_compile_is_refused_naming_its_field(kind: GrammarKind, text: str,
                                                                 words: str) -> None:
    compiler = GrammarCompiler(ByteTokenizer())
    with pytest.raises(EngineError) as refused:
        compiler.check(GrammarSpec(kind, text, "the.field"))
    assert refused.value.message.startswith("the.field: ") and words in refused.value.message
    engine = make_engine()
    with pytest.raises(EngineError):  # nor does the engine take it unchecked
        engine.add_request("r", "x", sampled(GrammarSpec(kind, text, "the.field"), 0))
    assert not engine.has_unfinished()


def allowed(constraint: Constraint, width: int = 258) -> np.ndarray:
    """Which of `width` tokens `constraint` lets through, as a boolean row; its `allows` agrees."""
    tokens = constraint.allowed()
    row = np.zeros(width, bool)
    row[tokens.ids(width)] = True
    assert [tokens.allows(t) for t in range(width)] == row.tolist()
    return row


def test_compiled_grammars_are_cached_and_each_request_starts_afresh() -> None:
    compiler = GrammarCompiler(ByteTokenizer())
    spec = GrammarSpec(GrammarKind.CHOICE, '["ab", "ac"]')
    first, second = compiler.constraint(spec), compiler.constraint(spec)
    first.advance(ord("a"))
    assert allowed(first)[[ord("b"), ord("c")]].all() and not allowed(first)[ord("a")]
    assert allowed(second)[ord("a")] and not allowed(second)[ord("b")]
    assert np.flatnonzero(allowed(compiler.constraint(spec))).tolist() == [ord("a")]
    assert not allowed(first, 300)[258:].any()  # ids past the tokenizer's: never


def test_min_tokens_holds_eos_within_the_grammar() -> None:
    """EOS is held until min_tokens as without a grammar; the grammar's own end still ends the request."""
    spec = GrammarSpec(GrammarKind.REGEX, r"[0-9]{1,4}")
    asks = {f"r{s}": SamplingParams(max_tokens=20, temperature=1.0, seed=s, min_tokens=3, structured=spec)
            for s in range(12)}
    for out in run(make_engine(), asks).values():
        assert out.finish_reason is FinishReason.STOP
        assert re.fullmatch(r"[0-9]{3,4}", out.output_text), out.output_text
    # min_tokens past the grammar's longest match: its 4th digit completes it (nothing may follow), which
    # ends the request, greedy or sampled, whatever min_tokens holds
    asks = {f"r{t}": SamplingParams(max_tokens=20, temperature=t, seed=1, min_tokens=6, structured=spec)
            for t in (0.0, 1.0)}
    for out in run(make_engine(), asks).values():
        assert out.finish_reason is FinishReason.STOP
        assert re.fullmatch(r"[0-9]{4}", out.output_text) and len(out.output_token_ids) == 4, out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_constrained_draw_is_the_masked_rows_seed_for_seed(temperature: float) -> None:
    """The sampler reads a grammar's bitmask in place, copying no row: greedy, the row's argmax when
    allowed, else the argmax over the allowed ids; sampled, a draw among the allowed ids. Each gives the
    token that the row masked (-inf where refused, as the sampler once built it) gives without a grammar,
    seed for seed, step after step: rows wider than the vocabulary (ids past it never allowed), raw argmaxes
    both allowed and refused, and a stop token allowed only where the regex may end."""
    compiler = GrammarCompiler(ByteTokenizer())
    spec = GrammarSpec(GrammarKind.REGEX, r"[a-z]{2,6}-\d{3}( [a-z]{1,4}){0,3}")
    stops = frozenset({ord("\n")})
    ours = Request("ours", [1], SamplingParams(max_tokens=40, temperature=temperature, structured=spec,
                                               stop_token_ids=stops),
                   np.random.default_rng(3), grammar=compiler.constraint(spec))
    masked = Request("masked", [1], SamplingParams(max_tokens=40, temperature=temperature),
                     np.random.default_rng(3))
    reference = compiler.constraint(spec)
    gen = np.random.default_rng(11)
    for step in range(40):
        logits = (gen.normal(size=(1, 300)) * 3.0).astype(np.float32)
        ids = reference.allowed(stops).ids(300)
        if step % 2:  # a model that follows its grammar: an allowed token on top
            logits[0, gen.choice(ids)] = logits.max() + 1.0
        row = np.full_like(logits, -np.inf)
        row[0, ids] = logits[0, ids]
        want = sample(row, [masked])
        assert sample(logits, [ours]) == want, step
        if want[0] in stops:
            assert re.fullmatch(r"[a-z]{2,6}-\d{3}( [a-z]{1,4}){0,3}",
                                bytes(ours.output_token_ids).decode()), ours.output_token_ids
            return
        reference.advance(want[0])
        ours.output_token_ids.append(want[0])
        if ours.grammar is not None and ours.grammar.complete:
            return


def test_requests_ending_early_leave_the_others_masks_sound() -> None:
    """The requests of one engine share its compiler's memo of masks' allowed ids: a request aborted after
    its first token, one ended by a stop string, and ones whose grammar ends leave every other answer valid,
    and a seeded request's tokens are those it gets alone."""
    spec = constraint_for_json_schema(COMPACT)
    alone = run(make_engine(), {"json1": sampled(spec, 1)})["json1"]
    engine = make_engine()
    for s in range(4):
        engine.add_request(f"json{s}", "Answer: ", sampled(spec, s))
    quoted = SamplingParams(max_tokens=200, temperature=1.0, seed=9, structured=spec, stop=['"'])
    engine.add_request("quoted", "Answer: ", quoted)
    while not any(out.new_token_ids for out in engine.step()):  # the prompts' prefill, then a token each
        pass
    engine.abort_request("json0")
    outs = engine.run_to_completion()
    assert "json0" not in outs and outs["quoted"].output_text == "{"
    assert outs["json1"].output_token_ids == alone.output_token_ids
    for rid in ("json1", "json2", "json3"):
        jsonschema.validate(json.loads(outs[rid].output_text), SCHEMA)


def test_a_grammar_that_fails_while_it_generates_fails_its_request_alone() -> None:
    """"a" then one of 2,100 alternatives: it compiles (its first row is small) and passes llguidance's
    limit of 2,000 Earley items in a row as it takes the "a". That request ends with an INVALID_ARG in
    llguidance's words (finish reason ERROR: never "stop" with a text its grammar did not finish); a JSON
    request and a free one in the same batch finish as they would have (before, the sampler raised and the
    whole step failed)."""
    wide = GrammarSpec(GrammarKind.GRAMMAR, 'start: "a" t\nt: ' + " | ".join(f'"b{i}"' for i in range(2100)))
    engine = make_engine()
    asks = {"json": sampled(constraint_for_json_schema(COMPACT), 3),
            "free": SamplingParams(max_tokens=12, temperature=1.0, seed=4)}
    outs = run(engine, {"fails": SamplingParams(max_tokens=40, structured=wide), **asks})
    failed = outs["fails"]
    assert failed.finish_reason is FinishReason.ERROR and failed.error is not None
    assert failed.error.code is ErrorCode.INVALID_ARG
    assert "the grammar failed at output token 1: " in failed.error.message
    assert "max is 2000" in failed.error.message, failed.error.message
    alone = run(make_engine(), asks)
    for rid in asks:
        assert outs[rid].output_token_ids == alone[rid].output_token_ids
    jsonschema.validate(json.loads(outs["json"].output_text), SCHEMA)
