"""A generative model version as Triton's clients see it: a decoupled model over the generation engine.

The repository makes one `GenerativeModel` per version of a folder whose config declares `generation`
(signature.py gives it its tensors). It has no instances of its own: a request goes to the version's
`EngineDriver` (serving/driver.py), the same one the OpenAI API uses (serving/registry.py), so one KV cache
serves both APIs. Like every decoupled model it takes only requests with a stream (`request.stream`: gRPC
ModelStreamInfer, HTTP generate and generate_stream, a frontend process's session with --workers N); unary
ModelInfer and HTTP infer get Triton's decoupled refusal, as Triton answers its vLLM backend's models.

One request, on the loop (`submit`):
1. the inputs are checked against the config, the prompt and sampling options read (request_options.py);
2. a task takes the version's engine (built when the version loaded), tokenizes, checks the context and
   submits;
3. each step's `TokenEvent` becomes a response: with `stream` true one per new text piece (the last piece
   carries the final flag, or the flag comes alone), otherwise one response with the whole text at the end;
4. the future resolves with the final response; cancelling it (the client left) aborts the generation,
   whose KV blocks the engine thread frees before its next step.

A request sent with an API key that has `tokens_per_minute` (`InferenceRequest.owner`, set by the frontend
from its admission) is charged as the OpenAI API charges it (engine/openai/token_quotas.py): prompt +
max_tokens reserved before it reaches the engine (RESOURCE_EXHAUSTED with OpenAI's words when the key's
minute has no room: HTTP 429, an error on the gRPC stream), what it did not use given back when it ends; a
client that left keeps its whole reservation.

Statistics: the request's own as serving/accounting.py says (queue, one execution, its outcome), and each
response by its index (`response_stats`, as Triton keeps them for a decoupled model): success with the time
since the previous response (or since the hand-off to the engine), empty_response for a final flag sent alone,
fail for an error, cancel for a client that left.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from pathlib import Path
from typing import Protocol

import numpy as np

from ...config.model_config import ModelConfig
from ...errors import EngineError, decoupled_unary, invalid
from ...model import Model, ModelState
from ...types import EMPTY_FINAL, Completion, DataType, InferenceRequest, InferenceResponse, Tensor
from ..core.request import SamplingParams
from ..serving.accounting import RequestAccount
from ..serving.driver import TokenEvent
from ..serving.prompt import PromptDoor, PromptProblem, PromptRefused
from ..serving.registry import GenerativeVersion, Reservation, TokenCharger, check_adapter
from .request_options import RequestOptions, read_options
from .signature import TEXT_OUTPUT

log = logging.getLogger("hubserve.generate")


class GenerationSource(Protocol):
    """Where a version's engine comes from, and the per-key token quotas: serving/registry.py's
    GenerationRegistry."""

    token_quotas: TokenCharger | None

    async def version(self, name: str) -> GenerativeVersion: ...

    async def load(self, model: Model) -> None: ...

    async def release(self, model: Model) -> None: ...


class _Run:
    """One request in flight: its options, where it stands in the engine, its future, its statistics
    (`account`; `sent` responses so far, the last at `last_ns`), and its key's token reservation."""

    __slots__ = ("account", "engine_id", "future", "generated", "last_ns", "options", "pieces",
                 "prompt_tokens", "request", "reservation", "sent", "submitted", "task", "version")

    def __init__(self, request: InferenceRequest, options: RequestOptions,
                 future: asyncio.Future[InferenceResponse], account: RequestAccount) -> None:
        self.request = request
        self.options = options
        self.future = future
        self.account = account
        self.engine_id = f"triton-{uuid.uuid4().hex[:16]}"
        self.pieces: list[str] = []
        self.sent = 0
        self.last_ns = account.received_ns
        self.submitted = False
        self.task: asyncio.Task[None] | None = None
        self.version: GenerativeVersion | None = None
        self.reservation: Reservation | None = None  # of its key's tokens_per_minute
        self.prompt_tokens = 0
        self.generated = 0


