"""Property tests (hypothesis) of everything that parses what a client or a peer sends, in-process, no server:

* engine/frontend/http/codec.py — any body and Inference-Header-Content-Length → a request or INVALID_ARG;
  encode → decode round trips of every datatype, JSON and binary;
* engine/frontend/grpc/codec.py — arbitrary bytes and mutated valid ModelInferRequests → a request,
  EngineError, or protobuf's DecodeError (which the gRPC frontend answers as INTERNAL "could not parse");
  the wire fast path agrees with the full decode on everything it accepts;
* engine/frontend/h2/core.py — arbitrary bytes and random frame sequences, in random chunkings, into a
  server core → frames handled, or the connection closed with a GOAWAY; nothing escapes `receive`;
* engine/config/steps.py — arbitrary and grammar-built pbtxt, YAML and JSON → a ModelConfig or EngineError;
* engine/ipc/frames.py — any split and any mutation of a frame stream → the frames back, or FrameError.
* engine/backends/python/messages.py — any mutation of an instance's frame metadata → an envelope of the
  instance's messages with fields of their types, or FrameError.

Deterministic (`derandomize=True`, no example database) and bounded: each test runs a modest number of
examples, so the whole file takes a few seconds. Every example counts towards "fuzz: N cases tried" at the
end of the run. The helpers of the example-based tests are reused (test_codecs.py, test_h2_core.py).
"""

from __future__ import annotations

import json
import math
import string
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from case_counts import tried
from engine.backends.python import messages as py_messages
from engine.config import steps as cfg
from engine.errors import EngineError, ErrorCode
from engine.frontend.grpc import codec as grpc_codec
from engine.frontend.h2.streams import Limits, Role
from engine.frontend.http import codec as http_codec
from engine.ipc.frames import HEAD, FrameError
from engine.proto import grpc_service_pb2 as gpb
from engine.proto import model_config_pb2 as pb
from engine.types import DataType, InferenceRequest, RequestedOutput, Tensor, element_count
from h2_client import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)
from test_codecs import (
    expected_grpc_response,
    grpc_input,
    raw_request,
    request,
    response,
    same_request,
    split_response,
)
from test_h2_core import Peer, answer_at_once, parse, request_block
from test_ipc import frame_reader, ipc_frame

FUZZ = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])
FEW = settings(FUZZ, max_examples=40)


