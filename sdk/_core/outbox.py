"""A leader's outbox towards one peer, sans-IO: which chains it owes the peer an
append, how many travel in one request, and how long to back off after the
peer failed or refused.

All the chains a node leads that share a peer travel in one request to it;
a peer that fails (or refuses everything) is retried later and later, so a
dead peer costs one request per backoff period, not one per chain.

A debt is *lazy* when it is only a commit mark: the peer holds the events
and loses nothing by learning of their commit a little later. A lazy debt
waits up to ``lazy_delay`` for the next request the peer is owed anyway and
rides along (as Raft carries its commit index on the next append), so one
publish costs one request per follower instead of a request and a one-way
commit notice (see :meth:`~ketten._core.replica.Replica.notice`).
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

from .membership import Member

__all__ = ["Outbox"]


@attrs.define(eq=False)
class Outbox:
    """The chains owed to ``member``, oldest first, and its failure count."""

    member: Member
    max_batch: int
    base_delay: float = 0.05
    max_delay: float = 1.0
    lazy_delay: float = 0.0
    _owed: OrderedDict[bytes, None] = attrs.field(factory=OrderedDict)
    _lazy: OrderedDict[bytes, float] = attrs.field(factory=OrderedDict)
    """Chains owed only a commit mark, with when that was first owed."""
    _failures: int = 0

    @property
    def failures(self) -> int:
        return self._failures

    def owe(self, criterion: bytes, *, lazy: bool = False, now: float = 0.0) -> None:
        """``criterion`` has something for the peer (again); ``lazy``: only a commit
        mark, which may wait ``lazy_delay`` (from ``now``) for other company."""
        if criterion in self._owed:
            return
        if lazy and self.lazy_delay > 0:
            self._lazy.setdefault(criterion, now)
        else:
            self._lazy.pop(criterion, None)
            self._owed[criterion] = None

    def __bool__(self) -> bool:
        return bool(self._owed) or bool(self._lazy)

    def __len__(self) -> int:
        return len(self._owed) + len(self._lazy)

    def delay(self, draw: float, now: float = 0.0) -> float:
        """How long to wait before the next request (``draw`` uniform in [0, 1))."""
        if self._failures:
            backoff: float = self.base_delay * 2.0 ** min(self._failures, 8)
            return min(self.max_delay, backoff) * (0.5 + draw)
        if self._owed or not self._lazy:
            return 0.0
        oldest = next(iter(self._lazy.values()))
        return max(0.0, oldest + self.lazy_delay - now)

    def take(self) -> list[bytes]:
        """The chains for the next request (at most ``max_batch``, oldest first, those
        owed more than a commit mark before those owed only one)."""
        chosen: list[bytes] = []
        while self._owed and len(chosen) < self.max_batch:
            criterion, _ = self._owed.popitem(last=False)
            chosen.append(criterion)
        while self._lazy and len(chosen) < self.max_batch:
            criterion, _ = self._lazy.popitem(last=False)
            chosen.append(criterion)
        return chosen

    def failed(self, still_owed: list[bytes]) -> None:
        """The request got no answer: back off, and owe ``still_owed`` again."""
        self._failures += 1
        for criterion in still_owed:
            self.owe(criterion)

    def answered(self, items: int, refused: int) -> None:
        """The peer answered ``items`` items, refusing ``refused`` of them. A peer
        that refuses everything is backed off like one that fails."""
        self._failures = self._failures + 1 if items and refused == items else 0
