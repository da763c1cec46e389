"""A tiny decoder-only transformer as ONNX, in the form Hugging Face Optimum exports `decoder_with_past`.

Built with the onnx helper API from a seeded numpy RNG (no downloads, byte-for-byte reproducible), so the
generation engine has a real model to run in tests, benchmarks and `make serve`. Like the other example
builders (examples.py) it needs the `onnx` package; the server never imports it.

The interface is Optimum's (the names and layouts the engine's runner expects of any exported model):

    inputs   input_ids                  INT64 [batch, seq]
             attention_mask             INT64 [batch, past + seq]   1 = attend, 0 = padding
             position_ids               INT64 [batch, seq]
             past_key_values.{i}.key    FP32  [batch, heads, past, head_dim]   (and .value), i < layers
    outputs  logits                     FP32  [batch, seq, vocab]
             present.{i}.key            FP32  [batch, heads, past + seq, head_dim]   (and .value)

With `lora_rank` r > 0 the graph also takes, per layer, `lora_a.{i}` FP32 [batch, hidden, r] and
`lora_b.{i}` FP32 [batch, r, hidden]: the query projection becomes `x @ Wq + bq + (x @ A) @ B`, each row with
its own matrices (zeros: no adapter), so one batch can carry requests of different adapters.

`present` is `past` with this call's keys and values appended (a Concat along the sequence axis), which is
what a step-by-step loop feeds back as the next `past`. Attention is causal by slot: the query in slot
`past + j` sees key slots `<= past + j` whose mask is 1. The vocabulary is 256 bytes plus BOS and EOS
(engine/generate/core/tokenizer.py); the output head is scaled so logits spread widely (a std of about 4),
which keeps greedy argmaxes far from ties that float rounding could flip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Its chat template (chat_template.jinja beside its config, written by examples.build_repository): Jinja as a
# Hugging Face folder ships it, in the Zephyr-like form <|role|>\ntext\n, ending with <|assistant|>\n when the
# answer is to start. The byte tokenizer's BOS has no text, so the template writes none.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

OPSET = 17  # LayerNormalization arrived in opset 17
IR_VERSION = 8
PRODUCER = "hubserve.engine.examples"


@dataclass(frozen=True, slots=True)
class TinyDecoderShape:
    vocab_size: int = 258  # 256 bytes + BOS (256) + EOS (257)
    layers: int = 2
    heads: int = 4
    head_dim: int = 16
    ffn: int = 256
    max_positions: int = 512
    lora_rank: int = 0  # > 0: the graph takes LoRA matrices for each layer's query projection (module doc)
    shared_kv: bool = False  # True: attention by GroupQueryAttention over a shared past/present buffer

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


def decoder_weights(shape: TinyDecoderShape, seed: int = 17) -> dict[str, np.ndarray]:
    """Every initializer by name, FP32, drawn in a fixed order from `default_rng(seed)`."""
    rng = np.random.default_rng(seed)
    d = shape.hidden

    def normal(*dims: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * np.float32(scale)).astype(np.float32)

    w = {"tok_emb": normal(shape.vocab_size, d, scale=1.0),
         "pos_emb": normal(shape.max_positions, d, scale=0.5)}
    for i in range(shape.layers):
        for name in ("q", "k", "v", "o"):
            w[f"l{i}.w{name}"] = normal(d, d, scale=1 / math.sqrt(d))
            w[f"l{i}.b{name}"] = normal(d, scale=0.02)
        w[f"l{i}.w1"] = normal(d, shape.ffn, scale=1 / math.sqrt(d))
        w[f"l{i}.b1"] = normal(shape.ffn, scale=0.02)
        w[f"l{i}.w2"] = normal(shape.ffn, d, scale=1 / math.sqrt(shape.ffn))
        w[f"l{i}.b2"] = normal(d, scale=0.02)
        for norm in ("ln1", "ln2"):
            w[f"l{i}.{norm}.g"] = np.ones(d, np.float32)
            w[f"l{i}.{norm}.b"] = np.zeros(d, np.float32)
    w["lnf.g"], w["lnf.b"] = np.ones(d, np.float32), np.zeros(d, np.float32)
    w["lm_head"] = normal(d, shape.vocab_size, scale=4 / math.sqrt(d))
    return w


class _Graph:
    """Collects nodes and constants with generated names; each method returns its output's name."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.consts: list[onnx.TensorProto] = []
        self._n = 0

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def named(self, op_type: str, out: str, *inputs: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        self._n += 1
        name = f"{hint}_{self._n}"
        self.consts.append(numpy_helper.from_array(value, name))
        return name


def _attention_bias(g: _Graph) -> str:
    """[batch, 1, seq, past + seq] FP32: 0 where a query may attend a key slot, -1e9 where it may not."""
    past_len = g.op("Gather", g.op("Shape", "past_key_values.0.key"), g.const(np.array(2, np.int64)), axis=0)
    seq_len = g.op("Gather", g.op("Shape", "input_ids"), g.const(np.array(1, np.int64)), axis=0)
    total = g.op("Add", past_len, seq_len)
    one = g.const(np.array(1, np.int64))
    key_slots = g.op("Range", g.const(np.array(0, np.int64)), total, one)           # [t]
    query_slots = g.op("Range", past_len, total, one)                                 # [s]
    causal = g.op("LessOrEqual", g.op("Unsqueeze", key_slots, g.const(np.array([0], np.int64))),
                  g.op("Unsqueeze", query_slots, g.const(np.array([1], np.int64))))  # [s, t]
    mask = g.op("Unsqueeze", g.op("Cast", "attention_mask", to=TensorProto.BOOL),
                g.const(np.array([1, 2], np.int64)))                                 # [b, 1, 1, t]
    allowed = g.op("And", causal, mask)                                              # [b, 1, s, t]
    return g.op("Where", allowed, g.const(np.array(0.0, np.float32)), g.const(np.array(-1e9, np.float32)))


def _project(g: _Graph, shape: TinyDecoderShape, i: int, normed: str, name: str) -> str:
    """[b, s, d]: the layer's query, key or value projection (the query with its LoRA term, if any)."""
    y = g.op("Add", g.op("MatMul", normed, f"l{i}.w{name}"), f"l{i}.b{name}")
    if name == "q" and shape.lora_rank:  # + (normed @ A) @ B, per row: [b, s, d] [b, d, r] [b, r, d]
        y = g.op("Add", y, g.op("MatMul", g.op("MatMul", normed, f"lora_a.{i}"), f"lora_b.{i}"))
    return y


def _layer(g: _Graph, shape: TinyDecoderShape, i: int, x: str, bias: Any) -> str:
    """Pre-norm block: x + attention(ln1(x)), then + mlp(ln2(x)); writes present.{i}.key/value. `bias` is
    the dense attention's mask bias, or the shared-KV form's (seqlens_k, total_sequence_length)."""
    if shape.shared_kv:
        normed = g.op("LayerNormalization", x, f"l{i}.ln1.g", f"l{i}.ln1.b", axis=-1, epsilon=1e-5)
        context = _shared_attention(g, shape, i, normed, bias)
        return _mlp(g, shape, i, g.op("Add", x, g.op("Add", g.op("MatMul", context, f"l{i}.wo"), f"l{i}.bo")))
    d, h, hd = shape.hidden, shape.heads, shape.head_dim
    split_heads = g.const(np.array([0, 0, h, hd], np.int64))
    merge_heads = g.const(np.array([0, 0, d], np.int64))
    normed = g.op("LayerNormalization", x, f"l{i}.ln1.g", f"l{i}.ln1.b", axis=-1, epsilon=1e-5)

    def project(name: str) -> str:  # [b, s, d] -> [b, h, s, hd]
        return g.op("Transpose", g.op("Reshape", _project(g, shape, i, normed, name), split_heads),
                    perm=[0, 2, 1, 3])

    q, k, v = project("q"), project("k"), project("v")
    keys = g.named("Concat", f"present.{i}.key", f"past_key_values.{i}.key", k, axis=2)
    values = g.named("Concat", f"present.{i}.value", f"past_key_values.{i}.value", v, axis=2)
    scores = g.op("Mul", g.op("MatMul", q, g.op("Transpose", keys, perm=[0, 1, 3, 2])),
                  g.const(np.array(1 / math.sqrt(hd), np.float32)))
    probs = g.op("Softmax", g.op("Add", scores, bias), axis=-1)
    heads_first = g.op("MatMul", probs, values)  # [b, h, s, hd]
    context = g.op("Reshape", g.op("Transpose", heads_first, perm=[0, 2, 1, 3]), merge_heads)
    return _mlp(g, shape, i, g.op("Add", x, g.op("Add", g.op("MatMul", context, f"l{i}.wo"), f"l{i}.bo")))


def _mlp(g: _Graph, shape: TinyDecoderShape, i: int, x: str) -> str:
    normed2 = g.op("LayerNormalization", x, f"l{i}.ln2.g", f"l{i}.ln2.b", axis=-1, epsilon=1e-5)
    hidden = g.op("Relu", g.op("Add", g.op("MatMul", normed2, f"l{i}.w1"), f"l{i}.b1"))
    return g.op("Add", x, g.op("Add", g.op("MatMul", hidden, f"l{i}.w2"), f"l{i}.b2"))


def _shared_lengths(g: _Graph) -> tuple[str, str]:
    """GroupQueryAttention's `seqlens_k` (each row's past + new tokens, minus one: INT32 [batch]) and
    `total_sequence_length` (INT32 scalar), from `attention_mask` [batch, total]: the rows' counts of ones."""
    ones = g.op("ReduceSum", "attention_mask", g.const(np.array([1], np.int64)), keepdims=0)
    seqlens = g.op("Cast", g.op("Sub", ones, g.const(np.array(1, np.int64))), to=TensorProto.INT32)
    total = g.op("Cast", g.op("Gather", g.op("Shape", "attention_mask"), g.const(np.array(1, np.int64)),
                              axis=0), to=TensorProto.INT32)
    return seqlens, total


def _shared_attention(g: _Graph, shape: TinyDecoderShape, i: int, normed: str,
                      lengths: tuple[str, str]) -> str:
    """Attention by ONNX Runtime's GroupQueryAttention (com.microsoft): it writes this call's keys and values
    into the past buffer at each row's own length and attends each row over its own length only, so rows of
    different lengths pay for no padding, and bound to the same buffer as `present` it copies no past."""
    seqlens, total = lengths
    out = f"attention_{i}"
    q, k, v = (_project(g, shape, i, normed, name) for name in ("q", "k", "v"))
    g.nodes.append(helper.make_node(
        "GroupQueryAttention",
        [q, k, v, f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens, total],
        [out, f"present.{i}.key", f"present.{i}.value"], name=out, domain="com.microsoft",
        num_heads=shape.heads, kv_num_heads=shape.heads, scale=1 / math.sqrt(shape.head_dim)))
    return out


def tiny_decoder_model(shape: TinyDecoderShape | None = None, seed: int = 17) -> onnx.ModelProto:
    """The decoder as an ONNX model (see the module docstring for its interface)."""
    shape = shape or TinyDecoderShape()
    return decoder_from_weights(shape, decoder_weights(shape, seed))


def decoder_from_weights(shape: TinyDecoderShape, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The decoder with the given initializers (`decoder_weights`' names, for `shape.layers` layers): for
    models derived from another's weights, such as draft_pair.py's."""
    g = _Graph()
    bias: Any = _shared_lengths(g) if shape.shared_kv else _attention_bias(g)
    x = g.op("Add", g.op("Gather", "tok_emb", "input_ids", axis=0),
             g.op("Gather", "pos_emb", "position_ids", axis=0))
    for i in range(shape.layers):
        x = _layer(g, shape, i, x, bias)
    x = g.op("LayerNormalization", x, "lnf.g", "lnf.b", axis=-1, epsilon=1e-5)
    g.named("MatMul", "logits", x, "lm_head")

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    kv_in: list[str | int | None] = ["batch", shape.heads, "past_sequence_length", shape.head_dim]
    kv_out: list[str | int | None] = ["batch", shape.heads,
                                      "past_sequence_length" if shape.shared_kv else "total_sequence_length",
                                      shape.head_dim]
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", i64, ["batch", "total_sequence_length"]),
        helper.make_tensor_value_info("position_ids", i64, ["batch", "sequence_length"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch", "sequence_length", shape.vocab_size])]
    for i in range(shape.layers):
        for part in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{part}", f32, kv_in))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{part}", f32, kv_out))
    d, r = shape.hidden, shape.lora_rank
    for i in range(shape.layers if r else 0):
        inputs.append(helper.make_tensor_value_info(f"lora_a.{i}", f32, ["batch", d, r]))
        inputs.append(helper.make_tensor_value_info(f"lora_b.{i}", f32, ["batch", r, d]))
    initializers = [numpy_helper.from_array(value, name) for name, value in weights.items()]
    graph = helper.make_graph(g.nodes, "tiny_decoder", inputs, outputs, initializer=initializers + g.consts)
    opsets = [helper.make_opsetid("", OPSET)]
    if shape.shared_kv:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name=PRODUCER)
    onnx.checker.check_model(model)
    return model
