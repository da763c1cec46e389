"""The generative example model (model_repository/tiny_decoder, built by
perf/hubserve_models/tiny_decoder.py): it is a valid ONNX model in Optimum's decoder_with_past form, stepping
it token by token agrees with one prefill, and the repository loads it beside the others, with the server
ready, as a decoupled model with the LLM signature (test_generate_triton.py serves it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import tritonclient.http as httpclient

from conftest import EXAMPLES, start_server
from hubserve_models import examples
from hubserve_models.tiny_decoder import TinyDecoderShape, tiny_decoder_model

SHAPE = TinyDecoderShape()
KV_NAMES = [f"past_key_values.{i}.{part}" for i in range(SHAPE.layers) for part in ("key", "value")]


def session() -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(examples.model_bytes(tiny_decoder_model()), opts,
                                providers=["CPUExecutionProvider"])


def empty_past(batch: int) -> dict[str, np.ndarray]:
    return {name: np.zeros((batch, SHAPE.heads, 0, SHAPE.head_dim), np.float32) for name in KV_NAMES}


def prefill_feed(ids: list[int]) -> dict[str, np.ndarray]:
    tokens = np.array([ids], np.int64)
    return {"input_ids": tokens, "attention_mask": np.ones_like(tokens),
            "position_ids": np.arange(len(ids), dtype=np.int64)[None], **empty_past(1)}


def test_the_model_is_valid_and_has_optimums_interface():
    model = tiny_decoder_model()
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == examples.IR_VERSION
    sess = session()
    assert [a.name for a in sess.get_inputs()] == ["input_ids", "attention_mask", "position_ids", *KV_NAMES]
    assert [a.name for a in sess.get_outputs()] == ["logits", *[n.replace("past_key_values", "present")
                                                                for n in KV_NAMES]]
    assert examples.model_bytes(tiny_decoder_model()) == examples.model_bytes(model)  # reproducible


def test_stepping_with_past_matches_one_prefill():
    sess = session()
    ids = [256, *b"hello world"]
    full = sess.run(["logits"], prefill_feed(ids))[0][0]
    past = empty_past(1)
    names = [o.name for o in sess.get_outputs()]
    for t, token in enumerate(ids):
        feed = {"input_ids": np.array([[token]], np.int64), "attention_mask": np.ones((1, t + 1), np.int64),
                "position_ids": np.array([[t]], np.int64), **past}
        out = dict(zip(names, sess.run(None, feed), strict=True))
        assert out["present.0.key"].shape == (1, SHAPE.heads, t + 1, SHAPE.head_dim)
        np.testing.assert_allclose(out["logits"][0, 0], full[t], atol=1e-4)
        assert int(out["logits"][0, 0].argmax()) == int(full[t].argmax())
        past = {name: out[name.replace("past_key_values", "present")] for name in KV_NAMES}


def test_the_repository_serves_it_with_the_llm_signature_and_stays_ready(tmp_path: Path):
    repo = tmp_path / "repo"
    for name in ("simple", "tiny_decoder"):
        (repo / name).mkdir(parents=True)
        shutil.copy(EXAMPLES / name / "config.pbtxt", repo / name / "config.pbtxt")
    examples.build_repository(repo, ["simple", "tiny_decoder"])
    server = start_server(repo, tmp_path / "server.log")  # strict readiness: every model READY
    try:
        with httpclient.InferenceServerClient(server.http_url, network_timeout=30.0) as client:
            assert client.is_model_ready("tiny_decoder")
            meta = client.get_model_metadata("tiny_decoder")
            assert meta["inputs"][0] == {"name": "text_input", "datatype": "BYTES", "shape": [1]}
            assert [o["name"] for o in meta["outputs"]] == ["text_output"]
            assert client.get_model_config("tiny_decoder")["model_transaction_policy"]["decoupled"]
    finally:
        server.stop()
