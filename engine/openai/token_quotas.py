"""Per-key `tokens_per_minute` for generation (docs/security.md "Quotas and backpressure"): the one place it
is charged.

`OpenAIService.start` calls `charge` once a request's cost is known and before it reaches the engine, and
Triton's generate paths call `charge_triton` likewise (generate/triton/model.py), so one bucket per key
counts every generation whichever protocol asked for it. The cost reserved is what the request may use at
most: its prompt tokens plus `max_tokens` for every choice (when `max_tokens` is not given, what the context
leaves). When it finishes, the tokens it did not use (it
stopped early) go back to the key; a request whose client left keeps its whole reservation.

The keys are the `--api-keys` file's, each bucket found by the key's owner id (engine/access/api_keys.py
`owner_id`): the request's owner, which the frontend's access policy (engine/access/policy.py) decided once,
in constant time, as the request's head arrived (HttpRequest.owner, InferenceRequest.owner; a Batch API job's
stored owner). Nothing here reads a header. This runs in the process that holds the engines (with
`--workers N`, the engine process, where every /v1 request is forwarded and every inference submitted, with
its owner), so one bucket per key serves every frontend and the limit holds server-wide exactly, with no
share to split.
"""

from __future__ import annotations

import math
import time

from ..access.api_keys import ApiKey
from ..access.quotas import TokenQuota, retry_after_secs
from ..errors import EngineError, ErrorCode
from .errors import OpenAIError

# OpenAI's own answer to a request over a tokens-per-minute limit: 429, type "tokens".
RATE_LIMIT_TYPE = "tokens"
RATE_LIMIT_CODE = "rate_limit_exceeded"


class Reservation:
    """What one request holds of its key's minute: `settle` gives back what it did not use."""

    __slots__ = ("quota", "tokens")

    def __init__(self, quota: TokenQuota, tokens: int) -> None:
        self.quota = quota
        self.tokens = tokens

    def settle(self, used: int) -> None:
        """The request finished having used `used` tokens (prompt + generated); called at most once."""
        if used < self.tokens:
            self.quota.give_back(self.tokens - used)
        self.tokens = 0


class TokenQuotas:
    """One per OpenAIService. Keys without `tokens_per_minute` are not counted."""

    def __init__(self, keys: tuple[ApiKey, ...], now: float | None = None) -> None:
        start = time.monotonic() if now is None else now
        self._quotas = {k.owner: (k, TokenQuota(k.tokens_per_minute, start))
                        for k in keys if k.tokens_per_minute is not None}

    def charge(self, owner: str, tokens: int, now: float | None = None) -> Reservation | None:
        """Reserve `tokens` of the minute of the key whose owner id is `owner` (the request's), or raise
        OpenAIError 429 with a Retry-After. None when the key has no token limit (or there is no key: "")."""
        entry = self._quotas.get(owner)
        if entry is None:
            return None
        key, quota = entry
        wait = quota.take(tokens, time.monotonic() if now is None else now)
        if not wait:
            return Reservation(quota, tokens)
        limit = key.tokens_per_minute
        if math.isinf(wait):
            raise OpenAIError(429, "Request too large for tokens per min (TPM) on this API key: "
                                   f"Limit {limit}, Requested {tokens}. The input or output tokens must be "
                                   "reduced (lower max_tokens or n, or shorten the prompt) in order to run "
                                   "successfully.",
                              RATE_LIMIT_TYPE, None, RATE_LIMIT_CODE, retry_after_secs=60)
        secs = retry_after_secs(wait)
        raise OpenAIError(429, f"Rate limit reached for tokens per min (TPM) on this API key: Limit {limit}, "
                               f"Used {quota.used}, Requested {tokens}. Please try again in {secs}s.",
                          RATE_LIMIT_TYPE, None, RATE_LIMIT_CODE, retry_after_secs=secs)

    def charge_triton(self, owner: str, tokens: int, now: float | None = None) -> Reservation | None:
        """`charge` for a generation through Triton's protocols (generate, generate_stream, ModelStreamInfer:
        generate/triton/model.py; `owner` is InferenceRequest.owner). The same bucket and rule; a refusal is
        the engine's RESOURCE_EXHAUSTED with the words of OpenAI's 429 (HTTP 429; on a gRPC stream, its
        error message)."""
        try:
            return self.charge(owner, tokens, now)
        except OpenAIError as e:
            raise EngineError(ErrorCode.RESOURCE_EXHAUSTED, e.message) from None


# The part of a key's minute that its Batch API jobs leave to its interactive requests: a job's request is
# charged only while the key would keep this much after it, so a running job never makes the key's own
# interactive requests wait (they get the refill first) and still runs at the whole rate when they are idle.
BATCH_RESERVE = 0.25


class QuotaWait(Exception):
    """A Batch API request's tokens do not fit in its key's minute yet: retry in `secs` seconds (a job waits
    for its key's budget rather than fail: engine/openai/batch/runner.py)."""

    def __init__(self, secs: float) -> None:
        super().__init__(f"tokens_per_minute: retry in {secs:.2f}s")
        self.secs = secs


def charge_waiting(quotas: TokenQuotas, owner: str, tokens: int,
                   now: float | None = None) -> Reservation | None:
    """The Batch API's charge: `tokens` of the minute of the key that owns the job (its stored owner id: a job
    runs without a request, and on after a restart), leaving BATCH_RESERVE of the minute to the key's
    interactive requests. None when the key has no token limit. Raises QuotaWait when they do not fit yet,
    and OpenAIError 429 (the request's own failure, as `charge` answers it) when they never will: more than
    a minute's worth."""
    entry = quotas._quotas.get(owner)
    if entry is None:
        return None
    key, quota = entry
    reserve = max(0, min(int(quota.capacity * BATCH_RESERVE), int(quota.capacity) - tokens))
    wait = quota.take(tokens + reserve, time.monotonic() if now is None else now)
    if not wait:
        quota.give_back(reserve)
        return Reservation(quota, tokens)
    if math.isinf(wait):
        raise OpenAIError(429, "Request too large for tokens per min (TPM) on the API key that owns this "
                               f"batch: Limit {key.tokens_per_minute}, Requested {tokens}. The input or "
                               "output tokens must be reduced (lower max_tokens or n, or shorten the prompt) "
                               "in order to run successfully.", RATE_LIMIT_TYPE, None, RATE_LIMIT_CODE)
    raise QuotaWait(wait)
