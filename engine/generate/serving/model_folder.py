"""A generative model folder → a ready `GenerationEngine`.

The folder is a Triton model folder like any other (`config.pbtxt`, `<version>/model.onnx`), or a Hugging
Face export served as it is (hf_folder.py: its files at the top level or in `1/`, with no config file or
one that only overrides, every parameter below it does not set read from its own files). The config's
`parameters` declare it to the engine and size the engine:

    generation              "decoder_with_past"  (required: what marks the model as generative; implied for
                            a Hugging Face export)
    tokenizer               "bytes" (default) or "tokenizer.json" (needs the `tokenizers` package)
    bos_token, eos_token    a tokenizer.json's special tokens, by their text
    eos_token_ids           every end-of-sequence id, comma-separated (request_defaults.py)
    default_temperature, default_top_p, default_top_k, default_min_p, default_repetition_penalty
                            what a /v1 request that leaves the field out gets (request_defaults.py)
    max_model_len           context length in tokens (default 512)
    kv_num_heads, kv_head_dim  the past's heads and head size, for a graph that leaves them symbolic
    hf_export, hf_export_files  set for a Hugging Face export: its form ("optimum", "genai") and where its
                            files are ("." the folder's own, version 1; "1" its version folder); with
                            `source.<name>` for each value read from its files
    kv_block_size           tokens per KV block (default 16)
    kv_num_blocks           blocks in the pool (default: from the memory budget, kv_budget.py)
    kv_cache_memory_bytes   the KV blocks' memory budget, "536870912", "512MiB", "2GB" (default: the
                            server's --kv-cache-memory-bytes, else a share of the memory left: kv_budget.py)
    max_num_seqs            running sequences at most (default 32)
    max_num_batched_tokens  tokens computed per step at most (default 256)
    enable_prefix_caching   "true" (default) or "false"
    past_present_share_buffer  "false" (default): the model returns `present` = past + new (Optimum's
                            form); "true": it reads `past` as a buffer [batch, heads, capacity, head_dim] and
                            writes the new keys and values into it in place at each row's length
                            (GroupQueryAttention, as onnxruntime-genai exports; core/shared_group.py)
    num_scheduler_steps     decode steps per schedule when every running request decodes (default 1:
                            core/engine.py's multi-step decode)
    lora_adapters           the adapters' folder beside the config (default "adapters"), for a model whose
                            graph takes LoRA inputs (core/lora.py)
    max_loras               adapters kept loaded at most, least recently used evicted (default 4)
    speculative_method      speculative decoding (vLLM's `speculative_config` method); absent: off.
                            "ngram": prompt lookup (core/proposer.py); "draft_model": a small decoder's
                            greedy tokens (core/draft_proposer.py)
    num_speculative_tokens  tokens proposed per step at most (default 4)
    prompt_lookup_min, prompt_lookup_max  ngram: the shortest and longest suffix looked up (defaults 1, 3)
    speculative_model       draft_model: the draft's ONNX file, relative to the folder (a dense decoder
                            with past sharing the model's tokenizer)
    speculative_backoff     "true" (default): a request whose proposals do not pay (too few kept for what a
                            proposal step costs, as measured) stops proposing for a while (core/backoff.py);
                            "false": every decoding request is proposed for at every step

The config goes through the repository's own steps (parse, auto-complete from the model, validate), and the
session gets the same options as any ONNX Runtime model (one intra-op thread, no spinning, unless the
config's intra_op_thread_count says otherwise).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import onnxruntime as ort

from ...backends.onnxruntime import session_options
from ...config.model_config import ModelConfig
from ...config.steps import autocomplete, read_config_proto, validate
from ...errors import invalid
from ..core.backoff import BackoffProposer, step_clock
from ..core.draft_proposer import DraftModelProposer
from ..core.engine import CacheConfig, GenerationEngine
from ..core.lora import AdapterStore
from ..core.proposer import METHODS, NgramProposer, Proposer, SpeculativeConfig
from ..core.runner import DecoderRunner
from ..core.scheduler import SchedulerConfig
from ..core.tokenizer import load_tokenizer
from ..triton.signature import complete_generative
from .device import open_decoder
from .hf_folder import OVERRIDDEN, SOURCE, declare_export, export_files
from .kv_budget import KVShape, size_for_model

GENERATION_FORMS = ("decoder_with_past",)

log = logging.getLogger("hubserve.generate")


def is_generative(config: ModelConfig) -> bool:
    return "generation" in config.parameters


def _int(params: Mapping[str, str], key: str, default: int, where: str) -> int:
    text = params.get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise invalid(f"{where}: parameter {key} must be a positive integer, got {text!r}")
    return value


def _optional_int(params: Mapping[str, str], key: str, where: str) -> int | None:
    return _int(params, key, 1, where) if key in params else None


def _own_context(params: Mapping[str, str]) -> bool:
    """Whether max_model_len is a Hugging Face folder's own (read from its files, not set by its config):
    then a KV cache holding fewer tokens cuts it (`_context`) instead of failing the load (kv_budget.py)."""
    source = params.get(SOURCE + "max_model_len")
    return source is not None and not source.startswith(OVERRIDDEN)


def _context(params: Mapping[str, str], kv_slots: int, where: str) -> int:
    """max_model_len. A Hugging Face folder's own context (not one its config sets) longer than the KV
    cache's token slots is cut to them, with a warning: no request could use more (a Llama-3.1's 131072
    positions against the 16384 tokens 2 GiB of an 8B fp16 cache holds), and a shared-KV buffer is sized by
    it."""
    context = _int(params, "max_model_len", 512, where)
    if not _own_context(params) or context <= kv_slots:
        return context
    log.warning("%s: its context of %d tokens (%s) is cut to the KV cache's %d token slots (its blocks × "
                "kv_block_size); set max_model_len, kv_cache_memory_bytes or kv_num_blocks in a config.pbtxt "
                "beside its files, or --kv-cache-memory-bytes", where, context,
                params.get(SOURCE + "max_model_len"), kv_slots)
    return kv_slots


def _proposer(params: Mapping[str, str], folder: Path, options: ort.SessionOptions, vocab: int,
              where: str) -> Proposer | None:
    """Speculative decoding's proposer, when the config asks for it (`speculative_method`)."""
    method = params.get("speculative_method")
    if method is None:
        return None
    if method not in METHODS:
        raise invalid(f"{where}: parameter speculative_method must be one of {', '.join(METHODS)}, "
                      f"got {method!r}")
    k = _int(params, "num_speculative_tokens", 4, where)
    if method == "draft_model":
        name = params.get("speculative_model")
        if not name:
            raise invalid(f"{where}: speculative_method draft_model needs parameter speculative_model, the "
                          "draft's ONNX file in the model's folder")
        path = folder / name
        if not path.is_file() or folder.resolve() not in path.resolve().parents:
            raise invalid(f"{where}: speculative_model {name!r} is not a file in the model's folder")
        log.info("%s: speculative decoding by the draft model %s, %d tokens proposed per step at most",
                 where, name, k)
        return DraftModelProposer(path, options, k, vocab, f"{where}, draft model {name!r}")
    low = _int(params, "prompt_lookup_min", 1, where)
    high = _int(params, "prompt_lookup_max", max(3, low), where)
    if low > high:
        raise invalid(f"{where}: parameter prompt_lookup_min ({low}) must not exceed prompt_lookup_max "
                      f"({high})")
    log.info("%s: speculative decoding by n-gram prompt lookup, %d tokens proposed per step at most "
             "(suffixes of %d to %d tokens)", where, k, low, high)
    return NgramProposer(SpeculativeConfig(method, k, low, high))


