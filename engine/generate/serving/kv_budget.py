"""How many KV blocks a generative model version gets: from a memory budget, as vLLM sizes its cache.

A block holds `block_size` tokens' keys and values of every layer, so its bytes follow from the model's KV
shape (read from the ONNX graph's past inputs: core/decoder_model.py) as layers × 2 × kv_heads × head_dim ×
block_size × the dtype's size. The count is chosen once, at load (model_folder.py `build_engine`, after the
session is made, so the weights already hold their memory), in this order:

1. the config parameter `kv_num_blocks`: that many blocks, whatever they cost;
2. the config parameter `kv_cache_memory_bytes` (vLLM's `--kv-cache-memory-bytes`): budget // bytes per block;
3. the server flag `--kv-cache-memory-bytes`, the same for every generative model without either parameter;
4. the default: a quarter of the memory available to the process once the weights are loaded (MemAvailable,
   and the cgroup's limit where one is set), at most 2 GiB, and no more blocks than `max_num_seqs`
   sequences of `max_model_len` tokens can hold at once (more would only keep cached prefixes, and cost
   bookkeeping per block: the block pool builds its free list of 262,144 blocks in ~190 ms here, of 1,024
   in 0.3 ms). The cap is half of vLLM's CPU default (`VLLM_CPU_KVCACHE_SPACE`, 4 GiB), the size issue 29
   found too much for an 8B-shaped fp32 model at 512-token contexts (1024 blocks, 4.3 GB); 2 GiB still
   holds two whole 8192-token contexts of an 8B fp16 shape (Llama-3-8B: 32 layers, 8 KV heads of 128).

The budget is the blocks' alone: a shared-KV model's decode buffers (core/shared_group.py, `max_num_seqs` ×
`max_model_len` tokens) come on top, and the load log shows both. vLLM's other way,
`gpu_memory_utilization`, has no meaning here: the blocks are host memory (numpy) whatever
the execution provider (runner.py). A budget too small for one sequence of `max_model_len` tokens fails the
load (UNAVAILABLE, with the numbers and what fits); an explicit `kv_num_blocks` is taken as given (a request
larger than the whole cache is refused when it arrives: core/engine.py).

`size_kv_cache` is pure (the available memory is passed in); `available_memory_bytes` reads the machine.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import invalid, unavailable

if TYPE_CHECKING:  # the CLI parses sizes with this module, without loading the engine
    from ...config.model_config import ModelConfig
    from ..core.decoder_model import DecoderModel
    from ..core.engine import CacheConfig

GiB = 1 << 30
DEFAULT_FRACTION = 0.25  # of the memory available once the weights are loaded
DEFAULT_CAP_BYTES = 2 * GiB  # half vLLM's CPU default (VLLM_CPU_KVCACHE_SPACE): see above
UNKNOWN_AVAILABLE_BYTES = DEFAULT_CAP_BYTES  # a platform that does not say: the cap, a quarter of it used

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", re.IGNORECASE)  # 2G, 2GB, 2GiB, 2Gi


def parse_bytes(text: str) -> int:
    """A size as a config parameter or the flag gives it: bytes ("536870912"), or with a unit, SI or IEC
    ("512MB" = 512 × 10⁶, "512MiB" = 512 × 2²⁰, "2G", "1.5GiB"; case-insensitive). ValueError with the
    forms taken when it is none of these, or not positive."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"expected a size in bytes, such as 536870912, 512MiB or 2GB, got {text!r}")
    value = int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])
    if value < 1:
        raise ValueError(f"expected a size of 1 byte or more, got {text!r}")
    return value


def shown_bytes(count: int) -> str:
    """A byte count for a message or a log line: "512 MiB", "4.0 GiB", "16 KiB"."""
    if count >= GiB:
        return f"{count / GiB:.1f} GiB"
    if count >= 1 << 20:
        return f"{count / (1 << 20):.0f} MiB"
    return f"{count / 1024:.0f} KiB" if count >= 1024 else f"{count} B"


