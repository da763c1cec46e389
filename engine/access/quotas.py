"""The counters behind per-key quotas and the server-wide in-flight byte budget, pure: time is passed in, so
the tests are plain functions. Owned by `AccessPolicy` (policy.py), which the frontends ask; nothing here
waits: a request that does not fit is refused at once, with how long until it would.
"""

from __future__ import annotations

import math


class TokenBucket:
    """`rate` requests a second with a burst of one second's worth (`rate` tokens, at least one). A request
    takes one token; the bucket refills continuously."""

    __slots__ = ("capacity", "rate", "stamp", "tokens")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.capacity = max(rate, 1.0)
        self.tokens = self.capacity
        self.stamp = now

    def take(self, now: float) -> float:
        """Take a token: 0.0 if one was there, else the seconds until one will be (nothing taken)."""
        if now < self.stamp:  # clocks of two callers a moment apart: never refill backwards
            now = self.stamp
        tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return 0.0
        self.tokens = tokens
        return (1.0 - tokens) / self.rate

    def give_back(self) -> None:
        """Return the token just taken (a later check refused the request)."""
        self.tokens = min(self.capacity, self.tokens + 1.0)


class TokenQuota:
    """A key's generated-API tokens a minute (`tokens_per_minute`): a bucket of one minute's worth that
    refills continuously. A request reserves its cost up front (`take`); what it did not use goes back when
    it finishes (`give_back`)."""

    __slots__ = ("capacity", "rate", "stamp", "tokens")

    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.tokens = self.capacity
        self.stamp = now

    def take(self, amount: int, now: float) -> float:
        """Reserve `amount` tokens: 0.0 if they were there, else the seconds until they will be (nothing
        taken); math.inf when `amount` is more than a minute's worth, which never fits."""
        if now > self.stamp:
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        if amount <= self.tokens:
            self.tokens -= amount
            return 0.0
        if amount > self.capacity:
            return math.inf
        return (amount - self.tokens) / self.rate

    @property
    def used(self) -> int:
        """Tokens reserved within the last minute, as of the last `take` (for the refusal's message)."""
        return int(self.capacity - self.tokens)

    def give_back(self, amount: int) -> None:
        self.tokens = min(self.capacity, self.tokens + amount)


class Concurrency:
    """Requests of one key in flight at once, at most `limit`."""

    __slots__ = ("inflight", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.inflight = 0

    def enter(self) -> bool:
        if self.inflight >= self.limit:
            return False
        self.inflight += 1
        return True

    def leave(self) -> None:
        self.inflight -= 1


class ByteBudget:
    """Request bytes held at once, at most `limit`: the server-wide budget of bodies and messages received
    and not yet answered (--max-inflight-bytes: memory stays bounded when many clients send large requests
    together), and one HTTP/2 connection's partial and waiting messages (frontend/h2/). `take` before holding,
    `give` when the bytes are handed on or dropped."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        """Reserve `size` bytes; False, reserving nothing, when they do not fit."""
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size


def retry_after_secs(wait: float) -> int:
    """A wait as the whole seconds of HTTP's Retry-After: rounded up, at least 1."""
    return max(1, math.ceil(wait))


__all__ = ["ByteBudget", "Concurrency", "TokenBucket", "TokenQuota", "retry_after_secs"]
