"""Lease rounds, sans-IO: a subscriber's renewals and a broker's list pushes.

* :class:`Renewal` - one subscription's lease renewals. Each round gets a
  version above every earlier one (renewals and drops merge by version at
  the brokers, so a retransmitted or late copy changes nothing), groups the
  criteria by broker so that each broker gets one request, and says when
  the next round is due: a period after a round that found every
  criterion's brokers, soon after one that did not.
* :func:`merge_batches` - a broker's lease anti-entropy round: the
  subscriber lists it holds, grouped by co-broker and cut into requests of
  bounded size.

The driver looks up the brokers, sends what these return and feeds the
replies back; times are milliseconds passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..errors import DecodeError
from .leases import Lease
from .membership import Member, Pos, decode_pos
from .messages import _items, _map

__all__ = ["Renewal", "RenewalPlan", "merge_batches"]

RETRY_PERIOD = 1.0
"""Seconds between renewals while some criterion's brokers are not found."""

HURRY_AFTER_MS = 2_000
"""A notification from a peer the last round did not find (the chain may have moved)
brings the next round forward, at most once per round and no sooner than this, nor
than half the round period, after it: a stranger's notifications can at most double
how often rounds run."""


@attrs.frozen
class RenewalPlan:
    """One renewal round: the local criteria (this node is one of their brokers)
    and, per remote broker, the criteria to renew there."""

    sid: bytes
    version: int
    ttl_ms: int
    live: bool
    local: tuple[bytes, ...]
    remote: tuple[tuple[Member, tuple[bytes, ...]], ...]
    placed: bool
    """Every criterion's brokers were found."""

    def local_lease(self, own: Member, now_ms: int) -> Lease:
        return Lease(self.sid, own.key, own.address, self.version, now_ms + self.ttl_ms,
                     self.live)

    def request(self, keys: Sequence[bytes]) -> dict[str, Any]:
        """The ``lease`` request for ``keys`` (one broker's share)."""
        return {"op": "lease", "s": self.sid, "c": list(keys), "v": self.version,
                "t": self.ttl_ms, "live": self.live}

    @staticmethod
    def commits(keys: Sequence[bytes], reply: Any) -> list[Pos | None]:
        """The commit positions a broker reported, one per key asked for.

        Raises :class:`~ketten.errors.DecodeError` naming what was wrong."""
        where = "lease reply"
        commits = _items(_map(reply, where), "h", where,
                         lambda value, at: decode_pos(value, where=at), limit=len(keys))
        if len(commits) != len(keys):
            raise DecodeError("field 'h' must hold one commit per criterion", where=where)
        return list(commits)


@attrs.define(eq=False)
class Renewal:
    """The lease renewals of subscription ``sid`` over ``keys``."""

    sid: bytes
    keys: tuple[bytes, ...]
    ttl: float
    """Lease seconds."""
    check: float
    """Seconds between renewals once every criterion's brokers are found."""
    _version: int = attrs.field(default=0, init=False)
    _brokers: dict[bytes, frozenset[bytes]] = attrs.field(factory=dict, init=False)
    _before: dict[bytes, frozenset[bytes]] = attrs.field(factory=dict, init=False)
    _planned_ms: int | None = attrs.field(default=None, init=False)
    _hurried: bool = attrs.field(default=False, init=False)

    def plan(self, own: bytes, now_ms: int,
             brokers: Mapping[bytes, Sequence[Member] | None], *, live: bool) -> RenewalPlan:
        """The next round, given each criterion's brokers (``None``: they could not
        be found). ``live=False`` drops the subscription instead."""
        self._version = max(now_ms, self._version + 1)
        self._planned_ms, self._hurried = now_ms, False
        local: list[bytes] = []
        remote: dict[bytes, tuple[Member, list[bytes]]] = {}
        placed = True
        self._before, found = self._brokers, dict(self._brokers)
        for key in self.keys:
            members = brokers.get(key)
            if not members:
                placed = False
                continue
            found[key] = frozenset(m.key for m in members)
            for member in members:
                if member.key == own:
                    local.append(key)
                else:
                    remote.setdefault(member.key, (member, []))[1].append(key)
        self._brokers = found
        return RenewalPlan(self.sid, self._version, int(self.ttl * 1000), live, tuple(local),
                           tuple((remote[k][0], tuple(remote[k][1])) for k in sorted(remote)),
                           placed)

    def leased_at(self, key: bytes, broker: bytes) -> bool:
        """Whether ``broker`` is one of ``key``'s brokers found for this round or the one
        before (while a chain moves, the old brokers may still notify)."""
        return broker in self._brokers.get(key, ()) or broker in self._before.get(key, ())

    def hurry(self, now_ms: int) -> bool:
        """A notification came from a peer :meth:`leased_at` does not know: should the
        next round start now? (See :data:`HURRY_AFTER_MS`.)"""
        if (self._hurried or self._planned_ms is None
                or now_ms - self._planned_ms < max(HURRY_AFTER_MS, self.check * 500)):
            return False
        self._hurried = True
        return True

    def next_in(self, placed: bool, rand: float) -> float:
        """Seconds until the next round; ``rand`` in [0, 1) jitters it by ±25 %."""
        period = self.check if placed else min(self.check, RETRY_PERIOD)
        return period * (0.75 + 0.5 * rand)


def merge_batches(lists: Mapping[bytes, list[Any]],
                  brokers: Mapping[bytes, Sequence[Member]], own: bytes,
                  chunk: int) -> list[tuple[Member, list[dict[bytes, list[Any]]]]]:
    """A broker's subscriber ``lists`` (encoded leases per criterion) as ``merge``
    requests to its co-brokers: per co-broker (in key order), requests of at most
    ``chunk`` criteria each, criteria in order. Criteria missing from ``brokers``
    are skipped."""
    per_peer: dict[bytes, tuple[Member, list[bytes]]] = {}
    for key in lists:
        for member in brokers.get(key, ()):
            if member.key != own:
                per_peer.setdefault(member.key, (member, []))[1].append(key)
    batches = []
    for peer_key in sorted(per_peer):
        member, keys = per_peer[peer_key]
        keys.sort()
        batches.append((member, [{k: lists[k] for k in keys[start:start + chunk]}
                                 for start in range(0, len(keys), chunk)]))
    return batches