@dataclass(frozen=True, slots=True)
class KVShape:
    """What one token's keys and values cost: the model's KV tensors as the graph declares them."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int  # 4 for float32, 2 for float16

    @classmethod
    def of(cls, model: DecoderModel) -> KVShape:
        """The shape of a loaded decoder's past inputs (decoder_model.py read them from the graph)."""
        return cls(model.layers, model.heads, model.head_dim, model.kv_dtype(0).itemsize)

    @property
    def bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    def bytes_per_block(self, block_size: int) -> int:
        return self.bytes_per_token * block_size


class SizedBy(enum.Enum):
    """Where a version's block count came from (shown in the config endpoint, the load log)."""

    BLOCKS = "kv_num_blocks"
    PARAMETER = "kv_cache_memory_bytes"
    FLAG = "--kv-cache-memory-bytes"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class KVSizing:
    """A version's KV cache as sized at load: its blocks, what each costs, and the budget they came from
    (0 when `kv_num_blocks` gave the count). Read by the load log, the metrics and the config endpoint."""

    num_blocks: int
    block_size: int
    bytes_per_block: int
    budget_bytes: int
    sized_by: SizedBy

    @property
    def tokens(self) -> int:
        """The cache's capacity in tokens, over every sequence."""
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @classmethod
    def of(cls, cache: CacheConfig, bytes_per_block: int) -> KVSizing:
        """A built engine's sizing, from its cache config (which carries the budget and its source)."""
        return cls(cache.num_blocks, cache.block_size, bytes_per_block, cache.budget_bytes,
                   SizedBy(cache.sized_by))

    def parameters(self) -> dict[str, str]:
        """The effective values as config parameters (strings, as Triton shows them), under their own keys:
        what the config endpoint shows beside the parameters the folder gave."""
        return {"kv_cache_blocks": str(self.num_blocks), "kv_cache_tokens": str(self.tokens),
                "kv_cache_bytes": str(self.nbytes), "kv_cache_sized_by": self.sized_by.value}

    def describe(self) -> str:
        """For the load log line: "1024 KV blocks of 16 tokens (16384 tokens, 16 MiB; default budget ...)"."""
        source = "kv_num_blocks" if self.sized_by is SizedBy.BLOCKS else \
            f"{self.sized_by.value} budget {shown_bytes(self.budget_bytes)}"
        if self.sized_by is SizedBy.DEFAULT and self.nbytes + self.bytes_per_block <= self.budget_bytes:
            source += ", no more than max_num_seqs sequences of max_model_len fill"
        return (f"{self.num_blocks} KV blocks of {self.block_size} tokens ({self.tokens} tokens, "
                f"{shown_bytes(self.nbytes)}; {source})")


def show_parameters(config: ModelConfig, shown: Mapping[str, str]) -> ModelConfig:
    """`config` with `shown` added to the parameters its config endpoint prints (its `proto_bytes`), for a
    version whose engine is built (registry.py); the parameters the engine reads stay the folder's."""
    msg = config.proto()
    for key, value in shown.items():
        msg.parameters[key].string_value = value
    return replace(config, proto_bytes=msg.SerializeToString())


def default_budget_bytes(available_bytes: int | None) -> int:
    """The budget of a version with neither parameter nor flag: a quarter of what is available, capped."""
    available = UNKNOWN_AVAILABLE_BYTES if available_bytes is None else available_bytes
    return min(int(available * DEFAULT_FRACTION), DEFAULT_CAP_BYTES)


