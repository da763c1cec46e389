"""Canary readiness: a periodic synthetic inference on every instance of every served version, with a
deadline, so readiness says whether a model still answers, not only that it once loaded.

A version whose canary fails or misses its deadline (a hung instance, a dead Python process, a backend that
started raising) turns UNAVAILABLE with the reason, in its ready endpoint, the repository index and the
`hubserve_model_canary_healthy` metric; server readiness follows in strict mode. It turns READY again when a
canary passes. Requests are refused while it is UNAVAILABLE, as for any version that is not ready: a
Kubernetes readiness probe then moves traffic to replicas that answer. A canary that failed while one of the
version's instances was down (a Python instance killed or crashed, then restarted) is run again as soon as
that instance serves: it judged the process that is gone, and would keep a working version UNAVAILABLE
until the next round.

Why canaries go to the instances directly, as warm-up does (InstancePool.canary), and not through the queue:
- a canary stuck behind a long queue would turn a replica not-ready exactly when it is loaded, and a
  load balancer taking loaded replicas out makes the others overloaded in turn: load is not ill health;
- canaries are not traffic, so the statistics extension and the metrics never count them (as warm-up).
Each instance has at most one canary outstanding: a hung instance is not handed a new one every interval
(it would queue behind the hung run on the instance's thread); it stays failing, with how long it has not
answered, until the outstanding run comes back.

The inputs are the first warm-up sample when the config has `model_warmup` (the operator's own valid data:
any error fails the canary), else generated from the signature (zeros, strings "0", variable dims as 1):
such inputs may be meaningless to the model, so an error the model raises on them still shows a live path
and passes; only a missed deadline or an instance that cannot run at all (UNAVAILABLE) fails.

Not canaried: sequence models (a request outside a sequence would be refused, one inside would take a
slot), decoupled models (their answers go to a response sender, not back from execute), ensembles (their
composing models are), and versions without instances.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config.model_config import ModelConfig
from ..errors import EngineError, ErrorCode
from ..types import DataType
from . import warmup

log = logging.getLogger("hubserve.canary")

SOURCE = "canary"  # the Model health source the canary reports under (Model.set_health)
RECHECK_S = 0.25  # how often, between rounds, the runner looks for versions whose instances came back


@dataclass(frozen=True, slots=True)
class CanaryOptions:
    interval_secs: float = 10.0  # 0 = no canaries
    timeout_secs: float = 5.0


@dataclass(slots=True)
class CanaryRecord:
    """What the canary knows of one version: read by the metrics."""

    runs: int = 0
    failures: int = 0
    failing: str = ""  # why the last canary failed; "" when it passed (or has not run yet)
    started: float = 0.0  # time.monotonic() when the last canary began
    last_ms: float = 0.0  # how long the last passing canary took (its slowest instance, within a loop turn)


@dataclass(frozen=True, slots=True)
class Sample:
    inputs: dict[str, np.ndarray]
    strict: bool  # the operator's data (a warm-up sample): any error fails


def eligible(config: ModelConfig) -> bool:
    return config.sequence_batching is None and config.platform_name != "ensemble" and not config.decoupled


def sample(config: ModelConfig, model_dir: Any) -> Sample:
    """The canary's inputs: the first warm-up sample, or inputs generated from the signature."""
    if config.warmup:
        first = warmup.build_samples(config, model_dir)[0]
        return Sample(first.inputs, strict=True)
    lead = (1,) if config.max_batch_size > 0 else ()
    inputs: dict[str, np.ndarray] = {}
    for spec in config.inputs:
        if spec.optional:
            continue
        shape = lead + tuple(1 if d < 0 else d for d in spec.dims)
        if spec.datatype is DataType.BYTES:
            # zero as text: a model that parses numbers from strings (Triton's simple_string) takes it, where
            # an empty string made ONNX Runtime log a failed Cast every round
            inputs[spec.name] = np.full(shape, b"0", dtype=object)
        else:
            inputs[spec.name] = np.zeros(shape, dtype=spec.datatype.numpy_dtype)
    return Sample(inputs, strict=False)


def verdict(error: BaseException | None, strict: bool) -> str:
    """Why an instance's canary run failed ("" when it passed). Pure: the policy, tested on its own."""
    if error is None:
        return ""
    detail = error.message if isinstance(error, EngineError) else f"{type(error).__name__}: {error}"
    if strict:
        return detail
    if isinstance(error, EngineError) and error.code is ErrorCode.UNAVAILABLE:
        return detail
    return ""  # the model answered generated inputs with an error of its own: its path is alive