class GenerativeModel(Model):
    def __init__(self, config: ModelConfig, version: int, model_path: Path, source: GenerationSource,
                 model_dir: Path | None = None) -> None:
        """`model_dir`: the model's folder, when it is not the model file's grandparent (a Hugging Face
        export whose version 1 is the folder's own files: kind.py)."""
        super().__init__(config, version, model_path)
        self.source = source
        self._model_dir = model_dir or model_path.parent.parent
        self._runs: set[_Run] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    async def start(self) -> None:
        """Build this version's engine and run its load check (serving/registry.py `load`, on a worker
        thread): READY only if it generates; otherwise the load fails with the reason."""
        await self.source.load(self)
        self.state = ModelState.READY

    async def stop(self) -> None:
        """Wait for the requests accepted, then end the engine (it finishes the OpenAI API's too). Called
        once, after routing moved."""
        self.state = ModelState.UNLOADING
        await self._idle.wait()
        await self.source.release(self)

    @property
    def model_dir(self) -> Path:
        return self._model_dir

    @property
    def pending_count(self) -> int:
        """Requests of either API in flight (serving/accounting.py): a /v1 request is one of this version's
        too."""
        return self.stats.generating

    def submit(self, request: InferenceRequest, received_ns: int = 0, on_done: Completion | None = None
               ) -> asyncio.Future[InferenceResponse]:
        """Check the request and start its generation (module docstring). Raises at once for a request
        without a stream (UNIMPLEMENTED / 501, Triton's words) or with bad inputs."""
        if request.stream is None:
            raise decoupled_unary()
        options = read_options(self.prepare(request), request.parameters)
        future: asyncio.Future[InferenceResponse] = asyncio.get_running_loop().create_future()
        account = RequestAccount(self.stats, self.name, self.version_str, request,
                                 received_ns or time.perf_counter_ns())
        run = _Run(request, options, future, account)
        future.add_done_callback(functools.partial(self._completed, run, on_done))
        self._runs.add(run)
        self._idle.clear()
        run.task = asyncio.ensure_future(self._start(run))
        return future

    async def _start(self, run: _Run) -> None:
        try:
            version = run.version = await self.source.version(self.name)
            ids, params = self._prompt(run.options, version)
            run.prompt_tokens = len(ids)
            quotas = self.source.token_quotas
            if quotas is not None and run.request.owner:  # as the OpenAI API charges it
                run.reservation = quotas.charge_triton(run.request.owner, len(ids) + params.max_tokens)
            version.driver.submit(run.engine_id, ids, params, functools.partial(self._on_event, run))
            run.submitted = True
            run.last_ns = run.account.submitted()  # its queue time: the prompt's tokenizing and checks
            log.debug("request %s (Triton id %r): generating for model '%s'", run.engine_id, run.request.id,
                      self.name)
        except EngineError as e:
            if not run.future.done():
                run.future.set_exception(e)

    def _prompt(self, options: RequestOptions, version: GenerativeVersion
                ) -> tuple[list[int], SamplingParams]:
        """The prompt through the generation APIs' one front door (serving/prompt.py), in Triton's words."""
        door = PromptDoor.of(version.driver.engine)
        params = version.defaults.apply(options.sampling)  # the folder's EOS ids (not its sampling defaults)
        try:
            keep = options.truncate_prompt_tokens
            ids = door.tokens(options.prompt, keep_last=door.context_tokens if keep == -1 else keep)
            if params.lora is not None:
                check_adapter(version, params.lora)
            door.budget(len(ids), params.max_tokens)
        except PromptRefused as e:
            raise self._refusal(e) from None
        return ids, params

    def _refusal(self, refused: PromptRefused) -> EngineError:
        """A prompt refused (serving/prompt.py) as INVALID_ARG naming text_input, Triton's field."""
        limit, problem = refused.context_tokens, refused.problem
        if problem is PromptProblem.TOO_LONG_TO_TOKENIZE:
            return invalid(f"text_input of {refused.value} characters is far longer than model "
                           f"'{self.name}''s context of {limit} tokens")
        if problem is PromptProblem.EMPTY:
            return invalid("text_input is empty after tokenizing: send at least one token")
        if problem is PromptProblem.TOKEN_OUTSIDE_VOCABULARY:  # a text prompt: never
            return invalid(f"text_input token id {refused.value} is outside the vocabulary "
                           f"(0 - {refused.vocab_size - 1})")
        return invalid(f"model '{self.name}' has a context of {limit} tokens; the prompt's {refused.value} "
                       f"tokens plus max_tokens {refused.max_tokens} exceed it")

    def _on_event(self, run: _Run, event: TokenEvent) -> None:
        """A step's news for this request, on the loop (serving/driver.py `_deliver`)."""
        future = run.future
        if future.done():
            return
        if event.error is not None:
            future.set_exception(event.error)
            return
        run.generated += event.num_tokens
        if run.options.stream:
            if event.text and not event.finished:
                assert run.request.stream is not None
                run.request.stream(self._response(run, event.text))
                self._responded(run, "success", time.perf_counter_ns() - run.last_ns)
            elif event.finished:
                future.set_result(self._response(run, event.text) if event.text else EMPTY_FINAL)
            return
        if event.text:
            run.pieces.append(event.text)
        if event.finished:
            prefix = "" if run.options.exclude_input else run.options.prompt
            future.set_result(self._response(run, prefix + "".join(run.pieces)))

    def _response(self, run: _Run, text: str) -> InferenceResponse:
        data = np.array([text.encode()], dtype=object)
        output = Tensor(TEXT_OUTPUT, DataType.BYTES, (1,), data)
        return InferenceResponse(self.name, self.version_str, [output], id=run.request.id)

    def _responded(self, run: _Run, kind: str, ns: int) -> None:
        """Response number `run.sent` of the request, `kind` as Triton's response statistics count it."""
        self.stats.record_response(run.sent, ns, kind)
        run.sent += 1
        run.last_ns = time.perf_counter_ns()

    def _completed(self, run: _Run, on_done: Completion | None,
                   future: asyncio.Future[InferenceResponse]) -> None:
        """The future's one done-callback: abort what still runs (a cancel), account, then answer. The last
        response is counted here: success, empty_response (the final flag alone), fail (an error), or
        cancel (the client left: its duration is the clean-up's, as Triton's)."""
        now = time.perf_counter_ns()
        if future.cancelled() or future.exception() is not None:
            if run.task is not None and not run.task.done():
                run.task.cancel()
            if run.submitted and run.version is not None:
                run.version.driver.abort(run.engine_id)
        if run.reservation is not None and not future.cancelled():  # a client that left keeps its reservation
            run.reservation.settle(run.prompt_tokens + run.generated if run.submitted else 0)
        if future.cancelled():
            self._responded(run, "cancel", time.perf_counter_ns() - now)
            run.account.finish(None, cancelled=True)
        elif future.exception() is not None:
            self._responded(run, "fail", now - run.last_ns)
            run.account.finish(future.exception())
        else:
            kind = "empty_response" if future.result() is EMPTY_FINAL else "success"
            self._responded(run, kind, now - run.last_ns)
            run.account.finish(None)
        self._runs.discard(run)
        if not self._runs:
            self._idle.set()
        if on_done is not None:
            on_done(future)
