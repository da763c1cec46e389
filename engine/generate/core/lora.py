"""LoRA adapters for a decoder whose graph takes them as inputs: on disk, loaded on demand, evicted LRU.

A model that exports adapter inputs (`lora_a.{i}` FP32 [batch, hidden, r] and `lora_b.{i}` FP32 [batch, r,
hidden] per layer, as perf/hubserve_models/tiny_decoder.py builds with `lora_rank`) is fed each row's matrices
by the runner (runner.py), zeros for a row without an adapter; so requests with different adapters, and none,
run in the same batch, row by row, and nothing is grouped by adapter.

Adapters are folders beside the model's config (the folder name is configurable, `lora_adapters`):

    <model>/adapters/<name>/lora_a.0.npy   FP32 [hidden, r']   r' <= the model's r (zero-padded up to r)
                            lora_b.0.npy   FP32 [r', hidden]
                            ... one pair per layer

An `AdapterStore` keeps at most `max_loras` of them loaded; loading one more evicts the least recently used.
A running request holds its adapter's arrays itself, so an eviction never changes a request in flight.
`check` runs on the loop (the name and the folder: an unknown adapter is refused before it queues);
`get` runs on the engine's thread (it reads the files).
"""

from __future__ import annotations

import collections
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import EngineError, ErrorCode, invalid

log = logging.getLogger("hubserve.generate")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def adapter_names(root: Path) -> list[str]:
    """The adapters a model folder declares: the subfolders of its adapters' folder whose names an adapter
    may have, sorted (what GET /v1/models lists; nothing is read or loaded). No folder: none."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    return sorted(e.name for e in entries if _NAME.fullmatch(e.name) and e.is_dir())


@dataclass(frozen=True, slots=True)
class LoraShape:
    layers: int
    hidden: int
    rank: int


@dataclass(frozen=True, slots=True, eq=False)
class LoraAdapter:
    name: str
    a: tuple[np.ndarray, ...]  # per layer [hidden, rank], zero-padded to the model's rank
    b: tuple[np.ndarray, ...]  # per layer [rank, hidden]

    @property
    def salt(self) -> int:
        return hash(("lora", self.name))


class AdapterStore:
    def __init__(self, root: Path, shape: LoraShape, max_loaded: int, model: str) -> None:
        self.root = root
        self.shape = shape
        self.max_loaded = max_loaded
        self.model = model
        self._loaded: collections.OrderedDict[str, LoraAdapter] = collections.OrderedDict()
        self.loads = 0
        self.evictions = 0

    def check(self, name: str) -> None:
        """NOT_FOUND for a name that is no adapter folder of this model (the name is checked first, so it
        can never reach outside the adapters' folder)."""
        if not _NAME.fullmatch(name) or not (self.root / name).is_dir():
            raise EngineError(ErrorCode.NOT_FOUND, f"model '{self.model}' has no LoRA adapter '{name}'")

    @property
    def num_loaded(self) -> int:
        """How many adapters are in memory (read by a scrape on the loop while the engine thread loads)."""
        return len(self._loaded)

    @property
    def loaded(self) -> list[str]:
        """The adapters in memory, least recently used first."""
        return list(self._loaded)

    def get(self, name: str) -> LoraAdapter:
        adapter = self._loaded.get(name)
        if adapter is not None:
            self._loaded.move_to_end(name)
            return adapter
        self.check(name)
        adapter = self._read(name)
        self._loaded[name] = adapter
        self.loads += 1
        log.info("model '%s': LoRA adapter '%s' loaded", self.model, name)
        while len(self._loaded) > self.max_loaded:
            evicted, _ = self._loaded.popitem(last=False)
            self.evictions += 1
            log.info("model '%s': LoRA adapter '%s' evicted (at most %d loaded)", self.model, evicted,
                     self.max_loaded)
        return adapter

    def _read(self, name: str) -> LoraAdapter:
        shape, folder = self.shape, self.root / name
        a_list, b_list = [], []
        for i in range(shape.layers):
            a = self._array(folder, f"lora_a.{i}.npy", name)
            b = self._array(folder, f"lora_b.{i}.npy", name)
            rank = a.shape[1] if a.ndim == 2 else -1
            if a.shape != (shape.hidden, rank) or b.shape != (rank, shape.hidden) or rank > shape.rank:
                raise invalid(f"LoRA adapter '{name}' of model '{self.model}': layer {i} needs lora_a "
                              f"[{shape.hidden}, r] and lora_b [r, {shape.hidden}] with r <= {shape.rank}, "
                              f"got {list(a.shape)} and {list(b.shape)}")
            a_list.append(np.pad(a, ((0, 0), (0, shape.rank - rank))))
            b_list.append(np.pad(b, ((0, shape.rank - rank), (0, 0))))
        return LoraAdapter(name, tuple(a_list), tuple(b_list))

    def _array(self, folder: Path, filename: str, name: str) -> np.ndarray:
        try:
            array = np.load(folder / filename, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise invalid(f"LoRA adapter '{name}' of model '{self.model}': cannot read {filename}: "
                          f"{type(e).__name__}") from None
        return np.ascontiguousarray(array, np.float32)


def lora_feed(shape: LoraShape, adapters: list[LoraAdapter | None]) -> dict[str, np.ndarray]:
    """Each layer's `lora_a.{i}` / `lora_b.{i}` for rows whose adapters are `adapters` (None: zeros)."""
    rows = len(adapters)
    feed: dict[str, np.ndarray] = {}
    for i in range(shape.layers):
        a = np.zeros((rows, shape.hidden, shape.rank), np.float32)
        b = np.zeros((rows, shape.rank, shape.hidden), np.float32)
        for row, adapter in enumerate(adapters):
            if adapter is not None:
                a[row], b[row] = adapter.a[i], adapter.b[i]
        feed[f"lora_a.{i}"], feed[f"lora_b.{i}"] = a, b
    return feed
