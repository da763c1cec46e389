"""Multi-LoRA on a decoder whose graph takes adapter inputs (tiny_decoder.py with `lora_rank`): the engine's
greedy tokens with an adapter equal a reference loop over the same ONNX model fed the adapter's matrices
(full recompute, no cache), for requests of different adapters batched together; the adapter changes the
output; a prompt cached by one adapter is not shared with another; adapters are evicted LRU. The server
tests pick the adapter by OpenAI's `model: "base:adapter"` and by the Triton request parameter `lora`."""

from __future__ import annotations

import dataclasses
import json
import queue
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient

from conftest import EXAMPLES, RunningServer, start_server
from engine.generate.core.lora import AdapterStore, LoraShape
from engine.generate.core.request import SamplingParams
from engine.generate.serving.model_folder import load_engine
from hubserve_models.examples import write_model
from hubserve_models.tiny_decoder import TinyDecoderShape, tiny_decoder_model

MODEL = "tiny_lora"
SHAPE = TinyDecoderShape(lora_rank=4)
ADAPTERS = ("alpha", "beta", "gamma")


def write_adapter(folder: Path, seed: int, rank: int = 4) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(SHAPE.layers):
        np.save(folder / f"lora_a.{i}.npy", rng.standard_normal((SHAPE.hidden, rank), dtype=np.float32) * 0.5)
        np.save(folder / f"lora_b.{i}.npy", rng.standard_normal((rank, SHAPE.hidden), dtype=np.float32) * 0.5)


def build_model(root: Path, max_loras: int = 2, shared_kv: bool = False) -> Path:
    """The LoRA model folder; `shared_kv`: the same weights in the shared-KV form (shared_group.py)."""
    folder = root / MODEL
    (folder / "1").mkdir(parents=True)
    config = (EXAMPLES / "tiny_decoder" / "config.pbtxt").read_text().replace('"tiny_decoder"', f'"{MODEL}"')
    config += f'parameters {{ key: "max_loras" value {{ string_value: "{max_loras}" }} }}\n'
    if shared_kv:
        config += 'parameters { key: "past_present_share_buffer" value { string_value: "true" } }\n'
    (folder / "config.pbtxt").write_text(config)
    write_model(tiny_decoder_model(dataclasses.replace(SHAPE, shared_kv=shared_kv)),
                folder / "1" / "model.onnx")
    for n, name in enumerate(ADAPTERS):
        write_adapter(folder / "adapters" / name, 100 + n, rank=4 if n else 2)  # alpha: rank 2, padded
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("lora") / "repo")


def reference(folder: Path, token_ids: list[int], adapter: str | None, max_tokens: int) -> list[int]:
    """Greedy, recomputing the whole sequence every step with an empty past: no blocks, no batching."""
    session = ort.InferenceSession(str(folder / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    d, r = SHAPE.hidden, SHAPE.lora_rank
    lora = {}
    for i in range(SHAPE.layers):
        a, b = np.zeros((d, r), np.float32), np.zeros((r, d), np.float32)
        if adapter is not None:
            fa, fb = (np.load(folder / "adapters" / adapter / f"lora_{x}.{i}.npy") for x in "ab")
            a[:, :fa.shape[1]], b[:fb.shape[0]] = fa, fb
        lora[f"lora_a.{i}"], lora[f"lora_b.{i}"] = a[None], b[None]
    empty = np.zeros((1, SHAPE.heads, 0, SHAPE.head_dim), np.float32)
    tokens = list(token_ids)
    out = []
    for _ in range(max_tokens):
        n = len(tokens)
        feed = {"input_ids": np.array([tokens], np.int64), "attention_mask": np.ones((1, n), np.int64),
                "position_ids": np.arange(n, dtype=np.int64)[None], **lora}
        for i in range(SHAPE.layers):
            feed[f"past_key_values.{i}.key"] = feed[f"past_key_values.{i}.value"] = empty
        logits = session.run(["logits"], feed)[0]
        token = int(np.argmax(logits[0, -1]))
        tokens.append(token)
        out.append(token)
    return out


@pytest.fixture(scope="module")
def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("lora_shared") / "repo", shared_kv=True)


@pytest.mark.parametrize("steps", [1, 4])  # 4: a multi-step decode (engine.py), each run fed its adapters
@pytest.mark.parametrize("kv", ["dense", "shared"])
def test_mixed_adapters_in_one_batch_equal_the_reference_loop(folder: Path, shared_folder: Path, kv: str,
                                                              steps: int):
    engine = load_engine(shared_folder if kv == "shared" else folder)  # the reference: the dense model
    engine.scheduler.config = dataclasses.replace(engine.scheduler.config, num_scheduler_steps=steps)
    prompts = {"base": ("The quick brown fox jumps over the lazy dog, twice.", None),
               "a": ("The quick brown fox jumps over the lazy dog, twice.", "alpha"),  # same prompt
               "b": ("Once upon a time", "beta"), "g": ("Hello there", "gamma")}
    for rid, (prompt, adapter) in prompts.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=12, ignore_eos=True, lora=adapter))
    done = engine.run_to_completion()
    outputs = {rid: list(done[rid].output_token_ids) for rid in prompts}
    for rid, (prompt, adapter) in prompts.items():
        assert outputs[rid] == reference(folder, engine.tokenizer.encode(prompt), adapter, 12), rid
    assert outputs["base"] != outputs["a"]  # the adapter changes the greedy output
    assert engine.runner.stats.decode_rows >= 4 * 11 and engine.runner.stats.runs < 4 * 12  # batched together