def size_kv_cache(shape: KVShape, block_size: int, max_model_len: int, max_num_seqs: int, *,
                  num_blocks: int | None = None, parameter_bytes: int | None = None,
                  flag_bytes: int | None = None, available_bytes: int | None = None,
                  where: str = "model", cut_context: bool = False) -> KVSizing:
    """The block count by the order in the module's docstring. UNAVAILABLE when a budget cannot hold one
    sequence of `max_model_len` tokens: the message gives the budget, the cost of that sequence, and the
    longest context the budget does hold. `cut_context`: `max_model_len` is a Hugging Face folder's own,
    which the loader cuts to what the cache holds (model_folder.py), so only a budget without one block is
    refused."""
    per_block = shape.bytes_per_block(block_size)
    if num_blocks is not None:
        return KVSizing(num_blocks, block_size, per_block, 0, SizedBy.BLOCKS)
    if parameter_bytes is not None:
        budget, sized_by = parameter_bytes, SizedBy.PARAMETER
    elif flag_bytes is not None:
        budget, sized_by = flag_bytes, SizedBy.FLAG
    else:
        budget, sized_by = default_budget_bytes(available_bytes), SizedBy.DEFAULT
    blocks = budget // per_block
    per_sequence = math.ceil(max_model_len / block_size)
    if sized_by is SizedBy.DEFAULT:
        blocks = min(blocks, max_num_seqs * per_sequence)
    if blocks < (1 if cut_context else per_sequence):
        how = {SizedBy.PARAMETER: "raise the parameter kv_cache_memory_bytes",
               SizedBy.FLAG: "raise --kv-cache-memory-bytes or give the model kv_cache_memory_bytes",
               SizedBy.DEFAULT: "free memory, or give kv_cache_memory_bytes"}[sized_by]
        raise unavailable(
            f"{where}: its KV cache budget of {shown_bytes(budget)} ({budget} bytes, {sized_by.value}) "
            f"holds {blocks} blocks of {block_size} tokens ({blocks * block_size} tokens at "
            f"{shape.bytes_per_token} bytes each), but one sequence of max_model_len {max_model_len} needs "
            f"{per_sequence} blocks ({shown_bytes(per_sequence * per_block)}); {how}, or lower max_model_len "
            f"to {blocks * block_size} or less")
    return KVSizing(blocks, block_size, per_block, budget, sized_by)


def size_for_model(shape: KVShape, params: Mapping[str, str], block_size: int, max_model_len: int,
                   max_num_seqs: int, flag_bytes: int | None, where: str,
                   cut_context: bool = False) -> KVSizing:
    """`size_kv_cache` for a model's config `parameters` (`kv_num_blocks`, `kv_cache_memory_bytes`) and the
    server's flag; the machine's available memory is read only when the default decides. Called by the
    model folder's loader (model_folder.py `build_engine`) once the session is made."""
    num_blocks = _count_parameter(params, "kv_num_blocks", where)
    parameter_bytes = _bytes_parameter(params, "kv_cache_memory_bytes", where)
    default = num_blocks is None and parameter_bytes is None and flag_bytes is None
    return size_kv_cache(shape, block_size, max_model_len, max_num_seqs, num_blocks=num_blocks,
                         parameter_bytes=parameter_bytes, flag_bytes=flag_bytes,
                         available_bytes=available_memory_bytes() if default else None, where=where,
                         cut_context=cut_context)


def _count_parameter(params: Mapping[str, str], key: str, where: str) -> int | None:
    text = params.get(key)
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise invalid(f"{where}: parameter {key} must be a positive integer, got {text!r}")
    return int(text)


def _bytes_parameter(params: Mapping[str, str], key: str, where: str) -> int | None:
    text = params.get(key)
    if text is None:
        return None
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise invalid(f"{where}: parameter {key}: {e}") from None


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo"),
                           cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Memory this process may still take: the kernel's MemAvailable, less where the cgroup (v2) limit is
    nearer (a container's limit is not in /proc/meminfo). None where neither can be read."""
    found: list[int] = []
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            found.append(max(0, int(limit) - int((cgroup / "memory.current").read_text())))
    except (OSError, ValueError):
        pass
    if not found and hasattr(os, "sysconf"):
        with contextlib.suppress(OSError, ValueError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return min(found) if found else None
