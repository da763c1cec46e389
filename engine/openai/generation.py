"""One API request in the engine: its choices (n per prompt), each one engine request, and what they produced.

Made and used on the loop by service.py. Each choice's events come from the driver
(engine/generate/serving/driver.py) through `_on_event`; the request is done when every choice finished, or at
the first error (the others are then aborted). A listener (the SSE stream) sees each event as it comes;
without one, the events only accumulate, for the one JSON answer.

It also counts as one request of its model version in Triton's statistics (`account`,
engine/generate/serving/accounting.py): handed to the engine when every choice is submitted; success when
every choice finished, fail at an error, cancelled when it is aborted before that (its client left, its job
was cancelled, the server stopped).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import EngineError
from ..generate.core.request import SamplingParams
from ..generate.serving.accounting import RequestAccount
from ..generate.serving.driver import EngineDriver, ShownLogprob, TokenEvent
from .tools.calls import ChoiceCalls, ToolCallParser


@dataclass(slots=True)
class Choice:
    index: int
    engine_id: str
    prompt_tokens: int
    text: list[str] = field(default_factory=list)
    completion_tokens: int = 0
    finish_reason: str | None = None
    submitted: bool = False  # in the engine: only then may it be aborted (its id is ours)
    logprobs: list[ShownLogprob] = field(default_factory=list)  # when asked for: one per token
    logprob_marks: list[int] = field(default_factory=list)  # len(logprobs) when each piece of text came

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


Listener = Callable[[Choice, TokenEvent], None]


class Generation:
    def __init__(self, driver: EngineDriver, request_id: str, prompts: list[list[int]], n: int,
                 params: SamplingParams, account: RequestAccount | None = None) -> None:
        self.driver = driver
        self.account = account
        self._started = False
        self.request_id = request_id
        self.params = params
        self.choices: list[Choice] = []
        for p, prompt in enumerate(prompts):
            for j in range(n):
                index = p * n + j
                engine_id = request_id if len(prompts) * n == 1 else f"{request_id}-{index}"
                self.choices.append(Choice(index, engine_id, len(prompt)))
        self._prompts = prompts
        loop = asyncio.get_running_loop()
        self.first: asyncio.Future[None] = loop.create_future()  # the first event of any choice (or error)
        self.done: asyncio.Future[None] = loop.create_future()   # every choice finished (or an error)
        self.error: EngineError | None = None
        self.listener: Listener | None = None
        self._left = len(self.choices)
        # a chat with tools (tool_choice auto): each choice's answer is read for calls (service.py sets it)
        self.tool_parser: Callable[[], ToolCallParser] | None = None
        self.parallel_tool_calls = True

    def tool_calls(self) -> ChoiceCalls | None:
        """A new reading of one choice's answer for tool calls; None when it is not read for any."""
        if self.tool_parser is None:
            return None
        return ChoiceCalls(self.tool_parser(), self.parallel_tool_calls)

    @property
    def prompt_tokens(self) -> int:
        """Usage counts each prompt once, however many choices it has (as OpenAI does)."""
        return sum(len(p) for p in self._prompts)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)

    def start(self) -> None:
        """Submit every choice; an error here (a duplicate request id) aborts those already submitted."""
        n = len(self.choices) // len(self._prompts)
        seed = self.params.seed
        try:
            for choice in self.choices:
                prompt = self._prompts[choice.index // n]
                on_event = functools.partial(self._on_event, choice)
                # a seeded request's choices differ from each other and are each reproducible: seed + j
                params = self.params if seed is None or choice.index % n == 0 else \
                    dataclasses.replace(self.params, seed=seed + choice.index % n)
                # one group: the scheduler admits its choices in turn with other requests'
                # (generate/core/waiting.py)
                self.driver.submit(choice.engine_id, prompt, params, on_event, group=self.request_id)
                choice.submitted = True
        except EngineError:
            self.abort()
            if self.account is not None:
                self.account.drop()
            raise
        self._started = True
        if self.account is not None:
            self.account.submitted()

    def abort(self) -> None:
        """Stop every choice still running (the client left, or another choice failed)."""
        if self.error is None and self._left:
            self._account(None, cancelled=True)
        for choice in self.choices:
            if not choice.finished:
                choice.finish_reason = "abort"
                if choice.submitted:
                    self.driver.abort(choice.engine_id)

    def _on_event(self, choice: Choice, event: TokenEvent) -> None:
        if choice.finished:
            return
        if event.error is not None:
            self.error = event.error
            choice.finish_reason = "error"
            self._account(event.error)
            self.abort()
            self._settle(self.first)
            self._settle(self.done)
            if self.listener is not None:
                self.listener(choice, event)
            return
        if event.text:
            choice.text.append(event.text)
        if event.logprobs:
            choice.logprobs.extend(event.logprobs)
        if event.text:
            choice.logprob_marks.append(len(choice.logprobs))
        choice.completion_tokens += event.num_tokens
        if event.finished:
            choice.finish_reason = event.finish_reason or "stop"
            self._left -= 1
        self._settle(self.first)
        if self._left == 0:
            self._account(None)
            self._settle(self.done)
        if self.listener is not None:  # after `done`: the listener's last event sees the generation done
            self.listener(choice, event)

    def _account(self, error: EngineError | None, cancelled: bool = False) -> None:
        if self._started and self.account is not None:
            self.account.finish(error, cancelled)  # once: later calls do nothing

    @staticmethod
    def _settle(future: asyncio.Future[None]) -> None:
        if not future.done():
            future.set_result(None)
