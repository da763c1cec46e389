"""The waiting sequences of one scheduling class, in the order admission takes them: fair between requests.

One API request may fan out to many sequences (OpenAI's prompts × n: up to 1,024). Queued first-in first-out,
a request arriving after such a fan-out waited for every one of its sequences to be admitted first (issue 27:
a 3 ms request waited 85 ms behind 8 prompts × n=16). Here each sequence belongs to a *group* (its API
request; a sequence alone is its own group), and admission takes the groups in turn, one sequence each: a
request arriving behind a large one waits for at most one of its sequences per seat that frees, not all of
them. The turn goes by the groups' arrival, so among requests of one sequence each the order is first-in
first-out, as before.

A preempted sequence is first in line, ahead of every group (it holds output already, and vLLM puts it back
at the front too), in the order preemption returned them.

Pure and owned by the scheduler (scheduler.py): one per priority class; every operation is O(1) apart from
`remove` of a sequence that is not at the front of its group (an abort), which is O(that group's size).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from .request import Request


class WaitingQueue:
    __slots__ = ("_count", "_front", "_groups")

    def __init__(self) -> None:
        self._front: deque[Request] = deque()  # preempted sequences: first in line
        # each group's waiting sequences; the dict's order is the turn (a group served goes to the back)
        self._groups: dict[str, deque[Request]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[Request]:
        """Every waiting sequence in the order admission would take them if nothing else arrived."""
        yield from self._front
        groups = list(self._groups.values())
        for i in range(max(map(len, groups), default=0)):
            for group in groups:
                if i < len(group):
                    yield group[i]

    def __contains__(self, request: object) -> bool:
        if not isinstance(request, Request):
            return False
        group = self._groups.get(request.group)
        return request in self._front or (group is not None and request in group)

    def append(self, request: Request) -> None:
        """A new sequence: last of its group (a new group takes its turn after every group waiting)."""
        group = self._groups.get(request.group)
        if group is None:
            group = self._groups[request.group] = deque()
        group.append(request)
        self._count += 1

    def appendleft(self, request: Request) -> None:
        """A preempted sequence: first in line."""
        self._front.appendleft(request)
        self._count += 1

    def peek(self) -> Request:
        """The sequence admission takes next (IndexError when none waits)."""
        if self._front:
            return self._front[0]
        for group in self._groups.values():
            return group[0]
        raise IndexError("no sequence is waiting")

    def popleft(self) -> Request:
        """Take `peek()`'s sequence; its group, if it has more, goes to the back of the turn."""
        if self._front:
            self._count -= 1
            return self._front.popleft()
        for key, group in self._groups.items():
            request = group.popleft()
            del self._groups[key]
            if group:
                self._groups[key] = group
            self._count -= 1
            return request
        raise IndexError("no sequence is waiting")

    def remove(self, request: Request) -> bool:
        """Drop a sequence that finished while waiting (aborted); False when it was not here."""
        group = self._groups.get(request.group)
        if group is not None and request in group:
            group.remove(request)
            if not group:
                del self._groups[request.group]
        elif request in self._front:
            self._front.remove(request)
        else:
            return False
        self._count -= 1
        return True
