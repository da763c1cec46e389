"""A tiny BERT-like encoder for the /v1/embeddings suites, built here with onnx's helper API (no torch): word,
position and token-type embeddings, a LayerNorm, one single-head self-attention layer that masks padded keys
(as BERT's extended attention mask does) with a residual and a second LayerNorm; output `last_hidden_state`
[batch, seq, HIDDEN]. Beside it, sentence-transformers' folder layout: a WordPiece tokenizer.json made with
`tokenizers`, modules.json, 1_Pooling/config.json, 2_Normalize/ (when normalized), sentence_bert_config.json
(the context) and a Hugging Face config.json listing `matryoshka_dimensions`.

`reference` computes the same network in numpy, one input at a time with no padding, and pools it as
sentence-transformers does: what the server must answer, whatever batch and padding it ran.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

HIDDEN = 32
POSITIONS = 64
MAX_SEQ_LENGTH = 40  # sentence_bert_config.json's context, under POSITIONS
MATRYOSHKA = (8, 16)
WORDS = ("the", "cat", "dog", "sat", "on", "mat", "white", "rabbit", "follow", "hello", "world", "embed",
         "me", "quick", "brown", "fox")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def vocabulary() -> dict[str, int]:
    tokens = [*SPECIALS, *WORDS, *LETTERS, *(f"##{c}" for c in LETTERS), ".", ",", "!", "?"]
    return {t: i for i, t in enumerate(tokens)}


def tokenizer() -> Tokenizer:
    vocab = vocabulary()
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return tok


@dataclass(frozen=True)
class Weights:
    word: np.ndarray
    position: np.ndarray
    token_type: np.ndarray
    ln1: tuple[np.ndarray, np.ndarray]
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    ln2: tuple[np.ndarray, np.ndarray]


def weights(seed: int = 7) -> Weights:
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 0.5) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    n = len(vocabulary())
    return Weights(w(n, HIDDEN), w(POSITIONS, HIDDEN), w(2, HIDDEN),
                   (1 + w(HIDDEN, scale=0.1), w(HIDDEN, scale=0.1)),
                   w(HIDDEN, HIDDEN, scale=0.3), w(HIDDEN, HIDDEN, scale=0.3), w(HIDDEN, HIDDEN, scale=0.3),
                   w(HIDDEN, HIDDEN, scale=0.3), (1 + w(HIDDEN, scale=0.1), w(HIDDEN, scale=0.1)))


def graph(wt: Weights) -> onnx.ModelProto:
    init = [numpy_helper.from_array(a, name) for name, a in (
        ("word", wt.word), ("position", wt.position), ("token_type", wt.token_type),
        ("ln1_g", wt.ln1[0]), ("ln1_b", wt.ln1[1]), ("wq", wt.q), ("wk", wt.k), ("wv", wt.v), ("wo", wt.o),
        ("ln2_g", wt.ln2[0]), ("ln2_b", wt.ln2[1]),
        ("zero", np.array(0, np.int64)), ("one", np.array(1, np.int64)), ("axis1", np.array([1], np.int64)),
        ("scale", np.array(1 / np.sqrt(HIDDEN), np.float32)), ("onef", np.array(1.0, np.float32)),
        ("neg", np.array(-10000.0, np.float32)))]
    node = helper.make_node
    nodes = [
        node("Gather", ["word", "input_ids"], ["we"]),
        node("Shape", ["input_ids"], ["shape"]),
        node("Gather", ["shape", "one"], ["seq"]),
        node("Range", ["zero", "seq", "one"], ["positions"]),
        node("Gather", ["position", "positions"], ["pe"]),
        node("Gather", ["token_type", "token_type_ids"], ["te"]),
        node("Add", ["we", "pe"], ["e1"]),
        node("Add", ["e1", "te"], ["e2"]),
        node("LayerNormalization", ["e2", "ln1_g", "ln1_b"], ["x"], axis=-1, epsilon=1e-12),
        node("MatMul", ["x", "wq"], ["q"]),
        node("MatMul", ["x", "wk"], ["k"]),
        node("MatMul", ["x", "wv"], ["v"]),
        node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        node("MatMul", ["q", "kt"], ["s0"]),
        node("Mul", ["s0", "scale"], ["s1"]),
        node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
        node("Unsqueeze", ["mf", "axis1"], ["m3"]),
        node("Sub", ["onef", "m3"], ["inv"]),
        node("Mul", ["inv", "neg"], ["bias"]),
        node("Add", ["s1", "bias"], ["s2"]),
        node("Softmax", ["s2"], ["p"], axis=-1),
        node("MatMul", ["p", "v"], ["ctx"]),
        node("MatMul", ["ctx", "wo"], ["attn"]),
        node("Add", ["attn", "x"], ["r"]),
        node("LayerNormalization", ["r", "ln2_g", "ln2_b"], ["last_hidden_state"], axis=-1, epsilon=1e-12),
    ]
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
           for n in ("input_ids", "attention_mask", "token_type_ids")]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", HIDDEN])
    g = helper.make_graph(nodes, "tiny_encoder", ids, [out], init)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def config_pbtxt(name: str, max_batch_size: int, delay_us: int) -> str:
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "token_type_ids" data_type: TYPE_INT64 dims: [ -1 ] }}
]
output [ {{ name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, {HIDDEN} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
parameters {{ key: "embedding" value {{ string_value: "true" }} }}
"""


def write_model(root: Path, name: str, pooling: str = "mean_tokens", normalize: bool = True,
                matryoshka: bool = True, max_batch_size: int = 8, delay_us: int = 0, seed: int = 7
                ) -> Weights:
    """The model folder `root/name`; returns its weights for `reference`."""
    folder = root / name
    (folder / "1").mkdir(parents=True)
    wt = weights(seed)
    onnx.save(graph(wt), str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(config_pbtxt(name, max_batch_size, delay_us))
    tokenizer().save(str(folder / "tokenizer.json"))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir()
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    modes = {f"pooling_mode_{m}": m == pooling for m in ("cls_token", "mean_tokens", "max_tokens",
                                                         "mean_sqrt_len_tokens", "weightedmean_tokens",
                                                         "lasttoken")}
    pooling_config = {"word_embedding_dimension": HIDDEN, **modes}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ_LENGTH,
                                                                  "do_lower_case": False}))
    hf = {"model_type": "bert", "hidden_size": HIDDEN}
    if matryoshka:
        hf["matryoshka_dimensions"] = list(MATRYOSHKA)
    (folder / "config.json").write_text(json.dumps(hf))
    return wt


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-12) * g + b


def hidden_states(wt: Weights, ids: list[int]) -> np.ndarray:
    """[seq, HIDDEN] for one unpadded input, in float64."""
    x = wt.word[ids].astype(np.float64) + wt.position[: len(ids)] + wt.token_type[0]
    x = _layer_norm(x, *wt.ln1)
    q, k, v = x @ wt.q, x @ wt.k, x @ wt.v
    s = q @ k.T / np.sqrt(HIDDEN)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return _layer_norm(p @ v @ wt.o + x, *wt.ln2)


def reference(wt: Weights, ids: list[int], pooling: str = "mean_tokens", normalize: bool = True,
              dimensions: int | None = None) -> np.ndarray:
    h = hidden_states(wt, ids)
    vec = {"mean_tokens": h.mean(0), "cls_token": h[0], "lasttoken": h[-1]}[pooling]
    if dimensions is not None:
        vec = vec[:dimensions]
    if normalize:
        vec = vec / np.linalg.norm(vec)
    return vec
