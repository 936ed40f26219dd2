"""Subscription state, sans-IO: broker-side leases, broker reports, durable cursors.

Nothing here imports trio, reads a clock or touches the network or a store;
times are milliseconds passed in by the caller (``Node.now_ms``).

* :class:`LeaseTable` - the subscriber list a broker keeps per criterion. A
  lease names a subscription (``sid``), the subscriber's public key and
  address, a version and an expiry. Leases merge last-writer-wins by version,
  so brokers converge whatever order renewals, drops and anti-entropy copies
  arrive in; a drop is a lease with ``live=False`` (a tombstone) that expires
  like any other, so unsubscribing leaves no state behind once the lease
  time has passed.
* :class:`Reports` - what each broker told a subscriber it holds, and
  :func:`confirmed_seq`: the highest position a majority of brokers hold.
* :class:`CursorState` - a durable subscription's position per criterion.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from ..errors import DecodeError
from . import codec as _codec

__all__ = [
    "MAX_TTL_MS",
    "CursorState",
    "Lease",
    "LeaseTable",
    "Reports",
    "confirmed_seq",
]

SID_SIZE = 16
MAX_TTL_MS = 3_600_000
_KEY = 32
_MAX_TABLE_BYTES = 64 << 20


def _key(value: Any, where: str) -> bytes:
    if type(value) is not bytes or len(value) != _KEY:
        raise DecodeError("expected a 32-byte key", where=where)
    return value


@attrs.frozen
class Lease:
    """One subscription's entry in a broker's subscriber list of one criterion."""

    sid: bytes
    subscriber: bytes
    address: str
    version: int
    expires: int
    live: bool = True

    def encode(self) -> list[Any]:
        return [self.sid, self.subscriber, self.address, self.version, self.expires, self.live]

    @classmethod
    def decode(cls, value: Any, *, where: str) -> Lease:
        """Raises :class:`~ketten.errors.DecodeError` for anything but a well-formed lease."""
        if type(value) is not list or len(value) != 6:
            raise DecodeError("a lease is [sid, key, address, version, expires, live]",
                              where=where)
        sid, subscriber, address, version, expires, live = value
        if type(sid) is not bytes or len(sid) != SID_SIZE:
            raise DecodeError(f"a lease sid must be {SID_SIZE} bytes", where=where)
        _key(subscriber, where)
        if type(address) is not str or not address or len(address) > 512:
            raise DecodeError("a lease address must be a non-empty string", where=where)
        for name, number in (("version", version), ("expires", expires)):
            if type(number) is not int or number < 0 or number >= 1 << 63:
                raise DecodeError(f"a lease {name} must be a non-negative int", where=where)
        if type(live) is not bool:
            raise DecodeError("a lease's live flag must be a bool", where=where)
        return cls(sid, subscriber, address, version, expires, live)


def _release(counts: dict[Any, int], key: Any) -> None:
    """One entry fewer under ``key``; a key with none left is dropped."""
    left = counts.pop(key) - 1
    if left:
        counts[key] = left


@attrs.define(eq=False)
class LeaseTable:
    """Subscriber lists per criterion: last-writer-wins by version, expiring.

    ``max_leases`` bounds the entries over all criteria,
    ``max_per_subscriber`` those of one subscriber key and
    ``max_per_chain`` those of one subscriber key on one criterion (every
    entry costs a notification per committed event); a new entry beyond
    any of them is refused (:meth:`put` returns ``None``) and counted in
    ``refused``. A lease never changes hands: a sid held by one subscriber is
    refused to another.
    """

    max_leases: int = 1 << 16
    max_per_subscriber: int = 1024
    max_per_chain: int = 16
    _table: dict[bytes, dict[bytes, Lease]] = attrs.field(factory=dict, init=False)
    _count: int = attrs.field(default=0, init=False)
    _per_subscriber: dict[bytes, int] = attrs.field(factory=dict, init=False)
    _per_chain: dict[tuple[bytes, bytes], int] = attrs.field(factory=dict, init=False)
    refused: int = attrs.field(default=0, init=False)

    def __len__(self) -> int:
        return self._count

    def put(self, criterion: bytes, lease: Lease, now: int) -> str | None:
        """Merge one lease. Returns ``"new"`` (the sid was unknown, or its liveness
        or address changed), ``"renewed"`` (a later version of the same lease)
        or ``None`` (expired, older than what is known, or refused)."""
        if lease.expires <= now:
            return None
        leases = self._table.get(criterion)
        known = leases.get(lease.sid) if leases is not None else None
        if known is not None:
            if known.subscriber != lease.subscriber:
                self.refused += 1
                return None
            if known.version >= lease.version:
                return None
            assert leases is not None
            leases[lease.sid] = lease
            same = known.live == lease.live and known.address == lease.address
            return "renewed" if same else "new"
        held = self._per_subscriber.get(lease.subscriber, 0)
        pair = (criterion, lease.subscriber)
        on_chain = self._per_chain.get(pair, 0)
        if (self._count >= self.max_leases or held >= self.max_per_subscriber
                or on_chain >= self.max_per_chain):
            self.refused += 1
            return None
        if leases is None:
            leases = self._table[criterion] = {}
        leases[lease.sid] = lease
        self._count += 1
        self._per_subscriber[lease.subscriber] = held + 1
        self._per_chain[pair] = on_chain + 1
        return "new"

    def merge(self, criterion: bytes, leases: Iterable[Lease], now: int) -> str | None:
        """Merge leases copied from another broker; the strongest change, as :meth:`put`."""
        result: str | None = None
        for lease in leases:
            change = self.put(criterion, lease, now)
            if change == "new" or result is None:
                result = change or result
        return result

    def live(self, criterion: bytes, now: int) -> list[Lease]:
        """The subscribers to notify about ``criterion``: live and not expired."""
        leases = self._table.get(criterion)
        if not leases:
            return []
        return [lease for lease in leases.values() if lease.live and lease.expires > now]

    def entries(self, criterion: bytes) -> list[Lease]:
        """Every entry of ``criterion``, tombstones included (what anti-entropy copies)."""
        return list(self._table.get(criterion, {}).values())

    def criteria(self) -> list[bytes]:
        return sorted(self._table)

    def expire(self, now: int) -> bool:
        """Forget expired leases and tombstones; True if anything was removed."""
        removed = False
        for criterion in list(self._table):
            leases = self._table[criterion]
            for sid in [s for s, lease in leases.items() if lease.expires <= now]:
                subscriber = leases.pop(sid).subscriber
                self._count -= 1
                _release(self._per_subscriber, subscriber)
                _release(self._per_chain, (criterion, subscriber))
                removed = True
            if not leases:
                del self._table[criterion]
        return removed

    def encode(self) -> bytes:
        return _codec.dumps({k: [lease.encode() for lease in v.values()]
                             for k, v in self._table.items()})

    @classmethod
    def decode(cls, data: bytes, *, max_leases: int = 1 << 16,
               max_per_subscriber: int = 1024, max_per_chain: int = 16) -> LeaseTable:
        """Rebuild a table from :meth:`encode`. Raises :class:`~ketten.errors.DecodeError`."""
        where = "stored subscriber lists"
        raw = _codec.loads(data, max_size=_MAX_TABLE_BYTES, where=where)
        if type(raw) is not dict:
            raise DecodeError("expected a map of criteria", where=where)
        table = cls(max_leases=max_leases, max_per_subscriber=max_per_subscriber,
                    max_per_chain=max_per_chain)
        for criterion, leases in raw.items():
            _key(criterion, where)
            if type(leases) is not list:
                raise DecodeError("expected a list of leases", where=where)
            for value in leases:
                table.put(criterion, Lease.decode(value, where=where), -1)
        return table


def confirmed_seq(held: Sequence[int], need: int) -> int | None:
    """The highest seq at least ``need`` brokers hold, given the seq each one holds
    up to on the subscriber's chain; ``None`` if fewer than ``need`` reported."""
    if need < 1 or len(held) < need:
        return None
    return sorted(held, reverse=True)[need - 1]