class CanaryRunner:
    """Runs the canaries of every loaded version, every `interval_secs`, on the event loop of the process
    that holds the repository (the engine process when there are frontend processes)."""

    def __init__(self, repository: Any, options: CanaryOptions) -> None:
        self._repository = repository
        self._options = options
        self._samples: dict[int, Sample] = {}  # id(model) -> its sample, built once per version
        self._outstanding: dict[tuple[int, int], tuple[asyncio.Future[Any], float]] = {}

    async def run(self) -> None:
        """A round every `interval_secs`; between rounds, every RECHECK_S, a version whose last canary failed
        while one of its instances was down and has served again since (a Python instance restarted:
        Model.instances_back) is checked again at once: that failure judged the process that is gone, and
        the version would otherwise stay UNAVAILABLE for the rest of the interval with a working instance."""
        interval = self._options.interval_secs
        next_round = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(min(RECHECK_S, next_round - time.monotonic()), 0))
            loaded = self._repository.loaded_models()
            if time.monotonic() < next_round:
                stale = [m for m in loaded if self._stale(m)]
                if stale:
                    await asyncio.gather(*(self.check(m) for m in stale), return_exceptions=True)
                continue
            models = [m for m in loaded if self._due(m)]
            live = {id(m) for m in loaded}
            for key in [k for k in self._samples if k not in live]:
                del self._samples[key]
            await asyncio.gather(*(self.check(m) for m in models), return_exceptions=True)
            next_round = time.monotonic() + interval

    def _stale(self, model: Any) -> bool:
        """Due, its last canary failed, and one of its instances came back since that canary began."""
        return self._due(model) and bool(model.canary.failing) and model.instances_back > model.canary.started

    def _due(self, model: Any) -> bool:
        """READY versions, and those the canary itself turned UNAVAILABLE (to see them recover)."""
        if getattr(model, "pool", None) is None or not eligible(model.config):
            return False
        return model.canary_due()

    async def check(self, model: Any) -> str:
        """One canary of `model` on each of its instances; reports the verdict to the model and returns it."""
        record: CanaryRecord = model.canary
        record.started = time.monotonic()
        try:
            picked = self._samples.get(id(model))
            if picked is None:
                picked = await asyncio.to_thread(sample, model.config, model.model_dir)
                self._samples[id(model)] = picked
        except EngineError as e:
            reason = f"canary inputs could not be built: {e.message}"
        else:
            reason = await self._run(model, picked)
        record.runs += 1
        if reason:
            record.failures += 1
            if record.failing != reason:
                log.warning("model %s version %s: canary failed: %s", model.name, model.version_str, reason)
        elif record.failing:
            log.info("model %s version %s: canary passed again", model.name, model.version_str)
        record.failing = reason
        model.set_health(SOURCE, f"canary failed: {reason}" if reason else "")
        return reason

    async def _run(self, model: Any, picked: Sample) -> str:
        timeout = self._options.timeout_secs
        outputs = [o.name for o in model.config.outputs]
        waits: list[tuple[str, asyncio.Future[Any] | None, float]] = []
        for index, name in enumerate(model.pool.instance_names):
            key = (id(model), index)
            held = self._outstanding.get(key)
            if held is not None and not held[0].done():
                waits.append((name, None, held[1]))  # still running from an earlier canary
                continue
            started = time.monotonic()
            future = model.pool.canary(index, picked.inputs, outputs)
            self._outstanding[key] = (future, started)
            waits.append((name, future, started))
        futures = [f for _, f, _ in waits if f is not None]
        if futures:
            await asyncio.wait(futures, timeout=timeout)
        reasons = []
        now = time.monotonic()
        for name, future, started in waits:
            if future is None or not future.done():
                reasons.append(f"instance '{name}' has not answered for {now - started:.1f} s "
                               f"(deadline {timeout:g} s)")
                continue
            error = future.exception()
            why = verdict(error, picked.strict)
            if why:
                reasons.append(f"instance '{name}': {why}")
        for index in range(len(waits)):
            key = (id(model), index)
            held = self._outstanding.get(key)
            if held is not None and held[0].done():
                del self._outstanding[key]
        if not reasons and waits:
            model.canary.last_ms = (now - min(started for _, _, started in waits)) * 1000
        return "; ".join(reasons)


__all__ = ["CanaryOptions", "CanaryRecord", "CanaryRunner", "Sample", "eligible", "sample", "verdict"]
