"""A shared-KV decoder (engine/generate/core/shared_group.py; tiny_decoder.py's `shared_kv` form, ONNX
Runtime's GroupQueryAttention writing a buffer in place): the rows follow the requests without copying the
past, and every token equals the plain step-by-step loop over the dense model of the same weights
(test_generate_engine.py's oracle). In process through the engine, then one server with such a model folder
answering the `openai` client exactly as the dense example does."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import EXAMPLES, openai_client, start_server
from engine.errors import EngineError
from engine.generate.core.engine import CacheConfig, GenerationEngine
from engine.generate.core.request import SamplingParams
from engine.generate.core.runner import DecoderRunner
from engine.generate.core.scheduler import SchedulerConfig
from engine.generate.serving.model_folder import load_engine
from hubserve_models import examples
from hubserve_models.tiny_decoder import CHAT_TEMPLATE, TinyDecoderShape, tiny_decoder_model
from test_generate_engine import (
    GREEDY,
    KV,
    MODEL,
    SHARED_MODEL,
    TOKENIZER,
    assert_no_leaks,
    generate,
    make_engine,
    options,
    prompts,
    reference_greedy,
)


def run_with_joins(engine: GenerationEngine, jobs: list[tuple[list[int], int]], every: int = 2,
                   first: int = 6) -> dict[str, tuple[int, ...]]:
    """The first `first` jobs at once, then one more every `every` steps: joins and leaves mid-flight."""
    done: dict[str, tuple[int, ...]] = {}
    pending = list(enumerate(jobs))
    step = 0
    while pending or engine.has_unfinished():
        while pending and (pending[0][0] < first or step % every == 0):
            i, (prompt, max_tokens) = pending.pop(0)
            engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            if i >= first:
                break
        done.update({o.request_id: o.output_token_ids for o in engine.step() if o.finished})
        step += 1
    return done


def assert_greedy(engine: GenerationEngine, batch: list[list[int]], reference_session) -> None:
    """Run `batch` together, greedy, to the end: every request's tokens are the dense oracle's."""
    for i, prompt in enumerate(batch):
        engine.add_request(f"r{i}", prompt, GREEDY)
    done = engine.run_to_completion()
    for i, prompt in enumerate(batch):
        assert list(done[f"r{i}"].output_token_ids) == reference_greedy(reference_session, prompt,
                                                                        GREEDY.max_tokens), i


def test_a_steady_group_is_gathered_once_and_then_written_in_place(reference_session):
    batch = [[256, *range(40, 59)] for _ in range(4)]
    engine = make_engine(budget=256, kv="shared")
    assert_greedy(engine, batch, reference_session)
    stats = engine.runner.stats
    assert stats.decode_rows == 4 * (GREEDY.max_tokens - 1)
    assert stats.gathered_rows == 4 and stats.rebuilds == 0  # gathered on joining; no row ever moved
    assert stats.padded_slots == 0  # each row's attention reads its own length only
    assert_no_leaks(engine)


def test_joins_leaves_and_moves_keep_every_token(reference_session):
    """Long-tailed lengths joining every other step: rows free up out of order, joiners take the lowest,
    and once more than a quarter are free the highest move down."""
    rng = np.random.default_rng(5)
    jobs = [(p, int(rng.integers(2, 40))) for p in prompts(30, seed=51)]
    engine = make_engine(budget=128, seqs=12, kv="shared")
    done = run_with_joins(engine, jobs)
    for i, (prompt, max_tokens) in enumerate(jobs):
        assert list(done[f"r{i}"]) == reference_greedy(reference_session, prompt, max_tokens), i
    stats = engine.runner.stats
    assert stats.free_rows > 0 and stats.rebuilds > 0  # rows ran free, and some moved down
    assert stats.gathered_rows == len(jobs)  # each request gathered once, when it joined
    assert_no_leaks(engine)


@pytest.mark.parametrize("kv", ["dense", "shared"])
def test_the_logits_a_step_returns_stay_the_callers(reference_session, kv):
    """A shared-KV decode run writes its logits into an array its binding keeps for the next run at that
    height; what `execute` hands back must not be that array. Every step's logits, copied when returned,
    still equal what was returned once all the steps ran (a steady group: the same height every step)."""
    engine = make_engine(budget=256, kv=kv)
    runner = engine.runner
    returned: list[tuple[np.ndarray, np.ndarray]] = []
    execute = runner.execute

    def recording(chunks):
        logits = execute(chunks)
        returned.append((logits, logits.copy()))
        return logits

    runner.execute = recording  # type: ignore[method-assign]
    assert_greedy(engine, prompts(4, seed=67), reference_session)
    assert len(returned) == GREEDY.max_tokens
    for logits, copy in returned:
        np.testing.assert_array_equal(logits, copy)


def test_more_decoding_requests_than_rows_grow_the_buffers(reference_session):
    runner = DecoderRunner(SHARED_MODEL, 256, 8, options(), shared_kv=True, max_len=512, max_rows=2)
    engine = GenerationEngine(runner, TOKENIZER, CacheConfig(8, 256, 512, True), SchedulerConfig(8, 256))
    assert_greedy(engine, prompts(6, seed=61), reference_session)
    assert runner.shared_group is not None and runner.shared_group.grown >= 1


def test_lora_rows_in_a_shared_group_match_the_dense_model():
    shape = TinyDecoderShape(lora_rank=4)
    dense = DecoderRunner(examples.model_bytes(tiny_decoder_model(shape)), 256, 8, options())
    shared = DecoderRunner(examples.model_bytes(tiny_decoder_model(TinyDecoderShape(lora_rank=4,
                                                                                    shared_kv=True))),
                           256, 8, options(), shared_kv=True, max_len=512, max_rows=16)
    assert dense.lora == shared.lora is not None  # no adapter loaded: rows run with zero matrices
    outs = []
    for runner in (dense, shared):
        engine = GenerationEngine(runner, TOKENIZER, CacheConfig(8, 256, 512, True), SchedulerConfig(16, 64))
        batch = prompts(5, seed=71)
        for i, prompt in enumerate(batch):
            engine.add_request(f"r{i}", prompt, GREEDY)
        done = engine.run_to_completion()
        outs.append([done[f"r{i}"].output_token_ids for i in range(len(batch))])
    assert outs[0] == outs[1]


def shared_folder(root: Path, name: str = "tiny_shared", share: str = "true", steps: int = 1) -> Path:
    """The example tiny_decoder's folder with the shared-KV model and the parameter that declares it (and
    `steps` decode steps per schedule: num_scheduler_steps)."""
    folder = root / name
    (folder / "1").mkdir(parents=True)
    config = (EXAMPLES / "tiny_decoder" / "config.pbtxt").read_text().replace(
        'name: "tiny_decoder"', f'name: "{name}"')
    config += f'parameters {{ key: "past_present_share_buffer" value {{ string_value: "{share}" }} }}\n'
    if steps != 1:
        config += f'parameters {{ key: "num_scheduler_steps" value {{ string_value: "{steps}" }} }}\n'
    (folder / "config.pbtxt").write_text(config)
    (folder / "1" / "model.onnx").write_bytes(SHARED_MODEL)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)  # the example's own
    return folder


def test_the_folder_parameter_declares_the_layout(tmp_path: Path, reference_session):
    engine = load_engine(shared_folder(tmp_path))
    assert engine.runner.shared_kv
    prompt = [256, *b"Hello"]
    engine.add_request("r", prompt, GREEDY)
    assert list(engine.run_to_completion()["r"].output_token_ids) == reference_greedy(
        reference_session, prompt, 24)
    with pytest.raises(EngineError, match="past_present_share_buffer must be true or false"):
        load_engine(shared_folder(tmp_path, "bad", "yes"))


def test_a_server_answers_the_openai_client_alike_with_either_layout_and_multi_step(
        tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("shared_kv") / "repo"
    (root / "tiny_decoder").mkdir(parents=True)
    shutil.copy(EXAMPLES / "tiny_decoder" / "config.pbtxt", root / "tiny_decoder" / "config.pbtxt")
    examples.build_repository(root, ["tiny_decoder"])
    shared_folder(root)
    shared_folder(root, "tiny_steps", steps=8)  # a multi-step decode: several tokens per event
    server = start_server(root, tmp_path_factory.mktemp("shared_kv_log") / "server.log")
    try:
        client = openai_client(server)
        texts = {}
        for model in ("tiny_decoder", "tiny_shared", "tiny_steps"):
            chunks = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=40,
                temperature=0, stream=True, extra_body={"ignore_eos": True})
            texts[model] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            several = client.completions.create(model=model, prompt=["Once", "upon a time", "x"],
                                                max_tokens=30, temperature=0, extra_body={"ignore_eos": True})
            texts[model + " batch"] = [c.text for c in sorted(several.choices, key=lambda c: c.index)]
            texts[model + " usage"] = several.usage.completion_tokens if several.usage else None
        assert texts["tiny_decoder"] and texts["tiny_decoder"] == texts["tiny_shared"] == texts["tiny_steps"]
        assert texts["tiny_decoder batch"] == texts["tiny_shared batch"] == texts["tiny_steps batch"]
        assert texts["tiny_decoder usage"] == texts["tiny_shared usage"] == texts["tiny_steps usage"] == 90
    finally:
        server.stop()


@KV
def test_a_row_that_skips_a_step_keeps_its_unwritten_tokens(reference_session, kv):
    """A token budget below the running decodes: some skip each step, leave the group with tokens the
    blocks don't have yet (they are written as the row leaves), and rejoin gathered from the blocks. Both
    layouts' decode groups write blocks this way (decode_group.py, shared_group.py)."""
    batch = prompts(8, seed=81)
    engine = make_engine(budget=5, seqs=8, kv=kv)
    done = generate(engine, batch)
    for prompt, tokens in zip(batch, done, strict=True):
        assert list(tokens) == reference_greedy(reference_session, prompt, GREEDY.max_tokens)
    assert engine.runner.stats.gathered_rows > len(batch)  # rows rejoined after skipping
    assert_no_leaks(engine)


