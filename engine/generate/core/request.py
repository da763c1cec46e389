"""A generation request: what the client asked (`SamplingParams`, frozen) and where it stands (`Request`).

A `Request` is a small state machine owned by the scheduler (scheduler.py):

    WAITING ──admitted──► RUNNING ──stop / length──► FINISHED
       ▲                     │
       └─────PREEMPTED ◄─────┘  (its blocks ran out: they are freed, and the request waits to be recomputed)

Its tokens are the prompt followed by what it generated; `num_computed_tokens` says how many of them have
their keys and values in the KV cache. Preemption only resets that count to zero: the generated tokens are
kept, so recomputing them (one prefill over prompt + output) loses nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from ...errors import EngineError, invalid
from .detokenize import OutputText
from .grammar import Constraint, GrammarSpec
from .lora import LoraAdapter


class RequestState(enum.Enum):
    WAITING = "waiting"      # not yet admitted: no blocks
    RUNNING = "running"      # holds blocks; scheduled every step until it finishes
    PREEMPTED = "preempted"  # lost its blocks to another request; waits first in line to be recomputed
    FINISHED = "finished"    # done; `finish_reason` says why, its blocks are freed


class Priority(enum.IntEnum):
    """Which requests the scheduler serves first (lower first): interactive API requests before offline batch
    jobs (engine/openai/batch_runner.py), so a job running never delays an interactive stream's tokens."""

    INTERACTIVE = 0
    BATCH = 1


MAX_LOGPROBS = 20  # most likely tokens reported per generated token (OpenAI's top_logprobs limit)

# What a request's stop rules may hold. They are checked after every token it generates, on the engine's
# thread, so their size must not be the client's to choose (issue 27, hole 4): each protocol refuses more in
# its own form before a request is made (openai/protocol.py, triton/request_options.py), and `SamplingParams`
# holds the bounds for every caller.
MAX_STOP_STRINGS = 4         # a request's own stop strings (OpenAI's limit); a chat template may add as many
MAX_STOP_STRING_CHARS = 256  # characters of one stop string
MAX_STOP_TOKEN_IDS = 128     # a request's stop token ids (held in a set: one lookup per token)