def invalid_or(fn: Any, *also: type[BaseException]) -> Any:
    """fn()'s result, or None when it raised EngineError(INVALID_ARG) or one of `also`; anything else
    propagates and fails the example."""
    try:
        return fn()
    except EngineError as e:
        assert e.code is ErrorCode.INVALID_ARG, e
        assert e.message, "an error must say what is wrong"
    except also:
        pass
    return None


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` split at the positions `cuts` (any, taken modulo its length)."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


# ------------------------------------------------------------------------------------ http_codec: decode

JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=False), st.text(max_size=8))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
DATATYPE_NAMES = st.sampled_from([dt.value for dt in DataType] + ["FP8", "", "int32"])
SHAPES = st.lists(st.integers(-2, 6), max_size=4) | st.just([2**40, 2**40]) | JSON_VALUES


@st.composite
def http_inputs(draw: st.DrawFn) -> dict[str, Any]:
    """An input object near a valid one: each field present or not, of the right type or not."""
    item: dict[str, Any] = {}
    if draw(st.booleans()):
        item["name"] = draw(st.text(max_size=4) | JSON_SCALARS)
    if draw(st.booleans()):
        item["datatype"] = draw(DATATYPE_NAMES | JSON_SCALARS)
    if draw(st.booleans()):
        item["shape"] = draw(SHAPES)
    if draw(st.booleans()):
        item["data"] = draw(JSON_VALUES)
    if draw(st.booleans()):
        item["parameters"] = draw(st.fixed_dictionaries(
            {}, optional={"binary_data_size": st.integers(-4, 64) | JSON_SCALARS}) | JSON_VALUES)
    return item


@st.composite
def http_bodies(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """A body whose JSON part is a near-valid request document, with binary data after it or not, and a
    header length that is right, wrong or nonsense."""
    doc: dict[str, Any] = {"inputs": draw(st.lists(http_inputs(), max_size=3) | JSON_VALUES)}
    for key, values in (("outputs", st.lists(st.fixed_dictionaries(
            {"name": st.text(max_size=3) | JSON_SCALARS},
            optional={"parameters": JSON_VALUES}), max_size=2) | JSON_VALUES),
                        ("parameters", JSON_VALUES), ("id", JSON_SCALARS)):
        if draw(st.booleans()):
            doc[key] = draw(values)
    header = json.dumps(doc).encode()
    binary = draw(st.binary(max_size=64))
    header_length = draw(st.sampled_from(["right", "none", "other"]))
    if header_length == "right":
        return header + binary, str(len(header))
    if header_length == "none":
        return header, None
    return header + binary, draw(st.text(string.digits + "-+ x", max_size=4))


@FUZZ
@given(st.binary(max_size=256), st.none() | st.text(string.digits + "-", max_size=4))
def test_http_decode_of_any_bytes_is_a_request_or_invalid_arg(body: bytes, header_length: str | None) -> None:
    tried("fuzz")
    invalid_or(lambda: http_codec.decode_request("m", "1", body, header_length))


@FUZZ
@given(http_bodies())
def test_http_decode_of_near_valid_documents_is_a_request_or_invalid_arg(body: tuple[bytes, str | None]
                                                                         ) -> None:
    tried("fuzz")
    cache = http_codec.HeaderCache()
    first = invalid_or(lambda: http_codec.decode_request("m", "1", body[0], body[1], cache))
    again = invalid_or(lambda: http_codec.decode_request("m", "1", body[0], body[1], cache))
    assert (first is None) == (again is None), "a cached header must decide as the first decode did"
    if first is not None:
        assert isinstance(first, InferenceRequest) and first.inputs
        same_request(first, again)


def arrays(datatype: DataType, json_safe: bool) -> st.SearchStrategy[np.ndarray]:
    """Arrays of `datatype`, any bits for fixed-size types (NaN, Inf and denormals included) unless
    `json_safe` (JSON has no NaN or Inf); BYTES of any bytes, empty elements included, unless `json_safe`
    (JSON carries text: bytes that are not UTF-8 are replaced, as test_codecs.py checks)."""
    shapes = st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple)

    @st.composite
    def build(draw: st.DrawFn) -> np.ndarray:
        shape = draw(shapes)
        n = element_count(shape)
        if datatype is DataType.BYTES:
            out = np.empty(n, dtype=object)
            items = st.text(max_size=4).map(str.encode) if json_safe else st.binary(max_size=6)
            out[:] = draw(st.lists(items, min_size=n, max_size=n))
            return out.reshape(shape)
        dtype = datatype.numpy_dtype
        raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
        arr = np.frombuffer(raw, dtype=dtype).copy()
        if datatype is DataType.BOOL:
            arr = np.frombuffer(raw, dtype=np.uint8).astype(bool)
        if json_safe and datatype in (DataType.FP16, DataType.FP32, DataType.FP64, DataType.BF16):
            if datatype is DataType.BF16:
                bits = arr.astype(np.uint32) << 16
                arr = np.where(np.isfinite(bits.view(np.float32)), arr, 0).astype(dtype)
            else:
                arr = np.where(np.isfinite(arr), arr, 0).astype(dtype)
        return arr.reshape(shape)

    return build()


@FUZZ
@given(st.sampled_from(list(DataType)), st.data())
def test_http_encode_then_decode_round_trips_every_datatype(datatype: DataType, data: st.DataObject) -> None:
    """A response is laid out like a request (test_codecs.py's round trip): its outputs, fed back as
    inputs, decode to the same tensors, in binary and, for values JSON can hold, in JSON."""
    tried("fuzz")
    binary = data.draw(st.booleans(), "binary")
    arr = data.draw(arrays(datatype, json_safe=not binary), "array")
    out = Tensor("OUT", datatype, arr.shape, arr)
    body, header_length = http_codec.encode_response(response(out), request(
        [RequestedOutput("OUT", binary_data=binary)]))
    doc, tail = split_response(body, header_length)
    header = json.dumps({"inputs": doc["outputs"]}).encode()
    (back,) = http_codec.decode_request("m", "1", header + tail, str(len(header)) if tail else None).inputs
    assert (back.name, back.datatype, back.shape) == ("OUT", datatype, arr.shape)
    if datatype is DataType.BYTES:
        assert back.data.tolist() == arr.tolist()
    else:
        assert back.data.tobytes() == np.ascontiguousarray(arr).tobytes(), (arr, back.data)


# ------------------------------------------------------------------------------------ grpc_codec

def valid_messages() -> list[bytes]:
    """Serialized requests the codec accepts: raw contents (the fast path), typed contents, parameters."""
    typed = gpb.ModelInferRequest(model_name="m", id="t")
    grpc_input(typed, "IN", "INT32", [2]).contents.int_contents.extend([1, 2])
    grpc_input(typed, "S", "BYTES", [1]).contents.bytes_contents.append(b"x")
    return [raw_request(np.arange(4, dtype=np.int32).reshape(1, 4), "r1").SerializeToString(),
            raw_request(np.zeros((2, 4), dtype=np.int32), big=True).SerializeToString(),
            typed.SerializeToString()]


VALID = valid_messages()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid message with bytes flipped, inserted, deleted, or cut short."""
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if op == "flip" and pos < len(data):
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del data[pos:pos + draw(st.integers(1, 4))]
        elif op == "truncate":
            del data[pos:]
    return bytes(data)


def decode_wire(codec: grpc_codec.InferWireCodec, message: bytes) -> InferenceRequest | None:
    return invalid_or(lambda: codec.decode(message), DecodeError)


@FUZZ
@given(st.binary(max_size=200) | mutated())
def test_grpc_decode_of_any_bytes_is_a_request_engine_error_or_decode_error(message: bytes) -> None:
    """The wire codec (what ModelInfer and ModelStreamInfer call) and the full decode behind it: each
    message twice through one codec, so a plan cached by the first is used by the second, and the answer
    must be what the full decode gives."""
    tried("fuzz")
    codec = grpc_codec.InferWireCodec()
    for _ in range(2):
        got = decode_wire(codec, message)
        try:
            full = grpc_codec.decode_request(gpb.ModelInferRequest.FromString(message))
        except (EngineError, DecodeError):
            full = None
        assert (got is None) == (full is None)
        if got is not None and full is not None:
            same_request(got, full)


@FUZZ
@given(mutated(), st.sampled_from(VALID))
def test_grpc_a_cached_plan_never_accepts_what_the_full_decode_refuses(message: bytes, warm: bytes) -> None:
    """A codec warmed with a valid request, then given a mutation of one: the fast path may only answer
    what a full decode of the same bytes would."""
    tried("fuzz")
    codec = grpc_codec.InferWireCodec()
    codec.decode(warm)
    got = decode_wire(codec, message)
    full = invalid_or(lambda: grpc_codec.decode_request(gpb.ModelInferRequest.FromString(message)),
                      DecodeError)
    assert (got is None) == (full is None)
    if got is not None:
        same_request(got, full)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(list(DataType)), st.data()), min_size=1, max_size=3),
       st.text(max_size=8))
def test_grpc_wire_encode_of_every_datatype_parses_as_protobuf_builds_it(outputs: list[Any], rid: str
                                                                         ) -> None:
    """The hand-written response bytes (test_codecs.py's check, over random outputs of every datatype),
    built, then from the cached head; and the raw contents decode back to the same tensors."""
    tried("fuzz")
    tensors = [Tensor(f"O{i}", dt, (arr := data.draw(arrays(dt, json_safe=False))).shape, arr)
               for i, (dt, data) in enumerate(outputs)]
    resp = response(*tensors, id=rid)
    codec = grpc_codec.InferWireCodec()
    for _ in range(2):
        parts, size = codec.encode(resp)
        body = b"".join(bytes(p) for p in parts)
        assert len(body) == size
        parsed = gpb.ModelInferResponse.FromString(body)
        assert parsed == expected_grpc_response(resp)
    back = gpb.ModelInferRequest(model_name="m", raw_input_contents=parsed.raw_output_contents)
    for t in tensors:
        grpc_input(back, t.name, t.datatype.value, list(t.shape))
    for before, after in zip(tensors, grpc_codec.decode_request(back).inputs, strict=True):
        assert (after.name, after.datatype, after.shape) == (before.name, before.datatype, before.shape)
        if before.datatype is DataType.BYTES:
            assert after.data.tolist() == before.data.tolist()
        else:
            assert after.data.tobytes() == before.data.tobytes()


# ------------------------------------------------------------------------------------ HTTP/2 core

FRAME_KINDS = st.sampled_from([DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, 5, PING, GOAWAY, WINDOW_UPDATE,
                               CONTINUATION, 10, 255])
FLAGS = st.sampled_from([0, END_STREAM, END_HEADERS, END_HEADERS | END_STREAM, PADDED, ACK, 0x20, 0xFF])
STREAM_IDS = st.sampled_from([0, 1, 3, 5, 2, 0x7FFFFFFF, 0x80000001])


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """One frame of any type, flags and stream, its payload random or a real request block."""
    kind = draw(FRAME_KINDS)
    payload = draw(st.binary(max_size=24))
    if kind in (HEADERS, CONTINUATION) and draw(st.booleans()):
        payload = request_block()
    if kind in (WINDOW_UPDATE, RST_STREAM) and draw(st.booleans()):
        payload = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "big")
    if kind == SETTINGS and draw(st.booleans()):
        payload = b"".join(draw(st.integers(0, 8)).to_bytes(2, "big") + draw(st.integers(0, 2**32 - 1))
                           .to_bytes(4, "big") for _ in range(draw(st.integers(0, 3))))
    return frame(kind, draw(FLAGS), draw(STREAM_IDS), payload)


def streams_of_frames() -> st.SearchStrategy[bytes]:
    """What a client sends: the preface and SETTINGS (or not), then frames, random bytes mixed in."""
    start = st.sampled_from([PREFACE + frame(SETTINGS, 0, 0), PREFACE, b""])
    body = st.lists(frames() | st.binary(min_size=1, max_size=12), max_size=12).map(b"".join)
    return st.tuples(start, body).map(lambda t: t[0] + t[1])


def check_core(peer: Peer, chunks: list[bytes]) -> None:
    """Feed `chunks` in turn; nothing may escape `receive`, and what the core wrote must be whole frames
    ending, if the connection failed, in a GOAWAY (a bad preface may just abort; after the client's own
    GOAWAY the connection just closes)."""
    for chunk in chunks:
        peer.core.receive(chunk)
        written = parse(peer.out())
        if peer.core.closed:
            assert peer.closed is not None
            peer_left = any(event[0] == "goaway" for event in peer.events)  # then we just close
            if written and not peer.closed[0] and not peer_left:
                assert written[-1][0] == GOAWAY, written
            return
        for stream in list(peer.streams.values()):  # answer what arrived, so sends are exercised too
            if stream.id in peer.handlers and peer.handlers[stream.id].ended and not peer.core.closed:
                answer_at_once(peer, stream, None)
                peer.streams.pop(stream.id)


@FUZZ
@given(streams_of_frames(), st.lists(st.integers(0, 2**16), max_size=6), st.booleans())
def test_h2_server_core_survives_any_frames_in_any_chunking(data: bytes, cuts: list[int], small: bool
                                                            ) -> None:
    tried("fuzz")
    limits = Limits(max_concurrent_streams=2, max_resets_per_window=4) if small else Limits()
    peer = Peer(Role.SERVER, limits)
    peer.core.initiate()
    peer.out()
    check_core(peer, chunked(PREFACE + frame(SETTINGS, 0, 0) + data if not data.startswith(PREFACE)
                             else data, cuts))


@FUZZ
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=5))
def test_h2_server_core_survives_random_bytes(data: bytes, cuts: list[int]) -> None:
    tried("fuzz")
    for prefix in (b"", PREFACE + frame(SETTINGS, 0, 0)):
        peer = Peer(Role.SERVER)
        peer.core.initiate()
        peer.out()
        check_core(peer, chunked(prefix + data, cuts))


@FEW
@given(st.lists(st.integers(0, 2**12), max_size=8))
def test_h2_a_valid_request_is_handled_in_any_chunking(cuts: list[int]) -> None:
    """The same bytes cut anywhere: the request reaches the app whole, and is answered."""
    tried("fuzz")
    peer = Peer(Role.SERVER, answer=None)
    peer.core.initiate()
    peer.out()
    data = (PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, ACK, 0)
            + frame(HEADERS, END_HEADERS, 1, request_block()) + frame(DATA, 0, 1, b"abc")
            + frame(PING, 0, 0, b"12345678") + frame(DATA, END_STREAM, 1, b"def"))
    for chunk in chunked(data, cuts):
        peer.core.receive(chunk)
    assert not peer.core.closed
    assert peer.handlers[1].data == b"abcdef" and peer.handlers[1].ended
    answer_at_once(peer, peer.streams[1], None)
    kinds = [kind for kind, _, _, _ in parse(peer.out())]
    assert HEADERS in kinds


@FEW
@given(st.lists(st.integers(0, 2**17), max_size=8))
def test_h2_full_size_frames_cut_anywhere_arrive_whole(cuts: list[int]) -> None:
    """Reads that end inside a 16 KB frame, header or preface, then carry several more frames: each frame
    is completed from the buffer and the rest read in place (core.py `receive`), and every byte arrives in
    order."""
    tried("fuzz")
    peer = Peer(Role.SERVER, answer=None)
    peer.core.initiate()
    peer.out()
    body = bytes(range(256)) * 256  # 64 KB, every frame's bytes different
    parts = [body[i:i + 16384] for i in range(0, len(body), 16384)]
    data = (PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, request_block())
            + b"".join(frame(DATA, 0, 1, part) for part in parts[:-1]) + frame(PING, 0, 0, b"12345678")
            + frame(DATA, END_STREAM, 1, parts[-1]))
    for chunk in chunked(data, cuts):
        peer.core.receive(chunk)
    assert not peer.core.closed
    assert peer.handlers[1].data == body and peer.handlers[1].ended


# ------------------------------------------------------------------------------------ config parser

FIELD_NAMES = [f.name for f in pb.ModelConfig.DESCRIPTOR.fields]
PB_VALUES = st.one_of(st.integers(-2**64, 2**64).map(str), st.text(max_size=6).map(json.dumps),
                      st.sampled_from(["true", "false", "TYPE_FP32", "TYPE_STRING", "KIND_GPU", "1.5", "-1",
                                       "[ -1, 4 ]", "[ ]", "{ }", "{ name: \"x\" }"]))


@st.composite
def pbtxt(draw: st.DrawFn) -> str:
    """config.pbtxt-like text: real field names with values of any kind, tensors with near-valid fields,
    some blocks left unbalanced or garbled."""
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        name = draw(st.sampled_from(FIELD_NAMES + ["input", "output", "nonsense"]))
        if name in ("input", "output") and draw(st.booleans()):
            fields = {"name": json.dumps(draw(st.text(string.ascii_letters, max_size=4))),
                      "data_type": draw(st.sampled_from(["TYPE_FP32", "TYPE_STRING", "TYPE_INVALID", "7"])),
                      "dims": draw(st.lists(st.integers(-3, 2**63), max_size=3).map(str))}
            chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True))
            lines.append(f"{name} [ {{ {' '.join(f'{k}: {fields[k]}' for k in chosen)} }} ]")
        else:
            lines.append(f"{name}: {draw(PB_VALUES)}")
    text = "\n".join(lines)
    if draw(st.booleans()):
        text += draw(st.text(max_size=6))
    return text


def to_config(parse: Any) -> None:
    """Every loading step a config takes without a model file; each must refuse with EngineError."""
    msg = pb.ModelConfig()
    parse(msg)
    cfg.autocomplete(msg, None, "m")
    cfg.validate(msg, "model 'm'")


@FUZZ
@given(pbtxt() | st.text(max_size=80))
def test_config_pbtxt_of_any_text_is_a_config_or_invalid_arg(text: str) -> None:
    tried("fuzz")
    invalid_or(lambda: to_config(lambda msg: cfg.parse_pbtxt(text, msg)))


CONFIG_DICTS = st.dictionaries(st.sampled_from(FIELD_NAMES + ["nonsense"]), JSON_VALUES, max_size=5)


@FUZZ
@given(CONFIG_DICTS | JSON_VALUES, st.booleans())
def test_config_yaml_and_json_of_any_value_is_a_config_or_invalid_arg(doc: Any, as_yaml: bool) -> None:
    """YAML text (config.yaml), and the JSON object of a load request's `config` override (parse_dict)."""
    tried("fuzz")
    if as_yaml:
        text = json.dumps(doc)  # JSON is YAML
        invalid_or(lambda: to_config(lambda msg: cfg.parse_yaml(text, msg)))
    elif isinstance(doc, dict):
        invalid_or(lambda: to_config(lambda msg: cfg.parse_dict(doc, msg, "override")))


@FUZZ
@given(st.text(max_size=80))
def test_config_yaml_of_any_text_is_a_config_or_invalid_arg(text: str) -> None:
    tried("fuzz")
    invalid_or(lambda: to_config(lambda msg: cfg.parse_yaml(text, msg)))


# ------------------------------------------------------------------------------------ ipc frames

# What untyped MessagePack carries (test_ipc.py's codec): 64-bit integers, lists (a tuple comes back a list)
PLAIN = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                               st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=8)),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=10)


@st.composite
def frame_streams(draw: st.DrawFn) -> tuple[list[tuple[Any, bytes]], bytes]:
    sent = draw(st.lists(st.tuples(PLAIN, st.binary(max_size=40)), min_size=1, max_size=4))
    return sent, b"".join(bytes(part) for meta, inline in sent for part in ipc_frame(meta, [inline]))


def meta_equal(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


@FUZZ
@given(frame_streams(), st.lists(st.integers(0, 2**12), max_size=6))
def test_ipc_frames_come_back_from_any_split(stream: tuple[list[tuple[Any, bytes]], bytes], cuts: list[int]
                                             ) -> None:
    tried("fuzz")
    sent, data = stream
    reader = frame_reader()
    got = [(meta, bytes(inline)) for chunk in chunked(data, cuts) for meta, inline in reader.feed(chunk)]
    assert len(got) == len(sent)
    for (meta, inline), (meta_back, inline_back) in zip(sent, got, strict=True):
        assert inline_back == inline and meta_equal(meta, meta_back)


@FUZZ
@given(frame_streams(), st.data())
def test_ipc_a_mutated_frame_stream_gives_frames_or_frame_error(stream: tuple[list[tuple[Any, bytes]], bytes],
                                                                data: st.DataObject) -> None:
    """Bytes of the stream changed (the heads' lengths kept small: a head may declare up to 4 GiB, which
    the reader allocates at once; see the report) → frames, or FrameError."""
    tried("fuzz")
    sent, raw = stream
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    pos = 0
    while pos + HEAD.size <= len(buf):  # clamp each head to what remains, as a sane peer's would be
        size, meta_size = HEAD.unpack_from(buf, pos)
        size = min(size, len(buf) - pos - HEAD.size + data.draw(st.integers(0, 8)))
        HEAD.pack_into(buf, pos, size, meta_size)
        pos += HEAD.size + size
    reader = frame_reader()
    try:
        for chunk in chunked(bytes(buf), data.draw(st.lists(st.integers(0, 4096), max_size=4))):
            for _, inline in reader.feed(chunk):
                assert isinstance(inline, memoryview)
    except FrameError:
        pass


# ------------------------------------------------------------------------------------ python channel

PY_MESSAGES = [
    py_messages.Result(3, None, [py_messages.Ok(2, '{"a":1}'), py_messages.Error("INTERNAL", "failed")]),
    py_messages.Result(4, "ValueError: no", []),
    py_messages.Resp(7, False, py_messages.Ok(1, "{}")), py_messages.Resp(7, True, None),
    py_messages.Bls(1, "add_sub", -1, "id", "corr", 3, 500, "{}", ["OUTPUT0"]),
    py_messages.Ready(), py_messages.InitFailed("ImportError: x"), py_messages.Pong(12), py_messages.Bye(""),
]
TO_ENGINE = (py_messages.Ready, py_messages.InitFailed, py_messages.Result, py_messages.Resp, py_messages.Bls,
             py_messages.Pong, py_messages.Bye)
PY_DECODE = py_messages.decoder(py_messages.ToEngineFrame)


@FUZZ
@given(st.sampled_from(PY_MESSAGES), st.data())
def test_python_channel_a_mutated_envelope_is_one_of_its_messages_or_frame_error(message: Any,
                                                                                 data: st.DataObject) -> None:
    """What an instance process sends the engine, bytes changed: an envelope whose every field has its
    declared type, or FrameError (channel.py closes the channel); never another exception."""
    tried("fuzz")
    headers = (py_messages.TensorHeader("OUTPUT0", "INT32", (1, 16)),)
    raw = bytearray(py_messages.encode_envelope(py_messages.ToEngineFrame(message, headers, (-1, ((0, 64),)),
                                                                          [128])))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        frame = PY_DECODE(memoryview(bytes(raw)))
    except FrameError:
        return
    assert isinstance(frame, py_messages.ToEngineFrame) and isinstance(frame.message, TO_ENGINE)
    assert all(isinstance(t.name, str) and all(isinstance(d, int) for d in t.shape) for t in frame.tensors)
    assert all(isinstance(offset, int) for offset in frame.freed)
