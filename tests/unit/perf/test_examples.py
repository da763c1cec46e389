"""The example/test model builders (perf/hubserve_models/examples.py): each model runs in onnxruntime and
computes what it says, the builds are byte-for-byte reproducible, and the committed configs agree with the
models."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from conftest import ROOT
from engine.config import steps as cfg
from hubserve_models import examples

EXAMPLE_REPOSITORY = ROOT / "model_repository"
SMALL_EXAMPLES = ["simple", "mlp", "strings", "image", "simple_string", "simple_identity",
                  "sequence_accumulator", "simple_sequence", "simple_dyna_sequence",
                  "tiny_decoder"]  # not mlp_large

# Datatypes onnxruntime's CPU provider runs Identity on with plain numpy inputs. BF16 has no numpy dtype: it
# needs OrtValues (test_identity_bf16_through_ort_values).
NUMPY_DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                   "FP16", "FP32", "FP64", "BYTES"]
ONNX_BFLOAT16 = 16


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(examples.model_bytes(model), opts, providers=["CPUExecutionProvider"])


def io_of(sess: ort.InferenceSession) -> dict[str, tuple[str, list]]:
    return {a.name: (a.type, list(a.shape)) for a in [*sess.get_inputs(), *sess.get_outputs()]}


# --------------------------------------------------------------------------------------------- every model

@pytest.mark.parametrize("build", [
    examples.simple_model,
    examples.mlp_model,
    lambda: examples.mlp_model(32, (64, 48), 16),
    examples.strings_model,
    examples.image_model,
    examples.simple_string_model,
    *[lambda d=d: examples.identity_model(d) for d in examples.ONNX_TYPES],
])
def test_models_are_valid_opset17_with_an_ir_version_onnxruntime_reads(build):
    model = build()
    onnx.checker.check_model(model, full_check=True)  # includes strict shape inference
    assert model.ir_version == examples.IR_VERSION == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert model.producer_name == examples.PRODUCER
    session(model)  # loads


# --------------------------------------------------------------------------------------------- simple

@pytest.mark.parametrize("batch", [1, 5])
def test_simple_adds_and_subtracts(batch):
    sess = session(examples.simple_model())
    assert io_of(sess) == {name: ("tensor(int32)", ["batch", 16])
                           for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")}
    rng = np.random.default_rng(1)
    a = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    out0, out1 = sess.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    assert out0.dtype == out1.dtype == np.int32
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)


# ------------------------------------------------------------------------------------ Triton's string pair

def test_simple_string_adds_and_subtracts_decimal_strings():
    """What Triton's string example clients send and check: decimal integers as BYTES, their sum and
    difference as decimal strings (client src/python/examples/simple_http_string_infer_client.py)."""
    sess = session(examples.simple_string_model())
    assert io_of(sess) == {name: ("tensor(string)", ["batch", 16])
                           for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")}
    a = np.arange(-8, 24, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 7, dtype=np.int32)
    as_text = np.vectorize(str, otypes=[object])
    out0, out1 = sess.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": as_text(a), "INPUT1": as_text(b)})
    assert out0.tolist() == as_text(a + b).tolist() and out1.tolist() == as_text(a - b).tolist()


def test_simple_identity_echoes_any_bytes():
    """Triton's simple_identity, as its string clients use it: strings with an embedded NUL and raw bytes."""
    sess = session(examples.EXAMPLES["simple_identity"]())
    assert io_of(sess) == {"INPUT0": ("tensor(string)", ["batch", "dim1"]),
                           "OUTPUT0": ("tensor(string)", ["batch", "dim1"])}
    x = np.array([["he\x00llo"] * 3, ["\x00\x01\x02\x03", "", "café"]], dtype=object)
    (got,) = sess.run(["OUTPUT0"], {"INPUT0": x})
    assert got.tolist() == x.tolist()


# --------------------------------------------------------------------------------------------- mlp

