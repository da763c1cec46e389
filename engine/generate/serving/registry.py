"""Which served models generate, and each one's engine: one `EngineDriver` per generative model version.

A generative model is loaded by the repository like any other (its config, its version policy, load and
unload, readiness); what makes it generative is its config's `generation` parameter (model_folder.py). The
first generation request to a version builds that version's engine (the ONNX Runtime session, the KV cache,
the tokenizer and chat template of its folder) on a worker thread; requests arriving meanwhile wait for the
same build. When routing moves to another version (a reload, an unload), the old version's engine finishes
what it has and its thread ends (`EngineDriver.close`).

One per server, in the process that holds the repository: with `--workers N` that is the engine process,
so there is one KV cache whichever frontend a client reached. Used on the loop only.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from ...config.model_config import ModelConfig
from ...errors import EngineError, ErrorCode, not_found
from ...model import Model, ModelState
from ...repository.routing import RoutingTable
from .chat_template import ChatTemplate, load_chat_template
from .driver import EngineDriver
from .model_folder import build_engine, is_generative

log = logging.getLogger("hubserve.generate")


@dataclass(frozen=True, slots=True)
class GenerativeVersion:
    """A generative model version ready to take requests: its engine's driver and its chat template."""

    model: Model
    driver: EngineDriver
    chat_template: ChatTemplate

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


class GenerationRegistry:
    def __init__(self, repository: RoutingTable) -> None:
        self.repository = repository
        # the OpenAI service's quotas, which Triton's generate paths charge too (set by the server)
        self.token_quotas: TokenCharger | None = None
        self._versions: dict[str, tuple[Model, asyncio.Future[GenerativeVersion]]] = {}
        self._closing: set[asyncio.Future[Any]] = set()

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
        """The driver of the version routing picks for `name`, built on first use."""
        self._evict_unserved()
        model = self.model(name)
        held = self._versions.get(name)
        if held is None or held[0] is not model:
            if held is not None:
                self._retire(held[1])
            future = asyncio.ensure_future(self._build(model))
            held = self._versions[name] = (model, future)
        return await asyncio.shield(held[1])

    def drivers(self) -> list[EngineDriver]:
        """Every engine of a served version (for metrics)."""
        self._evict_unserved()
        return [f.result().driver for _, f in self._versions.values()
                if f.done() and not f.cancelled() and f.exception() is None]

    async def _build(self, model: Model) -> GenerativeVersion:
        where = f"model '{model.name}'"
        try:
            engine, template = await asyncio.to_thread(
                lambda: (build_engine(model.config, model.model_path, model.model_dir),
                         load_chat_template(model.model_dir, where)))
        except EngineError as e:
            raise EngineError(ErrorCode.UNAVAILABLE, f"{where} cannot generate: {e.message}") from None
        except Exception as e:  # ONNX Runtime refusing the file, say
            log.exception("%s: building its generation engine failed", where)
            raise EngineError(ErrorCode.UNAVAILABLE, f"{where} cannot generate: {e}") from None
        driver = EngineDriver(engine, model.name, model.version_str)
        cache, runner = engine.cache_config, engine.runner
        shared = runner.shared_group
        layout = "dense KV" if shared is None else \
            f"shared KV buffers {shared.nbytes / 2**20:.0f} MiB ({len(shared.buffers[0])} rows)"
        log.info("%s version %s: generation engine ready (%d KV blocks of %d tokens, %.0f MiB; %s; "
                 "context %d)", model.name, model.version_str, cache.num_blocks, cache.block_size,
                 runner.cache.nbytes / 2**20, layout, cache.max_model_len)
        return GenerativeVersion(model, driver, template)

    def _retire(self, future: asyncio.Future[GenerativeVersion]) -> None:
        async def retire() -> None:
            try:
                version = await future
            except Exception:
                return
            await version.driver.close()

        task = asyncio.ensure_future(retire())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """End every engine (the server is stopping: the frontends have drained)."""
        for _, future in self._versions.values():
            self._retire(future)
        self._versions.clear()
        await asyncio.gather(*self._closing, return_exceptions=True)

    def _evict_unserved(self) -> None:
        """Retire the engines of versions no longer loaded (a model unloaded for good, whose name no request
        looks up again). Called by `version` and `drivers`: a scan of the loaded versions, a few objects."""
        loaded = {id(m) for m in self.repository.loaded_models()}
        for name, (model, future) in list(self._versions.items()):
            if model.state is ModelState.UNLOADING or id(model) not in loaded:
                del self._versions[name]
                self._retire(future)


def check_adapter(version: GenerativeVersion, name: str) -> None:
    """On the loop, before a request queues: INVALID_ARG for a model that takes no adapters, NOT_FOUND for
    an adapter it does not have (the engine thread loads it: core/lora.py)."""
    adapters = version.driver.engine.adapters
    if adapters is None:
        raise EngineError(ErrorCode.INVALID_ARG, f"model '{version.model.name}' takes no LoRA adapters (its "
                                                 "graph has no lora_a/lora_b inputs)")
    adapters.check(name)
