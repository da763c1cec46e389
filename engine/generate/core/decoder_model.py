"""What the runner learned about an ONNX decoder when it loaded it, and how it feeds it.

Made once by `DecoderRunner` (runner.py) from the session's inputs and outputs: how many layers, the KV
tensors' names, heads, head size and dtype, whether the model takes an attention mask, position ids and LoRA
adapters, and the vocabulary. Both KV layouts (dense_layout.py, shared_layout.py) build their runs' inputs
with `feed` and note each run's shape with `record`. Called on the engine's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ...errors import invalid
from .lora import LoraShape, lora_feed
from .scheduler import ScheduledChunk

KV_DTYPES: dict[str, type[np.floating[Any]]] = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


@dataclass(frozen=True, slots=True)
class RunShape:
    """One session run as the runner made it: input_ids' [batch, seq], the mask's width, and each row's
    ones in the mask (its context plus new tokens, padding left out)."""

    ids: tuple[int, ...]
    width: int
    lengths: list[int]


class DecoderModel:
    """One ONNX Runtime session of a decoder with past, checked to be one. `options`: the session options
    (one intra-op thread and no spinning, as engine/backends/onnxruntime.py sets them); `providers`: ONNX
    Runtime's providers list, names or (name, options) pairs, as the instance group selects them
    (generate/serving/device.py). Whatever the provider, the runs' inputs and outputs are host (numpy)
    arrays: ONNX Runtime copies them to and from a GPU."""

    def __init__(self, model: Path | bytes, options: ort.SessionOptions, providers: Sequence[Any],
                 where: str, shared_kv: bool, kv_shape: tuple[int | None, int | None] = (None, None)) -> None:
        """`kv_shape`: the KV heads and head size the model folder states (serving/hf_folder.py), for a graph
        whose past leaves them symbolic (onnxruntime-genai's exports); a fixed dim must agree with them."""
        source = str(model) if isinstance(model, Path) else model
        self.session = ort.InferenceSession(source, options, providers=list(providers))
        inputs = {a.name: a for a in self.session.get_inputs()}
        outputs = {a.name for a in self.session.get_outputs()}
        layers = 0
        while f"past_key_values.{layers}.key" in inputs:
            layers += 1
        if not layers or "input_ids" not in inputs or "logits" not in outputs:
            raise invalid(f"{where}: not a decoder with past: it needs inputs input_ids and "
                          "past_key_values.{i}.key/value, and outputs logits and present.{i}.key/value")
        first = inputs["past_key_values.0.key"]
        heads, head_dim = (_kv_dim(first.shape[i], stated, name, where)
                           for i, stated, name in ((1, kv_shape[0], "heads"), (3, kv_shape[1], "head_dim")))
        if not (isinstance(heads, int) and isinstance(head_dim, int)) or first.type not in KV_DTYPES:
            raise invalid(f"{where}: past_key_values.0.key must be float or float16 [batch, heads, past, "
                          f"head_dim] with fixed heads and head_dim, got {first.type} {first.shape} (a "
                          "symbolic one is taken from the parameters kv_num_heads / kv_head_dim, which a "
                          "Hugging Face folder's config.json or genai_config.json gives)")
        self.kv_names = [(f"past_key_values.{i}.{p}", f"present.{i}.{p}")
                         for i in range(layers) for p in ("key", "value")]
        missing = [n for pair in self.kv_names for n in pair if n not in inputs and n not in outputs]
        if missing:
            raise invalid(f"{where}: missing KV tensor {missing[0]}")
        self.layers, self.heads, self.head_dim = layers, heads, head_dim
        self.kv_dtype = KV_DTYPES[first.type]
        if "use_cache_branch" in inputs:
            raise invalid(f"{where}: a merged decoder (input use_cache_branch) is not supported; export "
                          "the model with past (Optimum's decoder_with_past, or one taking an empty past)")
        self.has_mask, self.has_positions = "attention_mask" in inputs, "position_ids" in inputs
        self.lora = _lora_shape(inputs, layers, where)  # None: the model takes no adapters (lora.py)
        self.output_names = ["logits", *(present for _, present in self.kv_names)]
        logits = next(o for o in self.session.get_outputs() if o.name == "logits")
        if shared_kv and (not isinstance(logits.shape[-1], int) or logits.type not in KV_DTYPES):
            raise invalid(f"{where}: with past_present_share_buffer, logits must be float or float16 [batch, "
                          f"seq, vocab] with a fixed vocab, got {logits.type} {logits.shape}")
        self.vocab = logits.shape[-1] if isinstance(logits.shape[-1], int) else 0
        self.logits_dtype = KV_DTYPES.get(logits.type, np.float32)
        # set to a list, each session run is recorded in it (RunShape), for perf/bench_generate.py's ceiling
        self.trace: list[RunShape] | None = None

    def feed(self, input_ids: np.ndarray, mask: np.ndarray, positions: np.ndarray,
             pasts: Sequence[np.ndarray], rows: Sequence[ScheduledChunk | None]) -> dict[str, np.ndarray]:
        """A run's inputs by name; `pasts` empty when they are bound instead (a shared-KV run)."""
        feed: dict[str, np.ndarray] = {"input_ids": input_ids}
        if self.lora is not None:
            feed.update(self.adapter_inputs(rows))
        if self.has_mask:
            feed["attention_mask"] = mask
        if self.has_positions:
            feed["position_ids"] = positions
        if pasts:
            feed.update(zip((name for name, _ in self.kv_names), pasts, strict=True))
        return feed

    def adapter_inputs(self, rows: Sequence[ScheduledChunk | None]) -> dict[str, np.ndarray]:
        """The LoRA inputs for a run's rows: each row's adapter (None: a free row, or no adapter)."""
        assert self.lora is not None
        return lora_feed(self.lora, [None if c is None else c.request.adapter for c in rows])

    def record(self, input_ids: np.ndarray, mask: np.ndarray) -> None:
        if self.trace is not None:
            self.trace.append(RunShape(input_ids.shape, mask.shape[1], mask.sum(axis=1).tolist()))


def _kv_dim(dim: int | str | None, stated: int | None, name: str, where: str) -> int | str | None:
    """A KV dim of the graph's past: its own when fixed (which must agree with the folder's), else the
    folder's."""
    if not isinstance(dim, int):
        return dim if stated is None else stated
    if stated is not None and stated != dim:
        kind = "kv_num_heads" if name == "heads" else "kv_head_dim"
        raise invalid(f"{where}: the graph's past has {name} {dim}, but {kind} says {stated}")
    return dim


def _lora_shape(inputs: dict, layers: int, where: str) -> LoraShape | None:
    """The adapter inputs' shape (`lora_a.{i}` [batch, hidden, r], `lora_b.{i}` [batch, r, hidden] for
    every layer), or None when the model has none."""
    if "lora_a.0" not in inputs:
        return None
    _, hidden, rank = inputs["lora_a.0"].shape
    for i in range(layers):
        a, b = inputs.get(f"lora_a.{i}"), inputs.get(f"lora_b.{i}")
        if a is None or b is None or list(a.shape[1:]) != [hidden, rank] \
                or list(b.shape[1:]) != [rank, hidden]:
            raise invalid(f"{where}: LoRA inputs need lora_a.{{i}} [batch, hidden, r] and lora_b.{{i}} "
                          f"[batch, r, hidden] with fixed hidden and r for each of the {layers} layers")
    if not (isinstance(hidden, int) and isinstance(rank, int)):
        raise invalid(f"{where}: lora_a.0 must have fixed hidden and rank dims, got "
                      f"{inputs['lora_a.0'].shape}")
    return LoraShape(layers, hidden, rank)