def effective_values(config: ModelConfig) -> str:
    """The values a Hugging Face folder gave, and where each came from (`source.<name>`), for the load's log
    line: "max_model_len 128 (config.json n_positions), ..."; "" for a folder that gave none."""
    params = config.parameters
    return ", ".join(f"{name[len(SOURCE):]} {params.get(name[len(SOURCE):], '')} ({source})"
                     for name, source in sorted(params.items()) if name.startswith(SOURCE))


def read_model_config(folder: Path, version: int = 1) -> tuple[ModelConfig, Path]:
    """The validated config of a generative model folder (a Hugging Face export's included), and its model
    file: the repository's steps, for tests and benchmarks that build an engine without a server."""
    name = folder.name
    where = f"model '{name}'"
    msg = read_config_proto(folder, name)
    export = declare_export(msg, folder)
    own = export is not None and export.top_level and version == 1  # version 1: the folder's own files
    version_dir = folder if own else folder / str(version)
    model_path = version_dir / (msg.default_model_filename or "model.onnx")
    complete_generative(msg, where)  # its Triton signature, as the repository completes it
    autocomplete(msg, None, name)
    config = validate(msg, where)
    form = config.parameters.get("generation")
    if form not in GENERATION_FORMS:
        raise invalid(f"{where}: parameter generation must be one of {', '.join(GENERATION_FORMS)}, "
                      f"got {form!r}")
    return config, model_path