def test_an_adapter_never_reuses_blocks_cached_under_another(folder: Path):
    engine = load_engine(folder)
    prompt = "A prompt long enough to fill two blocks of sixteen tokens each, at least."
    for rid, adapter in (("first", None), ("second", "beta"), ("third", "beta")):
        engine.add_request(rid, prompt, SamplingParams(max_tokens=6, ignore_eos=True, lora=adapter))
        out = engine.run_to_completion()[rid]
        assert list(out.output_token_ids) == reference(folder, engine.tokenizer.encode(prompt), adapter, 6)
    assert engine.stats().prefix_cache_hit_rate > 0  # "third" shared "second"'s blocks


def test_adapters_load_on_demand_and_are_evicted_lru(folder: Path):
    shape = LoraShape(SHAPE.layers, SHAPE.hidden, SHAPE.lora_rank)
    store = AdapterStore(folder / "adapters", shape, 2, MODEL)
    alpha = store.get("alpha")
    store.get("beta")
    assert store.get("alpha") is alpha and store.loads == 2  # a hit, now the most recent
    store.get("gamma")
    assert store.loaded == ["alpha", "gamma"] and store.evictions == 1  # beta was the least recent
    store.get("beta")
    assert store.loaded == ["gamma", "beta"] and store.loads == 4
    for bad in ("nope", "../adapters", ".hidden", ""):
        with pytest.raises(Exception, match="has no LoRA adapter"):
            store.get(bad)


@pytest.fixture(scope="module")
def server(folder: Path, tmp_path_factory: pytest.TempPathFactory):
    running = start_server(folder.parent, tmp_path_factory.mktemp("lora_log") / "server.log")
    yield running
    running.stop()


def _post(server: RunningServer, path: str, doc: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=json.dumps(doc).encode())
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_adapter_is_chosen_per_request_by_both_apis(server: RunningServer, folder: Path):
    params = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}
    texts = {}
    for name in ("", ":beta", ":gamma"):
        status, doc = _post(server, "/v1/completions", {"model": MODEL + name, "prompt": "Hello", **params})
        assert status == 200, doc
        texts[name] = doc["choices"][0]["text"]
    assert len(set(texts.values())) == 3
    status, doc = _post(server, f"/v2/models/{MODEL}/generate",
                        {"text_input": "Hello", "exclude_input_in_output": True,
                         "parameters": {**params, "lora": "beta"}})
    assert status == 200 and doc["text_output"] == texts[":beta"], doc
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Hello"], dtype=object))
    exclude = grpcclient.InferInput("exclude_input_in_output", [1], "BOOL")
    exclude.set_data_from_numpy(np.array([True]))
    client.async_stream_infer(MODEL, [text, exclude], parameters={**params, "lora": "gamma"})
    client.async_stream_infer(MODEL, [text], parameters={"lora": "nope"})
    got = [results.get(timeout=60), results.get(timeout=60)]  # the refusal may come first
    client.stop_stream()
    client.close()
    (ok, _), = [g for g in got if g[1] is None]
    (_, missing), = [g for g in got if g[1] is not None]
    assert ok.as_numpy("text_output")[0].decode() == texts[":gamma"]
    # a stream's error response carries its message only (Triton's error_message), no status
    assert f"model '{MODEL}' has no LoRA adapter 'nope'" in missing.message()


def test_an_unknown_adapter_is_openai_404(server: RunningServer):
    status, doc = _post(server, "/v1/completions", {"model": f"{MODEL}:nope", "prompt": "x", "max_tokens": 2})
    assert status == 404 and doc["error"]["code"] == "model_not_found"
    assert "has no LoRA adapter 'nope'" in doc["error"]["message"]
    status, doc = _post(server, "/v1/completions", {"model": "tiny_missing:beta", "prompt": "x"})
    assert status == 404


def test_an_adapter_on_a_model_without_adapter_inputs_is_invalid(tmp_path: Path):
    root = tmp_path / "repo"
    (root / "tiny_decoder").mkdir(parents=True)
    shutil.copy(EXAMPLES / "tiny_decoder" / "config.pbtxt", root / "tiny_decoder" / "config.pbtxt")
    write_model(tiny_decoder_model(), root / "tiny_decoder" / "1" / "model.onnx")
    engine = load_engine(root / "tiny_decoder")
    with pytest.raises(Exception, match="takes no adapter inputs"):
        engine.add_request("x", "hi", SamplingParams(lora="beta"))