def numpy_mlp(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The MLP recomputed in numpy from the model's own initializers (float64, for a tight reference)."""
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    layers = sum(1 for name in weights if name.endswith(".weight"))
    h = x.astype(np.float64)
    for i in range(layers):
        h = h @ weights[f"layer{i}.weight"].astype(np.float64) + weights[f"layer{i}.bias"]
        if i < layers - 1:
            h = np.maximum(h, 0.0)
    return h


def test_mlp_matches_numpy():
    model = examples.mlp_model()
    sess = session(model)
    assert io_of(sess) == {"INPUT0": ("tensor(float)", ["batch", 256]),
                           "OUTPUT0": ("tensor(float)", ["batch", 256])}
    assert [n.op_type for n in model.graph.node] == ["Gemm", "Relu", "Gemm"]
    x = np.random.default_rng(2).standard_normal((7, 256), dtype=np.float32)
    (got,) = sess.run(["OUTPUT0"], {"INPUT0": x})
    want = numpy_mlp(model, x)
    assert got.dtype == np.float32 and got.shape == (7, 256)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # Scaled weights: unit-scale inputs give unit-scale outputs, not overflow or all zeros.
    assert np.isfinite(got).all() and 0.1 < float(np.std(got)) < 10


def test_mlp_initializers_are_the_documented_weights():
    model = examples.mlp_model(8, (16,), 4, seed=3)
    by_name = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for i, (weight, bias) in enumerate(examples.mlp_weights(8, (16,), 4, seed=3)):
        np.testing.assert_array_equal(by_name[f"layer{i}.weight"], weight)
        np.testing.assert_array_equal(by_name[f"layer{i}.bias"], bias)
        assert weight.dtype == bias.dtype == np.float32


def test_mlp_seed_changes_weights_only():
    a, b = examples.mlp_model(8, (16,), 4, seed=0), examples.mlp_model(8, (16,), 4, seed=1)
    assert examples.model_bytes(a) != examples.model_bytes(b)
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]


def test_mlp_large_shape_without_building_it(monkeypatch):
    """mlp_large is 1024 -> 4096 -> 4096 -> 1024; check the call, then the same structure at a small size."""
    calls = []
    monkeypatch.setattr(examples, "mlp_model", lambda *args, **kwargs: calls.append((args, kwargs)))
    examples.EXAMPLES["mlp_large"]()
    assert calls == [((1024, (4096, 4096), 1024), {})]
    monkeypatch.undo()

    model = examples.mlp_model(64, (128, 128), 32)
    assert [n.op_type for n in model.graph.node] == ["Gemm", "Relu", "Gemm", "Relu", "Gemm"]
    shapes = {init.name: tuple(init.dims) for init in model.graph.initializer}
    assert shapes == {"layer0.weight": (64, 128), "layer0.bias": (128,), "layer1.weight": (128, 128),
                      "layer1.bias": (128,), "layer2.weight": (128, 32), "layer2.bias": (32,)}
    sess = session(model)
    assert io_of(sess) == {"INPUT0": ("tensor(float)", ["batch", 64]),
                           "OUTPUT0": ("tensor(float)", ["batch", 32])}
    x = np.random.default_rng(3).standard_normal((4, 64), dtype=np.float32)
    (got,) = sess.run(None, {"INPUT0": x})
    np.testing.assert_allclose(got, numpy_mlp(model, x), rtol=1e-4, atol=1e-4)


def test_mlp_rejects_empty_layers():
    with pytest.raises(ValueError):
        examples.mlp_model(8, (0,), 4)


# --------------------------------------------------------------------------------------------- strings

def test_strings_upper_and_echo_with_utf8_and_empty():
    sess = session(examples.strings_model())
    assert io_of(sess) == {name: ("tensor(string)", ["batch"]) for name in ("TEXT", "UPPER", "ECHO")}
    words = ["hello", "", "caf\u00e9", "\u65e5\u672c\u8a9e", "MiXeD 123", "\u00f1and\u00fa",
             "\u043f\u0440\u0438\u0432\u0435\u0442", "\U0001f600 x"]
    upper, echo = sess.run(["UPPER", "ECHO"], {"TEXT": np.array(words, dtype=object)})
    assert upper.shape == echo.shape == (len(words),)
    assert list(echo) == words
    assert list(upper) == ["HELLO", "", "CAF\u00c9", "\u65e5\u672c\u8a9e", "MIXED 123", "\u00d1AND\u00da",
                           "\u041f\u0420\u0418\u0412\u0415\u0422", "\U0001f600 X"]
    assert list(upper) == [w.upper() for w in words]  # per-code-point mapping agrees with Python here


