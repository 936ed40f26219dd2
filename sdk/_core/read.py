"""Reading a chain's commit position, sans-IO: whom to ask, when to ask again.

A read needs the commit position confirmed by the chain's leader (it
confirms with a round to a majority that it still leads). The reader asks
the leader it knows; a broker that does not lead redirects it; when no
leader answers it urges a broker to stand; between tries it backs off
with jitter, until its deadline.
"""

from __future__ import annotations

import enum
import random

import attrs

from .membership import Member, Pos
from .messages import CommitReply, Route
from .publish import backoff_delay

__all__ = ["ReadAttempt", "ReadStep"]


class ReadStep(enum.Enum):
    ROUTE = "route"
    """Find the chain's route (``refresh``: the known one is stale)."""
    ASK = "ask"
    """Send a commit query (``urge`` set) to ``target``; call :meth:`ReadAttempt.answered`."""
    WAIT = "wait"
    """Sleep until ``until``."""
    DONE = "done"
    """``commit`` is the confirmed position (``None``: nothing committed, or no chain);
    ``source`` a broker that holds it."""
    FAIL = "fail"
    """Gave up: ``message`` says what was seen last."""


@attrs.frozen
class ReadAction:
    step: ReadStep
    refresh: bool = False
    target: Member | None = None
    urge: bool = False
    until: float = 0.0
    commit: Pos | None = None
    source: Member | None = None
    message: str = ""


@attrs.define(eq=False)
class ReadAttempt:
    """One read's search for a confirmed commit position."""

    criterion: bytes
    deadline: float
    rng: random.Random
    route: Route | None = None
    _need_route: bool = True
    _refresh: bool = False
    _urge: bool = False
    _failed: dict[bytes, float] = attrs.field(factory=dict)
    _tries: int = 0
    _wait_until: float = 0.0
    _done: tuple[Pos | None, Member | None] | None = None
    _last: str = "no broker answered"

    def routed(self, route: Route | None, now: float, *, absent: bool = False,
               error: str = "") -> None:
        """The route found (``None``: none, ``error`` says why); ``absent``: no such
        chain exists (the read is empty)."""
        self._need_route = False
        self._refresh = False
        if absent:
            self._done = (None, None)
        elif route is None:
            self._tries += 1
            self._last = error or self._last
            self._retry(now)
        else:
            self.route = route

    def answered(self, target: Member, reply: CommitReply | None, now: float) -> None:
        """``target``'s answer (``None``: it did not answer in time)."""
        self._tries += 1
        if reply is None:
            self._failed[target.key] = now
            self._urge = True
            self._last = f"{target.address} did not answer"
            self._retry(now)
            return
        if reply.kind == "commit":
            self._done = (reply.commit, target)
            return
        if reply.kind == "redirect" and reply.route is not None:
            self.route = reply.route
            leader = reply.route.leader
            # Sent back to itself, or to no one: urge someone to stand.
            self._urge = leader is None or leader == target.key or leader in self._failed
            self._last = f"{target.address} does not lead the chain"
            self._retry(now, quick=not self._urge)
            return
        if reply.kind == "absent":
            self._failed[target.key] = now
            self._need_route = True
            self._refresh = True
            self._last = reply.message or f"{target.address} holds no such chain"
            self._retry(now)
            return
        self._urge = True
        self._last = reply.message or f"{target.address} is busy"
        self._retry(now)

    def _retry(self, now: float, *, quick: bool = False) -> None:
        if quick and self._tries < 3:
            self._wait_until = now
            return
        self._wait_until = now + backoff_delay(self._tries, self.rng.random(), base=0.02,
                                               cap=0.5)

    def next(self, now: float) -> ReadAction:
        if self._done is not None:
            commit, source = self._done
            return ReadAction(ReadStep.DONE, commit=commit, source=source)
        if now >= self.deadline:
            return ReadAction(ReadStep.FAIL, message=self._last)
        if self._wait_until > now:
            return ReadAction(ReadStep.WAIT, until=min(self._wait_until, self.deadline))
        if self._need_route or self.route is None:
            return ReadAction(ReadStep.ROUTE, refresh=self._refresh)
        members = list(self.route.config.members())
        leader = self.route.leader
        if leader is not None and not self._urge:
            for member in members:
                if member.key == leader:
                    return ReadAction(ReadStep.ASK, target=member, urge=False)
        ranked = sorted(members, key=lambda m: (self._failed.get(m.key, float("-inf")),
                                                self.rng.random()))
        return ReadAction(ReadStep.ASK, target=ranked[0], urge=True)