@KV
def test_a_prompt_sharing_generated_blocks_reads_what_the_decodes_wrote(reference_session, kv):
    """Blocks filled by decode steps are written to the blocks as they fill, so a later prompt that
    repeats a generated answer shares them (a prefix hit) and computes from the right keys and values."""
    engine = make_engine(block_size=8, kv=kv)
    first = [256, *b"Tell me"]
    engine.add_request("a", first, SamplingParams(max_tokens=40, ignore_eos=True))
    answer = list(engine.run_to_completion()["a"].output_token_ids)
    follow = first + answer[:33]  # 41 tokens: five full blocks, the last four of them written by decodes
    engine.add_request("b", follow, GREEDY)
    hits_before = engine.kv.prefix_hits
    got = engine.run_to_completion()["b"].output_token_ids
    assert engine.kv.prefix_hits - hits_before == 40
    assert list(got) == reference_greedy(reference_session, follow, GREEDY.max_tokens)
    assert_no_leaks(engine)


def test_a_model_is_refused_for_the_wrong_layout_when_it_loads(tmp_path: Path):
    """Either mismatch would answer wrongly (or fail every request), so the runner probes the model once as
    it loads: the dense model cannot write its past buffer in place; the GQA model misreads right-aligned
    contexts behind masked padding, which the dense layout gives it."""
    with pytest.raises(EngineError, match="must write its present into its past buffer"):
        DecoderRunner(MODEL, 64, 8, options(), shared_kv=True)
    with pytest.raises(EngineError, match="does not ignore past slots its attention_mask marks 0"):
        DecoderRunner(SHARED_MODEL, 64, 8, options(), shared_kv=False)
    folder = shared_folder(tmp_path, "gqa_said_dense", "false")  # the folder's parameter decides
    with pytest.raises(EngineError, match="past_present_share_buffer true"):
        load_engine(folder)