def test_strings_single_element_and_numpy_unicode_input():
    sess = session(examples.strings_model())
    upper, echo = sess.run(None, {"TEXT": np.array(["one"])})  # <U3, not object
    assert list(upper) == ["ONE"] and list(echo) == ["one"]


# --------------------------------------------------------------------------------------------- identity

def identity_values(datatype: str) -> np.ndarray:
    """Three rows of four that include each type's extremes (and NaN, inf, -0.0 for floats)."""
    if datatype == "BYTES":
        return np.array([["", "a", "caf\u00e9", "\u65e5\u672c"], ["x" * 100, " ", "\u00f1", "\U0001f600"],
                         ["0", "1", "2", "3"]], dtype=object)
    if datatype == "BOOL":
        return np.array([[True, False, True, True], [False, False, True, False], [True] * 4])
    dtype = onnx.helper.tensor_dtype_to_np_dtype(examples.ONNX_TYPES[datatype])
    if dtype.kind == "f":
        info = np.finfo(dtype)
        special = [info.max, info.min, info.tiny, info.eps, np.nan, np.inf, -np.inf, -0.0]
    else:
        info = np.iinfo(dtype)
        special = [info.max, info.min, 0, 1, info.max - 1, info.min + 1, 42, 7]
    return np.array(special + [0, 1, 2, 3], dtype=dtype).reshape(3, 4)


@pytest.mark.parametrize("datatype", NUMPY_DATATYPES)
def test_identity_round_trips_exactly(datatype):
    model = examples.identity_model(datatype, (-1, 4))
    sess = session(model)
    onnx_type = sess.get_inputs()[0].type
    assert io_of(sess) == {"INPUT0": (onnx_type, ["batch", 4]), "OUTPUT0": (onnx_type, ["batch", 4])}
    x = identity_values(datatype)
    (y,) = sess.run(["OUTPUT0"], {"INPUT0": x})
    assert y.shape == x.shape and y.dtype == x.dtype
    if x.dtype.kind == "f":
        np.testing.assert_array_equal(y.view(f"u{x.itemsize}"), x.view(f"u{x.itemsize}"))  # NaN, -0.0 bits
    else:
        assert y.tolist() == x.tolist()


def test_identity_bf16_through_ort_values():
    """BF16 raw bits travel as uint16. onnxruntime takes them as a bfloat16 OrtValue; plain `run` with a
    uint16 array is refused, and `OrtValue.numpy()` cannot return a bfloat16 result, so the output is read
    through a pre-allocated uint16 buffer bound as a bfloat16 OrtValue (or through `data_ptr()`)."""
    sess = session(examples.identity_model("BF16", (-1, 4)))
    assert sess.get_inputs()[0].type == sess.get_outputs()[0].type == "tensor(bfloat16)"
    bits = np.array([[0x3F80, 0x4000, 0xC040, 0x7F80], [0x0000, 0x8000, 0x7FC0, 0x0001],
                     [0xFF80, 0x7F7F, 0x0080, 0x1234]], dtype=np.uint16)
    feed = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx_element_type=ONNX_BFLOAT16)
    assert feed.data_type() == "tensor(bfloat16)"

    (result,) = sess.run_with_ort_values(["OUTPUT0"], {"INPUT0": feed})
    assert result.data_type() == "tensor(bfloat16)" and result.shape() == [3, 4]
    raw = (ctypes.c_uint16 * bits.size).from_address(result.data_ptr())
    np.testing.assert_array_equal(np.frombuffer(raw, dtype=np.uint16).reshape(bits.shape), bits)

    out = np.zeros_like(bits)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("INPUT0", feed)
    binding.bind_ortvalue_output(
        "OUTPUT0", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out, onnx_element_type=ONNX_BFLOAT16))
    sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(out, bits)


@pytest.mark.parametrize("dims, shape, feed", [
    ((-1, -1), ["batch", "dim1"], (2, 3)),
    ((2, 3), [2, 3], (2, 3)),
    ((-1,), ["batch"], (6,)),
    ((-1, 2, 3), ["batch", 2, 3], (1, 2, 3)),
])
def test_identity_dims(dims, shape, feed):
    sess = session(examples.identity_model("FP32", dims))
    assert io_of(sess)["INPUT0"] == ("tensor(float)", shape)
    x = np.arange(6, dtype=np.float32).reshape(feed)
    np.testing.assert_array_equal(sess.run(None, {"INPUT0": x})[0], x)