@attrs.define(eq=False)
class Reports:
    """What brokers reported holding, per criterion: ``broker -> (seq, hash)``.

    A report says the broker held the event ``hash`` at ``seq`` (a head, or a
    notified event); since chains are hash-linked it then also held everything
    before it. A later report of a broker replaces an earlier one only if it
    is higher, or if the earlier one turned out not to be on the subscriber's
    chain (:meth:`drop`).
    """

    _by_key: dict[bytes, dict[bytes, tuple[int, bytes]]] = attrs.field(factory=dict, init=False)

    def note(self, criterion: bytes, broker: bytes, seq: int, event_hash: bytes) -> None:
        reports = self._by_key.setdefault(criterion, {})
        known = reports.get(broker)
        if known is None or seq >= known[0]:
            reports[broker] = (seq, event_hash)

    def of(self, criterion: bytes) -> dict[bytes, tuple[int, bytes]]:
        return dict(self._by_key.get(criterion, {}))

    def drop(self, criterion: bytes, broker: bytes) -> None:
        self._by_key.get(criterion, {}).pop(broker, None)


@attrs.frozen
class CursorState:
    """A durable subscription's stored state.

    ``next`` maps each criterion to the seq it delivers next: every event
    below it has been delivered (see :class:`ketten.DurableSubscription`).
    ``delivered`` counts deliveries, ``last`` is the hash of the latest one.
    ``closed`` marks an unsubscribed subscription.
    """

    criteria: tuple[bytes, ...]
    next: Mapping[bytes, int]
    delivered: int = 0
    last: bytes | None = None
    closed: bool = False

    @classmethod
    def fresh(cls, criteria: Sequence[bytes]) -> CursorState:
        return cls(tuple(criteria), dict.fromkeys(criteria, 0))

    def advance(self, criterion: bytes, seq: int, event_hash: bytes) -> CursorState:
        """The state after delivering the event ``event_hash`` at ``seq`` of ``criterion``."""
        return attrs.evolve(self, next={**self.next, criterion: seq + 1},
                            delivered=self.delivered + 1, last=event_hash)

    def encode(self) -> bytes:
        return _codec.dumps({
            "v": 1, "c": list(self.criteria), "n": [self.next[c] for c in self.criteria],
            "d": self.delivered, "h": self.last, "x": self.closed,
        })

    @classmethod
    def decode(cls, data: bytes, *, where: str) -> CursorState:
        """Raises :class:`~ketten.errors.DecodeError` for damaged or foreign values."""
        raw = _codec.loads(data, max_size=1 << 20, where=where)
        if type(raw) is not dict or raw.get("v") != 1:
            raise DecodeError("not a durable subscription cursor (version 1)", where=where)
        criteria, positions = raw.get("c"), raw.get("n")
        delivered, last, closed = raw.get("d"), raw.get("h"), raw.get("x")
        if (type(criteria) is not list or type(positions) is not list
                or len(criteria) != len(positions)):
            raise DecodeError("criteria and positions must be lists of one length", where=where)
        keys = tuple(_key(c, where) for c in criteria)
        for seq in positions:
            if type(seq) is not int or seq < 0:
                raise DecodeError("positions must be non-negative ints", where=where)
        if type(delivered) is not int or delivered < 0:
            raise DecodeError("the delivery count must be a non-negative int", where=where)
        if last is not None and (type(last) is not bytes or len(last) != _KEY):
            raise DecodeError("the last delivery must be a 32-byte hash", where=where)
        if type(closed) is not bool:
            raise DecodeError("the closed flag must be a bool", where=where)
        return cls(keys, dict(zip(keys, positions, strict=True)), delivered, last, closed)
