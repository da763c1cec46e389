"""Which served models generate, and each one's engine: one `EngineDriver` per generative model version.

A generative model is loaded by the repository like any other (its config, its version policy, load and
unload, readiness); what makes it generative is its config's `generation` parameter (model_folder.py). While
a version loads, before it is READY, its `start()` has the registry build its engine (the ONNX Runtime
session, the KV cache, the tokenizer and chat template of its folder) on a worker thread and run one short
greedy generation through it (`check_generation`): a version that cannot generate (a package missing, a
graph or layout the engine does not take, a tokenizer that does not load) fails its load, UNAVAILABLE with
the reason in the repository index, its ready endpoint and the log, and no request ever builds anything.
When the version is retired (a reload, an unload), its `stop()` has the registry end its engine, which
finishes what it has first (`EngineDriver.close`).

One per server, in the process that holds the repository: with `--workers N` that is the engine process,
so there is one KV cache whichever frontend a client reached. Used on the loop only.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

from ...config.model_config import ModelConfig
from ...errors import EngineError, ErrorCode, not_found
from ...model import Model
from ...repository.routing import RoutingTable
from ..core.engine import GenerationEngine
from ..core.request import SamplingParams
from .chat_template import ModelChat, load_chat_template
from .driver import EngineDriver
from .hf_folder import export_files
from .kv_budget import KVSizing, show_parameters
from .model_folder import build_engine, effective_values, is_generative
from .request_defaults import RequestDefaults

log = logging.getLogger("hubserve.generate")


@dataclass(frozen=True, slots=True)
class GenerativeVersion:
    """A generative model version ready to take requests: its engine's driver, its chat template (None in
    `chat.template`: its folder has none, and it serves no chat), and what its folder adds to each request
    (request_defaults.py)."""

    model: Model
    driver: EngineDriver
    chat: ModelChat
    defaults: RequestDefaults = RequestDefaults()

    @property
    def config(self) -> ModelConfig:
        return self.model.config


class Reservation(Protocol):
    def settle(self, used: int) -> None: ...


class TokenCharger(Protocol):
    """Per-key `tokens_per_minute` (engine/openai/token_quotas.py `TokenQuotas`): reserve a request's most
    before it reaches the engine (RESOURCE_EXHAUSTED when the key's minute has no room), settle with what it
    used. `owner`: the request's (InferenceRequest.owner), the key's owner id; "" for none."""

    def charge_triton(self, owner: str, tokens: int) -> Reservation | None: ...


# The generation each version runs at load (`check_generation`): a fixed prompt, a few greedy tokens.
LOAD_CHECK_PROMPT = "Hello"
LOAD_CHECK_TOKENS = 2


def check_generation(engine: GenerationEngine) -> None:
    """Run one short greedy generation through a freshly built engine, on the loading thread, before its
    driver exists: the whole path a request takes (encode, prefill, decode, sample, detokenize), so a graph
    that takes the KV layout's inputs but cannot run them fails here, not on a client's request. Its KV blocks
    are freed when it finishes; nothing of it reaches the version's statistics or metrics."""
    what = f"its load check ({LOAD_CHECK_TOKENS} greedy tokens from {LOAD_CHECK_PROMPT!r})"
    ids = engine.tokenizer.encode(LOAD_CHECK_PROMPT) or [0]  # a vocabulary without those characters
    engine.add_request("load-check", ids, SamplingParams(max_tokens=LOAD_CHECK_TOKENS, ignore_eos=True))
    try:
        done = engine.run_to_completion(max_steps=len(ids) + 8 * LOAD_CHECK_TOKENS)
    except EngineError as e:
        raise EngineError(e.code, f"{what} failed: {e.message}") from None
    except Exception as e:  # ONNX Runtime refusing the run: its own words name what the graph lacks
        raise EngineError(ErrorCode.INTERNAL, f"{what} failed: {e}") from None
    output = done.get("load-check")
    if output is None or len(output.output_token_ids) != LOAD_CHECK_TOKENS:
        raise EngineError(ErrorCode.INTERNAL, f"{what} ended without its tokens")


class GenerationRegistry:
    """`gpus`: the visible GPUs, where an instance group asks for one (device.py); `kv_cache_memory_bytes`:
    the server's --kv-cache-memory-bytes, the KV budget of every model without its own (kv_budget.py)."""

    def __init__(self, repository: RoutingTable, gpus: tuple[int, ...] = (),
                 kv_cache_memory_bytes: int | None = None) -> None:
        self.repository = repository
        self.gpus = gpus
        self.kv_cache_memory_bytes = kv_cache_memory_bytes
        # the OpenAI service's quotas, which Triton's generate paths charge too (set by the server)
        self.token_quotas: TokenCharger | None = None
        # each loaded version's engine, by the version's identity (the version kept beside it, so an id is
        # never reused while its entry lives): added by `load`, removed by `release`
        self._loaded: dict[int, tuple[Model, GenerativeVersion]] = {}

    def models(self) -> list[Model]:
        """The generative models that serve now (the version routing picks for each), by name."""
        out = []
        for name in sorted({m.name for m in self.repository.loaded_models() if is_generative(m.config)}):
            try:
                out.append(self.repository.get(name))
            except EngineError:
                continue  # loaded but not ready
        return out

    def model(self, name: str) -> Model:
        """The version a generation request for `name` goes to: NOT_FOUND for a model that does not exist or
        does not generate, UNAVAILABLE for one not ready (the repository's words)."""
        model = self.repository.get(name)
        if not is_generative(model.config):
            raise not_found(f"model '{name}' is served but does not generate text (its config has no "
                            "'generation' parameter); GET /v1/models lists the ones that do")
        return model

    async def version(self, name: str) -> GenerativeVersion:
        """The engine of the version routing picks for `name`, built when that version loaded."""
        version = self.loaded(self.model(name))
        if version is None:  # routed to, but unloading already
            raise EngineError(ErrorCode.UNAVAILABLE, f"model '{name}' is unloading; retry")
        return version

    def loaded(self, model: Model) -> GenerativeVersion | None:
        """`model`'s engine while it serves (None once it is unloading): what /v1/models reads its context
        from."""
        held = self._loaded.get(id(model))
        return held[1] if held is not None and held[0] is model else None

    def drivers(self) -> list[EngineDriver]:
        """Every engine of a served version (for metrics): not a version still loading beside the one it
        replaces, nor one retired and draining."""
        loaded = {id(m) for m in self.repository.loaded_models()}
        return [version.driver for key, (_, version) in self._loaded.items() if key in loaded]

    async def load(self, model: Model) -> None:
        """Build `model`'s engine and run the load check (`check_generation`) on a worker thread, then start
        its driver. Called by the version's `start()`, before it is READY; raises UNAVAILABLE with the reason
        when it cannot generate (the repository records the version's load as failed)."""
        where = f"model '{model.name}' version {model.version_str}"

        def build() -> tuple[GenerationEngine, ModelChat, RequestDefaults]:
            engine = build_engine(model.config, model.model_path, model.model_dir, gpus=self.gpus,
                                  kv_cache_memory_bytes=self.kv_cache_memory_bytes)
            files = export_files(model.config.parameters, model.model_dir) or model.model_dir
            chat = load_chat_template(files, f"model '{model.name}'", model.config.parameters,
                                      model.model_dir)
            defaults = RequestDefaults.of(model.config.parameters, engine.tokenizer, f"model '{model.name}'")
            check_generation(engine)
            return engine, chat, defaults

        try:
            engine, chat, defaults = await asyncio.to_thread(build)
        except EngineError as e:
            raise EngineError(ErrorCode.UNAVAILABLE, f"{where} cannot generate: {e.message}") from None
        except Exception as e:  # ONNX Runtime refusing the file or failing a run, say
            log.exception("%s: building its generation engine failed", where)
            raise EngineError(ErrorCode.UNAVAILABLE, f"{where} cannot generate: {e}") from None
        driver = EngineDriver(engine, model.name, model.version_str)
        cache, runner = engine.cache_config, engine.runner
        kv = KVSizing.of(cache, runner.blocks.bytes_per_token * cache.block_size)
        model.config = show_parameters(model.config, kv.parameters())  # the config endpoint's effective KV
        self._loaded[id(model)] = (model, GenerativeVersion(model, driver, chat, defaults))
        shared = runner.shared_group
        layout = "dense KV" if shared is None else \
            f"shared KV buffers {shared.nbytes / 2**20:.0f} MiB ({len(shared.buffers[0])} rows)"
        log.info("model %s version %s: generation engine ready, load check passed (%s; %s; context %d; %s; "
                 "chat template: %s)", model.name, model.version_str, kv.describe(), layout,
                 cache.max_model_len, runner.model.session.get_providers()[0],
                 "none (chat refused)" if chat.template is None else chat.template.source)
        folder = effective_values(model.config)
        if folder:  # a Hugging Face folder: what its files gave, and what the config overrode
            tokenizer = engine.tokenizer
            log.info("model %s version %s: from its folder: %s; EOS %s, BOS %s, KV %d heads of %d (%s)%s",
                     model.name, model.version_str, folder, tokenizer.eos_token_id, tokenizer.bos_token_id,
                     runner.model.heads, runner.model.head_dim, runner.model.kv_dtype.__name__,
                     "" if not defaults.describe() else f"; request defaults: {defaults.describe()}")

    async def release(self, model: Model) -> None:
        """End `model`'s engine: it finishes the requests it has, then its thread ends. Called by the
        version's `stop()`, once routing has moved away from it."""
        held = self._loaded.pop(id(model), None)
        if held is not None:
            await held[1].driver.close()
            log.info("model %s version %s: generation engine ended", model.name, model.version_str)

    async def close(self) -> None:
        """End every engine (the server is stopping: the frontends have drained)."""
        held, self._loaded = list(self._loaded.values()), {}
        await asyncio.gather(*(version.driver.close() for _, version in held), return_exceptions=True)


def check_adapter(version: GenerativeVersion, name: str) -> None:
    """On the loop, before a request queues: INVALID_ARG for a model that takes no adapters, NOT_FOUND for
    an adapter it does not have (the engine thread loads it: core/lora.py)."""
    adapters = version.driver.engine.adapters
    if adapters is None:
        raise EngineError(ErrorCode.INVALID_ARG, f"model '{version.model.name}' takes no LoRA adapters (its "
                                                 "graph has no lora_a/lora_b inputs)")
    adapters.check(name)