@pytest.mark.parametrize("datatype, dims",
                         [("FP8", (-1, 4)), ("fp32", (-1, 4)), ("FP32", (0, 4)), ("FP32", (-2,))])
def test_identity_rejects_bad_arguments(datatype, dims):
    with pytest.raises(ValueError):
        examples.identity_model(datatype, dims)


# --------------------------------------------------------------------------------------------- image

def test_image_is_the_per_channel_mean():
    sess = session(examples.image_model())
    assert io_of(sess) == {"INPUT0": ("tensor(float)", ["batch", 3, 224, 224]),
                           "OUTPUT0": ("tensor(float)", ["batch", 3])}
    x = np.random.default_rng(4).random((2, 3, 224, 224), dtype=np.float32)
    (got,) = sess.run(None, {"INPUT0": x})
    assert got.shape == (2, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, x.astype(np.float64).mean(axis=(2, 3)), rtol=1e-5)


# --------------------------------------------------------------------------------------------- text

def test_text_classifier_is_a_bag_of_words_over_the_documented_weights():
    model = examples.text_classifier_model()
    onnx.checker.check_model(model, full_check=True)
    sess = session(model)
    assert io_of(sess) == {"TOKENS": ("tensor(int64)", ["batch", 16]),
                           "SCORES": ("tensor(float)", ["batch", 3])}
    embedding, bias = examples.text_classifier_weights()
    assert embedding.shape == (len(examples.TEXT_VOCAB), 3) and not embedding[0].any()
    vocab = {w: i for i, w in enumerate(examples.TEXT_VOCAB)}
    tokens = np.zeros((3, 16), np.int64)
    tokens[0, :3] = [vocab["great"], vocab["movie"], vocab["love"]]
    tokens[1, :2] = [vocab["terrible"], vocab["food"]]
    (scores,) = sess.run(None, {"TOKENS": tokens})
    logits = embedding[tokens].astype(np.float64).sum(axis=1) + bias
    want = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(scores, want, rtol=1e-5)
    assert [examples.TEXT_LABELS[i] for i in scores.argmax(axis=1)] == ["positive", "negative", "neutral"]


def test_image_pipeline_files_agree_with_the_classifier():
    """labels.txt's lines (the ensemble's and the classifier's) are the classifier's colours; the
    pre-processing step is a committed Python model with the same I/O as the classifier's input, and no ONNX
    builder."""
    for name in ("image_pipeline", "image_classifier"):  # the ensemble's and its classifier's own
        labels = (EXAMPLE_REPOSITORY / name / "labels.txt").read_text().splitlines()
        assert tuple(labels) == tuple(examples.COLOURS), name
    assert (EXAMPLE_REPOSITORY / "image_preprocess" / "1" / "model.py").is_file()
    assert "image_preprocess" not in examples.EXAMPLES
    pre = cfg.validate(cfg.read_config_proto(EXAMPLE_REPOSITORY / "image_preprocess"), "image_preprocess")
    net = cfg.validate(cfg.read_config_proto(EXAMPLE_REPOSITORY / "image_classifier"), "image_classifier")
    assert pre.backend == "python" and net.backend == "onnxruntime"
    side = examples.IMAGE_SIDE
    assert [(s.name, s.datatype.value, s.dims) for s in pre.inputs] == [("IMAGE", "UINT8", (3, side, side))]
    assert [(s.name, s.datatype.value, s.dims) for s in pre.outputs] == \
        [(s.name, s.datatype.value, s.dims) for s in net.inputs]


def test_text_pipeline_word_lists_agree_with_the_classifier():
    """vocab.txt's line i is token i of the classifier's embedding; labels.txt's lines are its classes."""
    vocab = (EXAMPLE_REPOSITORY / "text_tokenizer" / "vocab.txt").read_text().splitlines()
    assert tuple(vocab) == examples.TEXT_VOCAB and vocab[:2] == ["[pad]", "[unk]"]
    labels = (EXAMPLE_REPOSITORY / "text_postprocess" / "labels.txt").read_text().splitlines()
    assert tuple(labels) == examples.TEXT_LABELS
    for name in ("text_tokenizer", "text_postprocess"):
        assert (EXAMPLE_REPOSITORY / name / "1" / "model.py").is_file()
        assert cfg.read_config_proto(EXAMPLE_REPOSITORY / name).backend == "python"


