"""What an embedding model's folder adds to its ONNX graph, read once per served version.

An embedding model is an ordinary ONNX model of the repository whose config says `parameters { key:
"embedding" value { string_value: "true" } }`: an encoder exported for feature extraction (Optimum's
`feature-extraction` task) with inputs `input_ids`, `attention_mask` and optionally `token_type_ids`
([batch, seq], INT64) and output `last_hidden_state` ([batch, seq, hidden], FP32), behind the dynamic
batcher. Beside its config, in sentence-transformers' layout:

    tokenizer.json                      the tokenizer (Hugging Face `tokenizers`), special tokens included
    modules.json                        optional: the modules in order; names the Pooling module's folder and
                                        whether a Normalize module follows
    1_Pooling/config.json               `pooling_mode_mean_tokens`, `pooling_mode_cls_token` or
                                        `pooling_mode_lasttoken` (no folder: mean, sentence-transformers'
                                        default)
    2_Normalize/                        present: vectors are L2-normalized
    sentence_bert_config.json           optional: `max_seq_length`, the context in tokens
    config.json                         optional (the Hugging Face model config): `matryoshka_dimensions` or
                                        `is_matryoshka`, as vLLM reads them

The config's parameters may say the same and win: `max_tokens` (the context), `matryoshka_dimensions`
("64,128": the `dimensions` a request may ask for; "any": every size up to the hidden size).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from ..config.model_config import ModelConfig
from ..errors import EngineError, ErrorCode
from .pooling import Pooling

EMBEDDING_PARAMETER = "embedding"
DEFAULT_MAX_TOKENS = 512  # BERT's positions, when nothing in the folder says
IDS, MASK, TYPE_IDS, HIDDEN = "input_ids", "attention_mask", "token_type_ids", "last_hidden_state"


def is_embedding(config: ModelConfig) -> bool:
    return config.parameters.get(EMBEDDING_PARAMETER, "").strip().lower() == "true"


@dataclass(frozen=True, slots=True)
class EmbeddingFolder:
    """One served version's embedding setup. `dimensions`: the sizes a request's `dimensions` may ask for
    (besides `hidden_size`, always allowed); `any_dimensions`: every size from 1 to `hidden_size`."""

    tokenizer: Tokenizer
    pooling: Pooling
    normalize: bool
    max_tokens: int
    hidden_size: int
    max_batch_size: int
    type_ids: bool  # the graph takes token_type_ids (all zeros: one segment)
    pad_id: int
    dimensions: tuple[int, ...] = ()
    any_dimensions: bool = False

    def allows(self, dimensions: int) -> bool:
        if dimensions == self.hidden_size:
            return True
        if self.any_dimensions:
            return 0 < dimensions < self.hidden_size
        return dimensions in self.dimensions


def load_folder(config: ModelConfig, folder: Path) -> EmbeddingFolder:
    """Read `folder` (the model's, beside config.pbtxt) for `config`; INVALID_ARG naming the file or field
    for what does not fit. Reads files: called off the loop."""
    where = f"embedding model '{config.name}'"
    inputs = {spec.name: spec for spec in config.inputs}
    outputs = {spec.name: spec for spec in config.outputs}
    missing = [n for n in (IDS, MASK) if n not in inputs] + [n for n in (HIDDEN,) if n not in outputs]
    if missing:
        raise _bad(f"{where}: its config lacks {', '.join(missing)} (an Optimum feature-extraction export "
                   f"has inputs {IDS}, {MASK}[, {TYPE_IDS}] and output {HIDDEN})")
    if config.max_batch_size <= 0 or config.dynamic_batching is None:
        raise _bad(f"{where}: its config needs max_batch_size > 0 and dynamic_batching, so requests batch")
    hidden_size = outputs[HIDDEN].dims[-1] if outputs[HIDDEN].dims else -1
    if hidden_size <= 0:
        raise _bad(f"{where}: {HIDDEN}'s last dimension (the hidden size) must be fixed in its config")
    path = folder / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:
        raise _bad(f"{where}: {path.name} does not load: {e}") from None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    pooling_dir, normalize = _modules(folder, where)
    params = config.parameters
    hf = _json(folder / "config.json", where) or {}
    any_dims, dims = _dimensions(params.get("matryoshka_dimensions"), hf, hidden_size, where)
    return EmbeddingFolder(
        tokenizer=tokenizer,
        pooling=_pooling(folder / pooling_dir / "config.json", where),
        normalize=normalize,
        max_tokens=_max_tokens(params, folder, where),
        hidden_size=hidden_size,
        max_batch_size=config.max_batch_size,
        type_ids=TYPE_IDS in inputs,
        pad_id=_pad_id(tokenizer),
        dimensions=dims,
        any_dimensions=any_dims,
    )


def _bad(message: str) -> EngineError:
    return EngineError(ErrorCode.INVALID_ARG, message)


def _json(path: Path, where: str) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise _bad(f"{where}: {path.name} is not readable JSON: {e}") from None


def _modules(folder: Path, where: str) -> tuple[str, bool]:
    """The Pooling module's folder and whether a Normalize module is there: from modules.json when the folder
    has one, else sentence-transformers' usual names."""
    modules = _json(folder / "modules.json", where)
    if not isinstance(modules, list):
        return "1_Pooling", (folder / "2_Normalize").is_dir()
    pooling, normalize = "1_Pooling", False
    for module in modules:
        kind = str(module.get("type", "")) if isinstance(module, dict) else ""
        if kind.endswith("Pooling"):
            pooling = str(module.get("path", pooling))
        elif kind.endswith("Normalize"):
            normalize = True
    return pooling, normalize


def _pooling(path: Path, where: str) -> Pooling:
    doc = _json(path, where)
    if doc is None:
        return Pooling.MEAN
    chosen = [mode for mode in Pooling if doc.get(f"pooling_mode_{mode.value}")]
    others = sorted(k for k, v in doc.items() if k.startswith("pooling_mode_") and v
                    and k[len("pooling_mode_"):] not in {m.value for m in Pooling})
    if others or len(chosen) != 1:
        raise _bad(f"{where}: {path.parent.name}/config.json must set exactly one of "
                   f"{', '.join('pooling_mode_' + m.value for m in Pooling)}"
                   + (f" (it sets {', '.join(others)}, which we do not serve)" if others else ""))
    return chosen[0]


def _max_tokens(params: Mapping[str, str], folder: Path, where: str) -> int:
    text = params.get("max_tokens")
    if text is not None:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise _bad(f"{where}: parameter max_tokens must be a positive integer, got {text!r}")
        return value
    st = _json(folder / "sentence_bert_config.json", where)
    if isinstance(st, dict) and isinstance(st.get("max_seq_length"), int) and st["max_seq_length"] > 0:
        return int(st["max_seq_length"])
    tok = _json(folder / "tokenizer_config.json", where)
    if isinstance(tok, dict) and isinstance(tok.get("model_max_length"), int) \
            and 0 < tok["model_max_length"] < 1_000_000:
        return int(tok["model_max_length"])
    return DEFAULT_MAX_TOKENS


def _dimensions(text: str | None, hf: Mapping[str, Any], hidden_size: int, where: str
                ) -> tuple[bool, tuple[int, ...]]:
    if text is None:
        listed = hf.get("matryoshka_dimensions")
        if isinstance(listed, list):
            text = ",".join(str(d) for d in listed)
        elif hf.get("is_matryoshka") is True:
            text = "any"
        else:
            return False, ()
    if text.strip().lower() == "any":
        return True, ()
    try:
        dims = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        dims = (0,)
    if not dims or any(d <= 0 or d > hidden_size for d in dims):
        raise _bad(f"{where}: matryoshka_dimensions must list sizes from 1 to the hidden size {hidden_size} "
                   f"(or say 'any'), got {text!r}")
    return False, dims


def _pad_id(tokenizer: Tokenizer) -> int:
    for token in ("[PAD]", "<pad>"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return 0


__all__ = ["EMBEDDING_PARAMETER", "EmbeddingFolder", "is_embedding", "load_folder"]
