"""The agreeing target/draft pair perf/bench_spec.py measures (perf/hubserve_models/draft_pair.py): the draft
is a smaller model of the target's weights, the target's greedy tokens are the same with it proposing, and
most of its proposals are kept, where a draft of other random weights keeps next to none."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from engine.generate.core.draft_proposer import DraftModelProposer
from engine.generate.core.engine import CacheConfig, GenerationEngine
from engine.generate.core.proposer import Proposer
from engine.generate.core.request import SamplingParams
from engine.generate.core.runner import DecoderRunner
from engine.generate.core.scheduler import SchedulerConfig
from engine.generate.core.tokenizer import ByteTokenizer
from hubserve_models import examples
from hubserve_models.draft_pair import agreeing_pair
from hubserve_models.tiny_decoder import TinyDecoderShape, tiny_decoder_model

SHAPE = TinyDecoderShape(layers=3)
PARAMS = SamplingParams(max_tokens=32, ignore_eos=True)


def options() -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return opts


def prompts(count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[256, *rng.integers(32, 127, size=int(rng.integers(4, 40))).tolist()] for _ in range(count)]


def engine(target: bytes, proposer: Proposer | None) -> GenerationEngine:
    runner = DecoderRunner(target, 128, 16, options(), max_len=512, max_rows=4)
    return GenerationEngine(runner, ByteTokenizer(), CacheConfig(16, 128, 512), SchedulerConfig(4, 128),
                            proposer=proposer)


def generate(e: GenerationEngine, batch: list[list[int]]) -> list[tuple[int, ...]]:
    for i, prompt in enumerate(batch):
        e.add_request(f"r{i}", prompt, PARAMS)
    done = e.run_to_completion()
    return [done[f"r{i}"].output_token_ids for i in range(len(batch))]


def acceptance(target: bytes, draft: bytes, batch: list[list[int]]) -> float:
    """The share of the draft's proposals the target kept, its tokens checked against plain decoding's."""
    e = engine(target, DraftModelProposer(draft, options(), 4, SHAPE.vocab_size))
    assert generate(e, batch) == generate(engine(target, None), batch)
    stats = e.stats()
    return stats.spec_accepted_tokens / stats.spec_draft_tokens


def test_the_draft_is_the_targets_first_layer_and_mostly_agrees():
    target_model, draft_model = agreeing_pair(SHAPE, draft_layers=1, draft_ffn=64, residual_scale=0.05)
    draft_weights = {t.name: t for t in draft_model.graph.initializer}
    target_weights = {t.name: t for t in target_model.graph.initializer}
    assert not any(name.startswith(("l1.", "l2.")) for name in draft_weights)
    assert draft_weights["l0.wq"] == target_weights["l0.wq"]
    assert onnx.numpy_helper.to_array(draft_weights["l0.w1"]).shape == (SHAPE.hidden, 64)
    target, draft = (examples.model_bytes(m) for m in (target_model, draft_model))
    batch = prompts(4, seed=5)
    agreeing = acceptance(target, draft, batch)
    assert agreeing > 0.5
    other = acceptance(target, examples.model_bytes(tiny_decoder_model(seed=5)), batch)
    assert other < agreeing / 2


def test_the_draft_must_be_smaller_than_the_target():
    with pytest.raises(ValueError, match="draft_layers must be 1"):
        agreeing_pair(SHAPE, draft_layers=3)
    with pytest.raises(ValueError, match="draft_ffn must be"):
        agreeing_pair(SHAPE, draft_ffn=SHAPE.ffn + 1)