# --------------------------------------------------------------------------------------------- writing

def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_builds_are_byte_identical(tmp_path):
    first = examples.build_repository(tmp_path / "a", SMALL_EXAMPLES)
    second = examples.build_repository(tmp_path / "b", SMALL_EXAMPLES)
    assert all(b.written for b in first + second)
    a, b = files_under(tmp_path / "a"), files_under(tmp_path / "b")
    # the model files, and the files an example keeps beside its config (tiny_decoder's chat template)
    extra = [f"{name}/{file}" for name in SMALL_EXAMPLES for file in examples.EXAMPLE_FILES.get(name, {})]
    assert sorted(a) == sorted([f"{name}/1/model.onnx" for name in SMALL_EXAMPLES] + extra)
    assert a == b
    for name in SMALL_EXAMPLES:  # a fresh builder call gives the same bytes too
        assert examples.model_bytes(examples.EXAMPLES[name]()) == a[f"{name}/1/model.onnx"]


def test_write_model_is_deterministic_and_creates_folders(tmp_path):
    for datatype in examples.ONNX_TYPES:
        one, two = tmp_path / "x" / datatype / "1" / "model.onnx", tmp_path / "y" / datatype / "model.onnx"
        examples.write_model(examples.identity_model(datatype), one)
        examples.write_model(examples.identity_model(datatype), str(two))
        assert one.read_bytes() == two.read_bytes()
        assert onnx.load(str(one)) == examples.identity_model(datatype)
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_rebuild_skips_identical_files_and_repairs_changed_ones(tmp_path):
    examples.build_repository(tmp_path, ["simple", "image"])
    simple, image = tmp_path / "simple" / "1" / "model.onnx", tmp_path / "image" / "1" / "model.onnx"
    before = simple.stat().st_mtime_ns
    image.write_bytes(b"stale")
    again = examples.build_repository(tmp_path, ["simple", "image"])
    assert [(b.name, b.written) for b in again] == [("simple", False), ("image", True)]
    assert simple.stat().st_mtime_ns == before
    assert image.read_bytes() == examples.model_bytes(examples.image_model())


