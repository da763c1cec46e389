"""How many cases the fuzz, abuse and fault suites tried, for the line each prints at the end of the run
(tests/conftest.py `pytest_terminal_summary`). A suite calls `tried(suite)` once per case it ran: one
hypothesis example, one attack, one fault; the count is what CI's log shows, so a suite that silently tried
nothing is seen."""

from __future__ import annotations

from collections import Counter

COUNTS: Counter[str] = Counter()


def tried(suite: str, n: int = 1) -> None:
    COUNTS[suite] += n