class FinishReason(enum.Enum):
    STOP = "stop"        # a stop token, the end-of-sequence token or a stop string (OpenAI's "stop")
    LENGTH = "length"    # max_tokens, or the model's context is full (OpenAI's "length")
    ABORT = "abort"      # the caller aborted it (a client gone)
    ERROR = "error"      # it failed alone (its grammar, grammar.py): `RequestOutput.error` says why


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token, and when to stop. Checked once, when the request is made.

    First the penalties change the logits (sampler.py `penalize`, vLLM's order): `repetition_penalty`
    (vLLM's extension, 1: off) over the prompt's and the generated tokens, then OpenAI's
    `frequency_penalty` and `presence_penalty` (0: off) over the generated ones. temperature 0 is greedy
    (argmax of those logits). Otherwise logits are divided by the temperature, then cut to the `top_k` most
    likely tokens (0: all), then to the smallest set whose probability reaches `top_p`, and one token is
    drawn with the request's own generator, seeded by `seed` (None: a fresh seed from the engine's
    generator), so a seeded request gives the same tokens whatever else runs beside it. `min_p` (vLLM's)
    first drops the tokens less likely than `min_p` × the most likely one's probability, before top-k.
    Until `min_tokens` tokens are generated, the end-of-sequence token and the stop tokens cannot be drawn
    (sampler.py `hold_stops`) and stop strings do not stop (stopping.py), as vLLM serves it.
    `structured` constrains every draw to the tokens its grammar allows next (grammar.py), EOS only where
    the grammar may end; the request stops when the grammar is complete.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0                    # vLLM's, in [0, 1]: 0 keeps every token
    seed: int | None = None
    stop: tuple[str, ...] = ()            # stop strings: the text ends before the first one
    stop_token_ids: frozenset[int] = frozenset()  # stop tokens: generated, then generation stops
    ignore_eos: bool = False              # keep going past the model's end-of-sequence token
    min_tokens: int = 0                   # vLLM's: no stop (EOS, stop token or string) before this many
    include_stop_str_in_output: bool = False  # vLLM's: the stop string found ends the text, not cut off
    skip_special_tokens: bool = True      # vLLM's: special tokens are left out of the text (tokenizer.py)
    presence_penalty: float = 0.0         # OpenAI's, in [-2, 2]: once for each token generated at least once
    frequency_penalty: float = 0.0        # OpenAI's, in [-2, 2]: per time a token was generated
    repetition_penalty: float = 1.0       # vLLM's (CTRL's), > 0: for each token of the prompt or the output
    priority: Priority = Priority.INTERACTIVE  # the scheduling class (scheduler.py), not a sampling knob
    lora: str | None = None               # the LoRA adapter to run with (lora.py), None: the base model
    logprobs: int | None = None           # report each token's log-probability and this many most likely
    structured: GrammarSpec | None = None  # what the output must match (grammar.py), None: anything

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise invalid(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            raise invalid(f"temperature must be between 0 and 100, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise invalid(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise invalid(f"top_k must be 0 (all tokens) or positive, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise invalid(f"min_p must be between 0 and 1, got {self.min_p}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise invalid(f"min_tokens must be between 0 and max_tokens ({self.max_tokens}), got "
                          f"{self.min_tokens}")
        if any(not s for s in self.stop):
            raise invalid("stop strings must not be empty")
        if len(self.stop) > 2 * MAX_STOP_STRINGS:
            raise invalid(f"{len(self.stop)} stop strings; at most {MAX_STOP_STRINGS} of the request's own "
                          f"and {MAX_STOP_STRINGS} of a chat template's")
        longest = max(map(len, self.stop), default=0)
        if longest > MAX_STOP_STRING_CHARS:
            raise invalid(f"a stop string of {longest} characters; each may have at most "
                          f"{MAX_STOP_STRING_CHARS}")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise invalid(f"{len(self.stop_token_ids)} stop token ids; send at most {MAX_STOP_TOKEN_IDS}")
        if not isinstance(self.stop_token_ids, frozenset):  # a tuple or list given: one lookup per token
            object.__setattr__(self, "stop_token_ids", frozenset(self.stop_token_ids))
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise invalid(f"{name} must be between -2 and 2, got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 100.0:
            raise invalid(f"repetition_penalty must be in (0, 100], got {self.repetition_penalty}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise invalid(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Its logits depend on the tokens so far, not only on the model."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    @property
    def stepwise(self) -> bool:
        """Each token must be recorded before the next is computed: its penalties count the tokens so far,
        or it reports each token's log-probabilities, or its stops are held until `min_tokens`, or its
        grammar's mask depends on the last token (engine.py `_steps`: one step per schedule)."""
        return (self.penalized or self.logprobs is not None or self.min_tokens > 0
                or self.structured is not None)


@dataclass(slots=True)
class Request:
    """One sequence being generated. Created by the engine (engine.py); mutated only by the scheduler."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    rng: np.random.Generator                 # the request's own: sampling draws only from it
    arrival: int = 0                         # admission order: the scheduler preempts the latest first
    state: RequestState = RequestState.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0             # tokens whose keys and values are in the KV cache
    num_cached_tokens: int = 0               # of the prompt, found in the prefix cache at admission
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    output_text: str = ""                    # the decoded output, cut before a stop string (once finished)
    text: OutputText | None = None           # the output as text so far (made by the engine's add_request)
    adapter: LoraAdapter | None = None       # params.lora's matrices (set by the engine at add_request)
    grammar: Constraint | None = None        # params.structured's position (set by the engine at add_request)
    # The API request it is one sequence of (OpenAI's prompts × n share one): admission takes the groups in
    # turn (waiting.py). "" (a sequence alone): its own id.
    group: str = ""

    def __post_init__(self) -> None:
        if not self.group:
            self.group = self.request_id

    @property
    def prefix_salt(self) -> int:
        """What its blocks' hashes start from: an adapter changes the keys and values of the same tokens."""
        return 0 if self.adapter is None else self.adapter.salt

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def finished(self) -> bool:
        return self.state is RequestState.FINISHED


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token's log-probability under the model: the log-softmax of the raw logits it was
    picked from (before penalties, temperature, top-k and top-p, as vLLM reports by default), and the `top`
    most likely tokens' (id, log-probability), most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """What one step did for one request: the tokens it generated this step (none during a prefill chunk),
    the text they let its client be shown and, once it finished, why. Returned by `GenerationEngine.step()`
    for every request that advanced."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: FinishReason | None = None
    output_token_ids: tuple[int, ...] = ()  # all of them, once finished
    output_text: str = ""                   # set when finished
    logprobs: tuple[TokenLogprob, ...] = ()  # one per new token, when its params ask for them
    # what this step adds to the text the client may be shown (detokenize.py `OutputText.release`: a stop
    # string's possible start and an incomplete character held back; the rest of output_text when finished)
    new_text: str = ""
    text_ends: tuple[int, ...] = ()         # per new token, the output text's length through it
    error: EngineError | None = None        # why it failed (finish_reason ERROR): its client gets this