def load_engine(folder: Path, version: int = 1, seed: int = 0) -> GenerationEngine:
    config, model_path = read_model_config(folder, version)
    return build_engine(config, model_path, folder, seed)


def adapters_folder(config: ModelConfig, folder: Path) -> Path:
    """Where a generative model folder keeps its LoRA adapters (the `lora_adapters` parameter)."""
    return folder / config.parameters.get("lora_adapters", "adapters")


def build_engine(config: ModelConfig, model_path: Path, folder: Path, seed: int = 0,
                 gpus: tuple[int, ...] = (), kv_cache_memory_bytes: int | None = None) -> GenerationEngine:
    """The engine for a validated config (the repository's, for a served version: registry.py) whose model
    file is `model_path`; `folder` (the model's folder) holds its tokenizer, or a Hugging Face export's
    files do. `gpus`: the visible GPUs (its instance group's device: device.py); `kv_cache_memory_bytes`: the
    server's --kv-cache-memory-bytes (kv_budget.py). Blocking (it makes the ONNX Runtime session)."""
    params, where = config.parameters, f"model '{config.name}'"
    form = params.get("generation")
    if form not in GENERATION_FORMS:
        raise invalid(f"{where}: parameter generation must be one of {', '.join(GENERATION_FORMS)}, "
                      f"got {form!r}")
    block_size = _int(params, "kv_block_size", 16, where)
    max_model_len = _int(params, "max_model_len", 512, where)
    scheduler = SchedulerConfig(
        max_num_seqs=_int(params, "max_num_seqs", 32, where),
        max_num_batched_tokens=_int(params, "max_num_batched_tokens", 256, where),
        num_scheduler_steps=_int(params, "num_scheduler_steps", 1, where),
    )
    files = export_files(params, folder) or folder
    tokenizer = load_tokenizer(params.get("tokenizer", "bytes"), files, params, where)
    options = session_options(config)
    share = params.get("past_present_share_buffer", "false").lower()
    if share not in ("true", "false"):
        raise invalid(f"{where}: parameter past_present_share_buffer must be true or false, got {share!r}")
    # the session on the instance group's device, then the KV blocks from the memory left (kv_budget.py)
    decoder = open_decoder(config, model_path, options, gpus, where, share == "true",
                           (_optional_int(params, "kv_num_heads", where),
                            _optional_int(params, "kv_head_dim", where)))
    kv = size_for_model(KVShape.of(decoder), params, block_size, max_model_len, scheduler.max_num_seqs,
                        kv_cache_memory_bytes, where, cut_context=_own_context(params))
    cache = CacheConfig(block_size, kv.num_blocks, _context(params, kv.tokens, where),
                        params.get("enable_prefix_caching", "true").lower() != "false",
                        kv.budget_bytes, kv.sized_by.value)
    runner = DecoderRunner(decoder, cache.num_blocks, cache.block_size, where=where,
                           shared_kv=share == "true", max_len=cache.max_model_len,
                           max_rows=scheduler.max_num_seqs)
    adapters = None
    if runner.lora is not None:
        adapters = AdapterStore(adapters_folder(config, folder), runner.lora,
                                _int(params, "max_loras", 4, where), config.name)
    proposer = _proposer(params, folder, options, runner.model.vocab, where)
    if proposer is not None and params.get("speculative_backoff", "true").lower() != "false":
        clock = step_clock(decoder.session.get_providers(), options.intra_op_num_threads)
        proposer = BackoffProposer(proposer, clock)
    return GenerationEngine(runner, tokenizer, cache, scheduler, seed, adapters, proposer)