def test_build_repository_subset_and_unknown_names(tmp_path):
    built = examples.build_repository(tmp_path, ["strings"])
    assert [(b.name, b.path) for b in built] == [("strings", tmp_path / "strings" / "1" / "model.onnx")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["strings"]
    with pytest.raises(ValueError, match="nope"):
        examples.build_repository(tmp_path, ["simple", "nope"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["strings"]  # nothing built on a bad request
    assert list(examples.EXAMPLES) == ["simple", "mlp", "mlp_large", "strings", "image", "simple_string",
                                       "simple_identity", "image_classifier",
                                       "sequence_accumulator", "simple_sequence", "simple_dyna_sequence",
                                       "tiny_decoder", "text_classifier"]
    assert examples.EXAMPLE_ENSEMBLES == ("image_pipeline", "text_pipeline")


@pytest.mark.parametrize("name", examples.EXAMPLE_ENSEMBLES)
def test_an_example_ensemble_gets_its_empty_version_folder(tmp_path, name):
    assert examples.build_repository(tmp_path, [name]) == []
    assert sorted(p.name for p in (tmp_path / name).iterdir()) == ["1"]
    assert not any((tmp_path / name / "1").iterdir())


def test_main_prints_one_line_per_model(tmp_path, capsys):
    assert examples.main([str(tmp_path), "--models", "simple,image"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("simple: wrote ") and lines[1].startswith("image: wrote ")
    assert examples.main([str(tmp_path), "--models", "image"]) == 0
    assert capsys.readouterr().out.startswith("image: up to date ")
    with pytest.raises(SystemExit) as e:
        examples.main([str(tmp_path), "--models", "simple,bogus"])
    assert e.value.code == 2


# --------------------------------------------------------------------------------------------- configs

@pytest.mark.parametrize("name, config_file, build", [
    ("simple", "config.pbtxt", examples.simple_model),
    ("mlp", "config.yaml", examples.mlp_model),
    ("mlp_large", "config.pbtxt", lambda: examples.mlp_model(1024, (8,), 1024)),  # same I/O, tiny hidden
    ("image", "config.pbtxt", examples.image_model),
])
def test_committed_configs_agree_with_the_models(tmp_path, name, config_file, build):
    model_dir = EXAMPLE_REPOSITORY / name
    assert sorted(p.name for p in model_dir.glob("config.*")) == [config_file]
    path = tmp_path / "model.onnx"
    examples.write_model(build(), path)
    sess = session(onnx.load(str(path)))
    msg = cfg.read_config_proto(model_dir)
    assert msg.name == name
    config = cfg.validate(msg, name)
    assert config.backend == "onnxruntime" and config.max_batch_size > 0
    assert config.dynamic_batching is not None
    for declared, actual in ((config.inputs, sess.get_inputs()), (config.outputs, sess.get_outputs())):
        assert [s.name for s in declared] == [a.name for a in actual]
        for spec, arg in zip(declared, actual, strict=True):
            assert arg.shape[0] == "batch" and tuple(arg.shape[1:]) == spec.dims
            assert arg.type == {"INT32": "tensor(int32)", "FP32": "tensor(float)"}[spec.datatype.value]


@pytest.mark.parametrize("name, dims", [("simple_string", (16,)), ("simple_identity", (-1,))])
def test_committed_configs_of_tritons_string_models_agree(tmp_path, name, dims):
    """Triton's names, BYTES I/O, max_batch_size 8 (server docs/examples/model_repository/<name>/)."""
    path = tmp_path / "model.onnx"
    examples.write_model(examples.EXAMPLES[name](), path)
    sess = session(onnx.load(str(path)))
    msg = cfg.read_config_proto(EXAMPLE_REPOSITORY / name)
    config = cfg.validate(msg, name)
    assert (config.name, config.platform, config.max_batch_size) == (name, "onnxruntime_onnx", 8)
    for declared, actual in ((config.inputs, sess.get_inputs()), (config.outputs, sess.get_outputs())):
        assert [s.name for s in declared] == [a.name for a in actual]
        for spec, arg in zip(declared, actual, strict=True):
            assert spec.datatype.value == "BYTES" and arg.type == "tensor(string)" and spec.dims == dims
            assert arg.shape[0] == "batch" and len(arg.shape) == 1 + len(dims)


def test_strings_has_no_config_file():
    assert not list((EXAMPLE_REPOSITORY / "strings").glob("config.*"))
    assert (EXAMPLE_REPOSITORY / "README.md").is_file()


def test_sequence_accumulator_sums_and_start_resets():
    sess = session(examples.EXAMPLES["sequence_accumulator"]())
    col = lambda *v: np.array(v, dtype=np.int32).reshape(-1, 1)  # noqa: E731
    feed = {"INPUT": col(3, 4), "START": col(0, 1), "ACC_IN": col(10, 10)}
    out, acc = sess.run(["OUTPUT", "ACC_OUT"], feed)
    assert out.ravel().tolist() == [13, 4] and acc.ravel().tolist() == [13, 4]


def test_simple_sequence_adds_start():
    sess = session(examples.EXAMPLES["simple_sequence"]())
    col = lambda *v: np.array(v, dtype=np.int32).reshape(-1, 1)  # noqa: E731
    (out,) = sess.run(["OUTPUT"], {"INPUT": col(0, 11, 100), "START": col(1, 0, 1)})
    assert out.ravel().tolist() == [1, 11, 101]


def test_simple_dyna_sequence_adds_start_and_the_correlation_id_on_end():
    sess = session(examples.EXAMPLES["simple_dyna_sequence"]())
    col = lambda *v, t=np.int32: np.array(v, dtype=t).reshape(-1, 1)  # noqa: E731
    feed = {"INPUT": col(0, 11, 1), "START": col(1, 0, 0), "END": col(0, 0, 1), "READY": col(1, 1, 1),
            "CORRID": col(1000, 1000, 1001, t=np.uint64)}
    (out,) = sess.run(["OUTPUT"], feed)
    assert out.ravel().tolist() == [1, 11, 1002]
