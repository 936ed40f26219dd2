"""``Feeds``: push and durable subscriptions, the trio drivers.

Broker side: the subscriber list of each chain this node is a broker of is a
:class:`~ketten._core.leases.LeaseTable` kept in the store (cursor
``ketten/subscriptions``), spread to the chain's other brokers by a periodic
push, and notified with a one-way message whenever a commit advances here:
only committed events are ever notified.

Subscriber side (:class:`Feed`, one per subscription): leases are renewed at
every broker of each criterion; each reply carries the broker's commit
position, so a renewal doubles as the periodic check. Notified events are
verified and stored like fetched ones; an event that does not extend the
local copy means a gap, and the feed fetches the committed events. Events
reach the delivery plugin only up to a commit position some broker
reported for the local chain, so nothing delivered is ever rolled back.

Wire (bodies are CBOR maps):

* ``sub`` ``{op: "lease", s: sid, c: [criterion], v: version, t: ttl ms, live: bool}``
  -> ``{h: [commit pair per criterion]}``; the lease names the authenticated
  sender and its address.
* ``sub`` ``{op: "merge", m: {criterion: [lease]}}`` -> ``{}`` (broker to broker).
* one-way ``subev`` ``{s: sid, c: criterion, e: event bytes}`` (broker to subscriber).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from .._core.event import Event
from .._core.feed import FeedState, Placement
from .._core.identity import criterion_key
from .._core.lease_rounds import Renewal, merge_batches
from .._core.leases import MAX_TTL_MS, SID_SIZE, CursorState, Lease, LeaseTable
from .._core.membership import Member, Pos, encode_pos
from .._wire import field
from ..errors import (
    ConfigError,
    DecodeError,
    DependencyUnavailable,
    EventsDropped,
    HoldbackFull,
    InternalError,
    InvalidEvent,
    KettenError,
    ProtocolError,
    StoreCorrupted,
    StoreError,
    UsageError,
)
from ..interfaces import Peer
from .app_cursor import TABLE as APP_CURSOR_TABLE
from .app_cursor import ConnectionCursor
from .closing import Closing
from .local_chains import LocalChains
from .rpc import Rpc, guarded

_log = logging.getLogger("ketten.subscriptions")

__all__ = [
    "BrokerSubscriptionStatistics",
    "DurableSubscription",
    "Feed",
    "Feeds",
    "Subscription",
    "SubscriptionStatistics",
    "parse_criteria",
]

_SERVICE = "sub"
_NOTIFY = "subev"
_TABLE_CURSOR = "ketten/subscriptions"
_DURABLE_CURSOR = "ketten/durable/"
_MAX_CRITERIA = 1024
_MERGE_CHUNK = 256
_PAGE = 512
_INBOX = 4096
_OUTBOX = 4096
_LOOKUPS = 32
"""Criteria whose brokers one subscription looks up at once."""


def parse_criteria(criteria: Any) -> tuple[bytes, ...]:
    """Criterion names or 32-byte keys -> distinct keys. Raises :class:`UsageError`."""
    if isinstance(criteria, str | bytes):
        criteria = [criteria]
    try:
        items = list(criteria)
    except TypeError:
        raise UsageError("criteria must be names (str) or 32-byte keys, or a list of them") from None
    keys: list[bytes] = []
    for item in items:
        if isinstance(item, str):
            if not item:
                raise UsageError("a criterion name must not be empty")
            keys.append(criterion_key(item))
        elif type(item) is bytes and len(item) == 32:
            keys.append(item)
        else:
            raise UsageError(f"a criterion must be a name (str) or a 32-byte key, got {item!r:.40}")
    if not keys:
        raise UsageError("subscribe to at least one criterion")
    if len(keys) > _MAX_CRITERIA:
        raise UsageError(f"at most {_MAX_CRITERIA} criteria per subscription")
    if len(set(keys)) != len(keys):
        raise UsageError("a criterion is listed twice")
    return tuple(keys)


def _seconds(options: Mapping[str, Any], name: str, default: float) -> float:
    value = options.get(name, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"subscriptions option {name!r} must be a positive number of "
                          f"seconds, got {value!r}")
    return float(value)


@attrs.frozen
class BrokerSubscriptionStatistics:
    """Counters of the broker side of subscriptions on one node."""

    leases: int
    """Entries in the subscriber lists (live leases and tombstones)."""
    criteria: int
    notifications_sent: int
    notifications_dropped: int
    """Committed events not notified because the outbox was full (subscribers catch up
    by their renewals)."""
    leases_refused: int
    merges_sent: int
    table_writes: int


@attrs.frozen
class SubscriptionStatistics:
    """Counters of one subscription (see :meth:`Subscription.statistics`).

    ``notified``: events received in notifications; ``stored``: of those, the
    ones that extended the local chain; ``gaps``: catch-ups started because a
    notification or a commit report was ahead of the local chain;
    ``sync_failures``; ``head_checks``: renewal rounds (each carries the
    brokers' commit positions); ``invalid``: notified events that failed
    verification; ``delivered``: events handed to the application;
    ``holdback_full``: offers refused by the delivery plugin's bound;
    ``buffered``: events read and waiting for the application now;
    ``peak_buffered``: the most that ever waited (at most the ``buffer`` option,
    plus what one offer releases from the delivery plugin's holdback);
    ``dropped``: events skipped because the application was too slow
    (``overflow="drop"`` only); ``refused``: notifications ignored because
    they came from a peer that is none of the criterion's brokers the
    subscription found (only a broker's word makes an event committed);
    ``delivery``: the plugin's own statistics.
    """

    notified: int
    stored: int
    gaps: int
    sync_failures: int
    head_checks: int
    invalid: int
    delivered: int
    holdback_full: int
    buffered: int
    peak_buffered: int
    dropped: int
    refused: int
    delivery: Any


@attrs.frozen
class _Note:
    """Something a feed learned: a notified event, a commit report, or "look again"."""

    criterion: bytes
    broker: bytes | None = None
    event: Event | None = None
    commit: Pos | None = None
    round: int = 0
    """The report round the commit was asked for in (0: a notification)."""


@attrs.define(eq=False, repr=False)
class Feeds:
    """The broker side (subscriber lists, notifications) and the dispatch to local feeds."""

    rpc: Rpc
    chains: LocalChains
    own: Callable[[], Member]
    now_ms: Callable[[], int]
    members: Callable[[bytes], Awaitable[list[Member]]]
    """The brokers of a chain (its configuration; a lookup if it is not known)."""
    is_broker: Callable[[bytes], Awaitable[bool]]
    local_commit: Callable[[bytes], Pos | None]
    pull: Callable[[str, bytes], Awaitable[int]]
    """Copy the committed events a broker holds beyond the local chain."""
    address: Callable[[Member], str]
    request_timeout: float
    rng: random.Random
    ttl: float = 30.0
    check: float = 10.0
    interval: float = 2.0
    max_leases: int = 1 << 16
    max_per_subscriber: int = 1024
    max_per_chain: int = 16
    buffer: int = 1024
    """Events one subscription takes from its chains ahead of the application."""
    patience: float = 60.0
    """Seconds a causal subscription waits for a missing event before it raises
    :class:`~ketten.errors.DependencyUnavailable`."""
    closing: Closing = attrs.field(factory=lambda: Closing("the node"))
    """The node's calls in flight: subscriptions wait for events as such calls."""
    _table: LeaseTable = attrs.field(init=False)
    _feeds: dict[bytes, Feed] = attrs.field(factory=dict, init=False)
    _by_key: dict[bytes, dict[bytes, Feed]] = attrs.field(factory=dict, init=False)
    _out_send: trio.MemorySendChannel[tuple[bytes, Pos]] = attrs.field(init=False)
    _out_recv: trio.MemoryReceiveChannel[tuple[bytes, Pos]] = attrs.field(init=False)
    _notified: dict[bytes, int] = attrs.field(factory=dict, init=False)
    _dirty: bool = attrs.field(default=False, init=False)
    _write_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _leased: trio.Event = attrs.field(factory=trio.Event, init=False)
    _counts: dict[str, int] = attrs.field(init=False)

    @staticmethod
    def parse_options(options: Mapping[str, Any], interval: float) -> dict[str, Any]:
        """The ``subscriptions`` options: ``ttl`` (lease seconds, default 30), ``check``
        (renewal period, default ``ttl / 3``), ``interval`` (lease anti-entropy period,
        default the replication one), ``max_leases`` (subscriber-list entries of this
        broker, default 65,536), ``max_per_subscriber`` (entries of one subscriber
        node, default 1,024), ``max_per_chain`` (entries of one subscriber node on
        one criterion, default 16), ``buffer`` (events a subscription reads from its
        chains ahead of the application, default 1,024) and ``patience`` (seconds held
        events wait for a missing one before the application is told, default 60).
        Raises :class:`ConfigError`."""
        unknown = set(options) - {"ttl", "check", "interval", "max_leases", "max_per_subscriber",
                                  "max_per_chain", "buffer", "patience"}
        if unknown:
            raise ConfigError(f"unknown subscriptions options: {', '.join(sorted(unknown))}")
        ttl = _seconds(options, "ttl", 30.0)
        if ttl * 1000 > MAX_TTL_MS:
            raise ConfigError(f"subscriptions option 'ttl' must be at most {MAX_TTL_MS // 1000} s")
        check = _seconds(options, "check", ttl / 3)
        every = _seconds(options, "interval", interval)
        patience = _seconds(options, "patience", 60.0)
        bounds = {}
        for name, default in (("max_leases", 1 << 16), ("max_per_subscriber", 1024),
                              ("max_per_chain", 16), ("buffer", 1024)):
            value = options.get(name, default)
            if type(value) is not int or value < 1:
                raise ConfigError(f"subscriptions option {name!r} must be a positive int")
            bounds[name] = value
        return {"ttl": ttl, "check": check, "interval": every, "patience": patience, **bounds}

    def __attrs_post_init__(self) -> None:
        self._table = LeaseTable(max_leases=self.max_leases,
                                 max_per_subscriber=self.max_per_subscriber,
                                 max_per_chain=self.max_per_chain)
        self._out_send, self._out_recv = trio.open_memory_channel[tuple[bytes, Pos]](_OUTBOX)
        self._counts = dict.fromkeys(
            ("notifications_sent", "notifications_dropped", "merges_sent", "table_writes"), 0)
        self.rpc.serve_raw(_SERVICE, self._serve)
        self.rpc.serve_messages(_NOTIFY, self._take_notification)
        self.chains.on_appended(self._appended)

    def statistics(self) -> BrokerSubscriptionStatistics:
        return BrokerSubscriptionStatistics(
            leases=len(self._table), criteria=len(self._table.criteria()),
            leases_refused=self._table.refused, **self._counts)

    def live_leases(self, criterion: bytes) -> list[Lease]:
        """The subscribers this node would notify about ``criterion`` now."""
        return self._table.live(criterion, self.now_ms())

    def entries(self, criterion: bytes) -> list[Lease]:
        return self._table.entries(criterion)

    # -- local feeds -------------------------------------------------------

    def attach(self, feed: Feed) -> None:
        if feed.sid in self._feeds:
            raise UsageError("this subscription is already open on this node")
        self._feeds[feed.sid] = feed
        for key in feed.keys:
            self._by_key.setdefault(key, {})[feed.sid] = feed

    def subscribed(self, criterion: bytes) -> bool:
        """Is a subscription open on ``criterion`` at this node?"""
        return criterion in self._by_key

    def detach(self, feed: Feed) -> None:
        if self._feeds.get(feed.sid) is feed:
            del self._feeds[feed.sid]
        for key in feed.keys:
            feeds = self._by_key.get(key)
            if feeds is not None and feeds.get(feed.sid) is feed:
                del feeds[feed.sid]
                if not feeds:
                    del self._by_key[key]

    def _appended(self, events: Sequence[Event]) -> None:
        for key in {e.criterion for e in events}:
            for feed in self._by_key.get(key, {}).values():
                feed.push(_Note(key))

    def committed(self, criterion: bytes, commit: Pos) -> None:
        """A commit advanced here: wake local feeds, queue notifications to subscribers."""
        for feed in self._by_key.get(criterion, {}).values():
            feed.push(_Note(criterion))
        if self._table.live(criterion, self.now_ms()):
            try:
                self._out_send.send_nowait((criterion, commit))
            except trio.WouldBlock:
                self._counts["notifications_dropped"] += 1

    async def _take_notification(self, peer: Peer, body: Any) -> None:
        sid = field(body, "s", bytes, where=_NOTIFY)
        key = field(body, "c", bytes, where=_NOTIFY)
        raw = field(body, "e", bytes, where=_NOTIFY)
        feed = self._feeds.get(sid)
        if feed is None or key not in feed.keys or not feed.accepts(key, peer.public_key):
            return
        event = self.chains.decode(raw, key, where=_NOTIFY)
        feed.push(_Note(key, peer.public_key, event=event, commit=(event.seq, event.hash)))

    # -- broker side -------------------------------------------------------

    async def _serve(self, peer: Peer, body: Any) -> Any:
        op = field(body, "op", str, where=_SERVICE)
        if op == "lease":
            return await self._serve_lease(peer, body)
        if op == "merge":
            return await self._serve_merge(peer, body)
        raise ProtocolError(f"unknown subscription operation {op!r}")

    async def _serve_lease(self, peer: Peer, body: Any) -> Any:
        sid = field(body, "s", bytes, where="lease")
        keys = field(body, "c", list, where="lease")
        version = field(body, "v", int, where="lease")
        ttl = field(body, "t", int, where="lease")
        live = field(body, "live", bool, where="lease")
        if len(sid) != SID_SIZE or len(keys) > _MAX_CRITERIA or not 0 < ttl <= MAX_TTL_MS:
            raise DecodeError("bad sid, criteria or lease time", where="lease")
        if not 0 <= version < 1 << 63:
            raise DecodeError("bad lease version", where="lease")
        for key in keys:
            if type(key) is not bytes or len(key) != 32:
                raise DecodeError("criteria must be 32-byte keys", where="lease")
        now = self.now_ms()
        lease = Lease(sid, peer.public_key, peer.address, version, now + ttl, live)
        accepted = [(key, lease) for key in keys if await self.is_broker(key)]
        await self.put_leases(accepted)
        return {"h": [encode_pos(self.local_commit(key)) for key in keys]}

    async def put_leases(self, leases: Sequence[tuple[bytes, Lease]]) -> None:
        """Merge leases; a new subscription (or a drop) is durable before this returns."""
        now = self.now_ms()
        urgent = False
        for key, lease in leases:
            change = self._table.put(key, lease, now)
            if change is not None:
                self._dirty = True
                self._leased.set()
                urgent = urgent or change == "new"
        if urgent:
            await self._flush()

    async def _serve_merge(self, peer: Peer, body: Any) -> Any:
        table = field(body, "m", dict, where="merge")
        if len(table) > _MERGE_CHUNK:
            raise DecodeError(f"at most {_MERGE_CHUNK} criteria per merge", where="merge")
        now = self.now_ms()
        accepted: list[tuple[bytes, Lease]] = []
        for key, raw in table.items():
            if type(key) is not bytes or len(key) != 32 or type(raw) is not list:
                raise DecodeError("expected {32-byte criterion: [lease]}", where="merge")
            brokers = await self.members(key)
            if not any(m.key == peer.public_key for m in brokers):
                continue
            if not await self.is_broker(key):
                continue
            for value in raw[: self.max_leases]:
                lease = Lease.decode(value, where="merge")
                if lease.expires > now + MAX_TTL_MS:
                    lease = attrs.evolve(lease, expires=now + MAX_TTL_MS)
                accepted.append((key, lease))
        await self.put_leases(accepted)
        return {}

    async def _flush(self) -> None:
        async with self._write_lock:
            if not self._dirty:
                return
            self._dirty = False
            try:
                with trio.CancelScope(shield=True):
                    await self.chains.store.put_cursor(_TABLE_CURSOR, self._table.encode())
                    self._counts["table_writes"] += 1
            except BaseException:
                self._dirty = True
                raise

    async def _load(self) -> None:
        data = await self.chains.store.get_cursor(_TABLE_CURSOR)
        if data is None:
            return
        try:
            stored = LeaseTable.decode(data, max_leases=self.max_leases,
                                       max_per_subscriber=self.max_per_subscriber,
                                       max_per_chain=self.max_per_chain)
        except DecodeError:
            # Leases are soft state that subscribers renew: start afresh rather than refuse.
            return
        now = self.now_ms()
        for key in stored.criteria():
            self._table.merge(key, stored.entries(key), now)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the subscriber lists, then notify, expire and spread them until cancelled."""
        await self._load()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._notifier)
            task_status.started()
            while True:
                await self._until_leased()
                await trio.sleep(self.interval * (0.5 + self.rng.random()))
                with trio.move_on_after(self.interval * 10):
                    await guarded(self.maintain)

    async def _until_leased(self) -> None:
        """A node that holds no lease has none to expire, store or spread: its rounds
        wait for the first one."""
        while not len(self._table) and not self._dirty:
            await self._leased.wait()
            self._leased = trio.Event()

    async def maintain(self) -> None:
        """One round: forget expired leases, persist changes, push lists to co-brokers."""
        if self._table.expire(self.now_ms()):
            self._dirty = True
        if self._dirty:
            await self._flush()
        lists: dict[bytes, list[Any]] = {}
        brokers: dict[bytes, list[Member]] = {}
        for key in self._table.criteria():
            if not await self.is_broker(key):
                continue
            try:
                brokers[key] = await self.members(key)
            except KettenError:
                continue  # its brokers cannot be found now: next round
            lists[key] = [lease.encode() for lease in self._table.entries(key)]

        async def push(member: Member, requests: list[dict[bytes, list[Any]]]) -> None:
            for chunk in requests:
                self._counts["merges_sent"] += 1
                try:
                    await self.rpc.call_raw(self.address(member), _SERVICE,
                                            {"op": "merge", "m": chunk},
                                            timeout=self.request_timeout)
                except KettenError:
                    return

        if not lists:
            return
        async with trio.open_nursery() as nursery:
            for member, requests in merge_batches(lists, brokers, self.own().key,
                                                  _MERGE_CHUNK):
                nursery.start_soon(push, member, requests)

    async def _notifier(self) -> None:
        own = self.own().key
        timeout = self.request_timeout

        async def send(lease: Lease, body: Any) -> None:
            with trio.move_on_after(timeout):
                try:
                    await self.rpc.notify(lease.address, _NOTIFY, {**body, "s": lease.sid})
                    self._counts["notifications_sent"] += 1
                except KettenError:
                    pass

        async for criterion, commit in self._out_recv:
            leases = [lease for lease in self._table.live(criterion, self.now_ms())
                      if lease.subscriber != own]
            if not leases:
                continue
            start = max(self._notified.get(criterion, -1) + 1, commit[0] - 63)
            try:
                events = await self.chains.range(criterion, start, commit[0] + 1)
            except KettenError as exc:  # the store failed: subscribers fill the gap later
                _log.warning("cannot read chain %s to notify subscribers: %s",
                             criterion.hex()[:16], exc)
                continue
            if len(self._notified) > 1 << 16:
                self._notified.clear()
            self._notified[criterion] = commit[0]
            for event in events:
                body = {"c": criterion, "e": event.to_bytes()}
                async with trio.open_nursery() as nursery:
                    for lease in leases:
                        nursery.start_soon(send, lease, body)


@attrs.define(eq=False, repr=False)
class Feed:
    """One subscription's receiving end: notes in, verified committed events out."""

    feeds: Feeds
    keys: tuple[bytes, ...]
    sid: bytes
    delivery: Any
    start: Mapping[bytes, int]
    observe: Callable[[Event], None]
    _state: FeedState = attrs.field(init=False)
    _send: trio.MemorySendChannel[_Note] = attrs.field(init=False)
    _recv: trio.MemoryReceiveChannel[_Note] = attrs.field(init=False)
    _ready: deque[Event | EventsDropped] = attrs.field(factory=deque, init=False)
    _drop: bool = attrs.field(default=False, init=False)
    """Skip the oldest waiting events when more wait than the buffer holds."""
    _blocked: HoldbackFull | None = attrs.field(default=None, init=False)
    """When this feed last asked every broker for commits before releasing events."""
    _renewal: Renewal = attrs.field(init=False)
    _hurry: trio.Event = attrs.field(factory=trio.Event, init=False)
    _causal: bool = attrs.field(default=False, init=False)
    _counts: dict[str, int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._state = FeedState(self.keys, self.start, self.feeds.patience)
        self._renewal = Renewal(self.sid, self.keys, self.feeds.ttl, self.feeds.check)
        self._send, self._recv = trio.open_memory_channel[_Note](_INBOX)
        self._causal = callable(getattr(self.delivery, "note_head", None)) and len(self.keys) > 1
        self._counts = dict.fromkeys(
            ("notified", "stored", "gaps", "sync_failures", "head_checks", "invalid",
             "delivered", "holdback_full", "peak_buffered", "dropped", "refused"), 0)

    def statistics(self) -> SubscriptionStatistics:
        stats = getattr(self.delivery, "statistics", None)
        return SubscriptionStatistics(delivery=stats() if callable(stats) else None,
                                      buffered=len(self._ready), **self._counts)

    def accepts(self, key: bytes, broker: bytes) -> bool:
        """Whether a notification about ``key`` from ``broker`` counts: only from the
        brokers the lease rounds found for it (a subscription's id is no secret)."""
        if self._renewal.leased_at(key, broker):
            return True
        self._counts["refused"] += 1
        if self._renewal.hurry(self.feeds.now_ms()):
            self._hurry.set()  # the chain may have moved: look its brokers up now
        return False

    def push(self, note: _Note) -> None:
        try:
            self._send.send_nowait(note)
        except trio.WouldBlock:
            # Nothing is lost: every criterion is looked at again on the next pass.
            self._state.look()

    def drop_when_slow(self) -> None:
        """Overflow policy "drop": when more committed events wait for the application
        than the ``buffer`` holds, the oldest are skipped and the application gets an
        :class:`~ketten.errors.EventsDropped` notice in their place.

        Raises :class:`~ketten.errors.ConfigError` if the delivery plugin cannot skip."""
        if not callable(getattr(self.delivery, "skip", None)):
            raise ConfigError(
                f"overflow='drop' needs a delivery that can skip events; "
                f"{type(self.delivery).__name__} has no skip() (a causal order cannot "
                f"skip events: use overflow='block')")
        self._drop = True

    def has_ready(self) -> bool:
        """Whether an event (or a drop notice) waits for the application."""
        return bool(self._ready)

    def pop(self) -> Event:
        """The next event; raises the :class:`~ketten.errors.EventsDropped` notice
        that stands in its place in the stream."""
        item = self._ready.popleft()
        if isinstance(item, EventsDropped):
            raise item
        self._counts["delivered"] += 1
        return item

    def push_back(self, event: Event) -> None:
        self._ready.appendleft(event)
        self._counts["delivered"] -= 1

    # -- leases and commits ------------------------------------------------

    async def renew(self, *, live: bool = True, round_: int = 0) -> bool:
        """Renew (or drop) the lease at every broker; the replies report their commits
        (numbered ``round_``, see :meth:`FeedState.begin_round`).

        Returns whether every criterion's brokers were found."""
        feeds = self.feeds
        own = feeds.own()
        found: dict[bytes, list[Member] | None] = {}
        limit = trio.CapacityLimiter(_LOOKUPS)

        async def look_up(key: bytes) -> None:
            async with limit:
                try:
                    found[key] = await feeds.members(key)
                except KettenError:
                    found[key] = None

        # Each criterion's brokers may take a round trip to find: all at once.
        async with trio.open_nursery() as nursery:
            for key in self.keys:
                nursery.start_soon(look_up, key)
        brokers = {key: found[key] for key in self.keys}
        plan = self._renewal.plan(own.key, feeds.now_ms(), brokers, live=live)
        self._counts["head_checks"] += 1
        if plan.local:
            lease = plan.local_lease(own, feeds.now_ms())
            await feeds.put_leases([(key, lease) for key in plan.local])
            for key in plan.local:
                self.push(_Note(key, own.key, commit=feeds.local_commit(key), round=round_))

        async def one(member: Member, keys: tuple[bytes, ...]) -> None:
            try:
                # A lease (or its drop) is versioned: a second copy changes nothing.
                peer, reply = await feeds.rpc.call_raw(feeds.address(member), _SERVICE,
                                                       plan.request(keys), retransmit=True,
                                                       expect=member.key)
                commits = plan.commits(keys, reply)
            except KettenError:
                return
            for key, commit in zip(keys, commits, strict=True):
                self.push(_Note(key, peer.public_key, commit=commit, round=round_))

        async with trio.open_nursery() as nursery:
            for member, keys in plan.remote:
                nursery.start_soon(one, member, keys)
        return plan.placed

    async def maintain(self, *, task_status: trio.TaskStatus[trio.CancelScope]
                       = trio.TASK_STATUS_IGNORED) -> None:
        """Renew the lease every ``check`` seconds (jittered) until cancelled."""
        rng = self.feeds.rng
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while True:
                placed = False
                with trio.move_on_after(self.feeds.check * 3):
                    try:
                        placed = await self.renew()
                    except KettenError:
                        placed = False  # brokers unreachable or a store error: try again soon
                with trio.move_on_after(self._renewal.next_in(placed, rng.random())):
                    await self._hurry.wait()
                self._hurry = trio.Event()

    # -- the pump ----------------------------------------------------------

    async def fill(self) -> None:
        """Wait until an event is ready for the application.

        Raises :class:`~ketten.errors.HoldbackFull` when nothing can be
        delivered because the delivery plugin's queue is at its bound, and
        :class:`~ketten.errors.DependencyUnavailable` when events were held
        back for ``patience`` seconds waiting for one that could not be had.
        """
        while not self._ready:
            await self._drain()
            await self._pass()
            if self._ready:
                return
            if self._blocked is not None:
                raise self._blocked
            give_up = self._state.give_up_at(trio.current_time(), self._holding())
            if give_up is not None and trio.current_time() >= give_up:
                missing = self._missing()
                if missing is not None:
                    self._state.progressed(trio.current_time())
                    raise missing
            note: _Note | None = None
            with trio.move_on_at(give_up if give_up is not None else math.inf):
                note = await self._recv.receive()
            if note is not None:
                await self._take(note)

    def _holding(self) -> bool:
        pending = getattr(self.delivery, "pending", None)
        return callable(pending) and pending() > 0

    def _missing(self) -> DependencyUnavailable | None:
        blocked = getattr(self.delivery, "blocked", None)
        positions = blocked() if callable(blocked) else []
        if not positions:
            return None
        criterion, seq = positions[0]
        return DependencyUnavailable(criterion, seq, self.delivery.pending(), self.feeds.patience)

    async def _drain(self) -> None:
        while True:
            try:
                note = self._recv.receive_nowait()
            except trio.WouldBlock:
                return
            await self._take(note)

    async def _take(self, note: _Note) -> None:
        key = note.criterion
        state = self._state
        state.look(key)
        event = note.event
        chains = self.feeds.chains
        if event is not None:
            self._counts["notified"] += 1
            place = state.place(event, await chains.head_pos(key))
            if place == Placement.STORE:
                try:
                    self._counts["stored"] += await chains.accept_committed(key, [event])
                except InvalidEvent:
                    self._counts["invalid"] += 1
                    return
                except StoreError:
                    state.need_sync(key)
            elif place == Placement.SYNC:
                state.need_sync(key)
        if note.broker is not None:
            state.note_commit(key, note.broker, note.commit, note.round)

    async def _pass(self) -> None:
        self._blocked = None
        keys = self._state.take_looks()
        synced = await self._catch_up(keys)
        if not self._causal:
            for key in keys:
                await self._advance(key, offer=True, synced=key in synced)
            return
        behind = False
        for key in keys:
            behind = await self._advance(key, offer=False, synced=key in synced) or behind
        if not self._state.ask_round(trio.current_time(), behind=behind,
                                     holding=self._holding()):
            return
        # Causal order needs commits reported after the events it releases were
        # here: one of them may depend on an event no earlier report covered. So
        # offer only what is here now, after a round of reports asked for now; a
        # chain whose brokers do not answer counts as possibly holding more.
        chains = self.feeds.chains
        limits = {}
        for key in self.keys:
            head = await chains.head_pos(key)
            limits[key] = -1 if head is None else head[0]
        await self._drain()
        round_ = self._state.begin_round()
        await self.renew(round_=round_)
        await self._drain()
        forget = getattr(self.delivery, "forget_head", None)
        for key in self.keys:
            if not self._state.reported_in(key, round_) and callable(forget):
                forget(key)
        for key in self.keys:
            await self._advance(key, offer=True, limit=limits[key], round_=round_)

    async def _catch_up(self, keys: list[bytes]) -> set[bytes]:
        """Sync every chain of ``keys`` that asks for it or whose brokers reported more
        than is here, all at once: one chain's fetch waits on the network while
        another's events are checked. Returns the chains synced (with one chain to
        look at, :meth:`_advance` does it all)."""
        if len(keys) < 2:
            return set()
        due = [key for key in keys
               if self._state.take_sync(key) or (await self._confirmed(key))[1]]
        async with trio.open_nursery() as nursery:
            for key in due:
                nursery.start_soon(self._sync_now, key)
        return set(due)

    async def _sync_now(self, key: bytes) -> None:
        self._counts["gaps"] += 1
        feeds = self.feeds
        for broker, _pos in self._state.reports(key):
            if broker == feeds.own().key:
                continue
            try:
                members = await feeds.members(key)
            except KettenError:
                break
            member = next((m for m in members if m.key == broker), None)
            if member is None:
                continue
            try:
                await feeds.pull(feeds.address(member), key)
                return
            except KettenError:
                continue
        self._counts["sync_failures"] += 1

    async def _confirmed(self, key: bytes) -> tuple[int | None, bool]:
        chains = self.feeds.chains
        head = await chains.head_pos(key)
        wanted = self._state.wanted(key)
        own = self.feeds.local_commit(key)
        if own is not None:
            wanted = [*wanted, own[0]]
        hashes = await chains.hashes(key, wanted)
        return self._state.confirmed(key, head, hashes, own)

    async def _advance(self, key: bytes, *, offer: bool, limit: int | None = None,
                       round_: int | None = None, synced: bool = False) -> bool:
        """Catch up on ``key`` (unless ``synced`` already) and offer what is committed
        (up to seq ``limit``); True if there was something new to offer that
        ``offer=False`` kept back. A causal delivery learns the head only from reports
        of round ``round_``."""
        if not synced and self._state.take_sync(key):
            await self._sync_now(key)
            synced = True
        confirmed, behind = await self._confirmed(key)
        if behind and not synced:
            await self._sync_now(key)
            confirmed, behind = await self._confirmed(key)
        nxt = self._state.next_seq(key)
        if confirmed is not None and confirmed >= nxt and not offer:
            return True
        out: list[Event] = []
        window = self._state.window(key, confirmed, self.feeds.buffer - len(self._ready),
                                    drop=self._drop, limit=limit)
        if window.drop_before is not None:
            self._skip(key, nxt, window.drop_before)
        if window.more:
            self._state.look(key)
        first = self._state.next_seq(key)  # a skip may release held events past it
        if window.last >= first:
            out.extend(await self._offer_range(key, first, window.last))
        if self._causal and self._state.head_known(key, round_, confirmed):
            try:
                out.extend(self.delivery.note_head(key, confirmed))
            except HoldbackFull as exc:
                self._blocked = exc
                self._counts["holdback_full"] += 1
        elif (not self._causal and confirmed is not None
              and callable(getattr(self.delivery, "note_head", None))):
            out.extend(self.delivery.note_head(key, None if confirmed < 0 else confirmed))
        self._emit(out)
        return False

    def _skip(self, key: bytes, first: int, seq: int) -> None:
        """Give up seqs ``first`` to ``seq - 1`` of ``key``."""
        released = self.delivery.skip(key, seq)
        self._state.skip_to(key, seq)
        self._counts["dropped"] += seq - first
        self._ready.append(EventsDropped(key, first, seq - 1))
        self._emit(released)
        for event in released:
            self._state.offered(key, event.seq)

    async def _offer_range(self, key: bytes, start: int, stop: int) -> list[Event]:
        out: list[Event] = []
        seq = start
        while seq <= stop:
            page = await self.feeds.chains.range(key, seq, min(stop + 1, seq + _PAGE))
            if not page:
                break
            for event in page:
                try:
                    out.extend(self.delivery.offer(event))
                except HoldbackFull as exc:
                    self._blocked = exc
                    self._counts["holdback_full"] += 1
                    return out
                self._state.offered(key, event.seq)
                seq = event.seq + 1
        return out

    def _emit(self, events: list[Event]) -> None:
        for event in events:
            self.observe(event)
        self._ready.extend(events)
        if events:
            self._state.progressed(trio.current_time())
        if len(self._ready) > self._counts["peak_buffered"]:
            self._counts["peak_buffered"] = len(self._ready)


@attrs.define(eq=False, repr=False)
class Subscription:
    """A push subscription; iterate it inside ``async with node.subscribe(...)``.

    Events of each criterion arrive in chain order, each once, in the order
    of the subscription's delivery plugin across criteria.
    """

    _feed: Feed
    _closing: Closing = attrs.field(factory=lambda: Closing("the subscription"))

    @property
    def criteria(self) -> tuple[bytes, ...]:
        return self._feed.keys

    def statistics(self) -> SubscriptionStatistics:
        return self._feed.statistics()

    def __aiter__(self) -> Subscription:
        return self

    def close(self) -> None:
        """Its ``async with`` block ended: iterating raises
        :class:`~ketten.errors.NodeClosed` from now on (and ends a wait in progress)."""
        self._closing.close()

    async def __anext__(self) -> Event:
        """The next event. Raises :class:`~ketten.errors.HoldbackFull` when the
        delivery plugin's queue is full and nothing can be delivered, and
        :class:`~ketten.errors.DependencyUnavailable` when held events waited
        ``patience`` seconds for one that could not be had (iterating again
        keeps waiting; nothing is delivered out of order), and, with
        ``overflow="drop"``, :class:`~ketten.errors.EventsDropped` where events
        were skipped (iterating again goes on after them);
        :class:`~ketten.errors.NodeClosed` once the node or the subscription's
        block is closed."""
        feed = self._feed
        if not feed.has_ready():  # a wait: one the closing of the node or the block ends
            with feed.feeds.closing.call(), self._closing.call():
                await feed.fill()
        else:
            feed.feeds.closing.check()
            self._closing.check()
        return feed.pop()


MakeFeed = Callable[[tuple[bytes, ...], bytes, "str | None", Mapping[bytes, int],
                     "Mapping[str, Any] | None"], Feed]


_START_ALIASES: Mapping[str, int | str] = {"latest": "head", "earliest": 0}
"""The names Kafka users know for the two ends of a chain."""


async def start_positions(keys: tuple[bytes, ...], start: int | str | Mapping[Any, int],
                          head: Callable[[bytes], Awaitable[Pos | None]]) -> dict[bytes, int]:
    start = _START_ALIASES.get(start, start) if isinstance(start, str) else start
    if start == "head":
        positions: dict[bytes, int] = {}
        for key in keys:
            pos = await head(key)
            positions[key] = pos[0] + 1 if pos is not None else 0
        return positions
    if type(start) is int and start >= 0:
        return dict.fromkeys(keys, start)
    if isinstance(start, Mapping):
        positions = dict.fromkeys(keys, 0)
        for criterion, seq in start.items():
            key = parse_criteria([criterion])[0]
            if key not in positions:
                raise UsageError("start names a criterion that is not subscribed")
            if type(seq) is not int or seq < 0:
                raise UsageError("start positions must be ints >= 0")
            positions[key] = seq
        return positions
    raise UsageError(f"start must be a seq >= 0, a {{criterion: seq}} map, 'head' (alias "
                     f"'latest') or 'earliest' (seq 0), got {start!r}")


@asynccontextmanager
async def open_subscription(
    feeds: Feeds, nursery: trio.Nursery, make_feed: MakeFeed, criteria: Any, *,
    delivery: str | None, start: int | str | Mapping[Any, int],
    options: Mapping[str, Any] | None, head: Callable[[bytes], Awaitable[Pos | None]],
    overflow: str = "block",
) -> AsyncIterator[Subscription]:
    """See :meth:`ketten.Node.subscribe`."""
    if overflow not in ("block", "drop"):
        raise UsageError(f"overflow must be 'block' or 'drop', not {overflow!r}")
    feeds.closing.check()
    keys = parse_criteria(criteria)
    positions = await start_positions(keys, start, head)
    sid = feeds.rng.randbytes(SID_SIZE)
    feed = make_feed(keys, sid, delivery, positions, options)
    if overflow == "drop":
        feed.drop_when_slow()
    feeds.attach(feed)
    scope: trio.CancelScope | None = None
    subscription = Subscription(feed)
    try:
        scope = await nursery.start(feed.maintain)
        yield subscription
    finally:
        subscription.close()
        if scope is not None:
            scope.cancel()
        feeds.detach(feed)
        if not feeds.closing.closed:  # a closed node has no brokers to tell
            with trio.CancelScope(shield=True), trio.move_on_after(feeds.request_timeout):
                await feed.renew(live=False)


@attrs.define(eq=False, repr=False)
class DurableSubscription:
    """A durable subscription: every event of its criteria, once acknowledged, never again.

    The subscription's cursor (per criterion, the next seq to deliver, plus
    a count and the hash of the latest acknowledged event) says what has
    been *acknowledged*. Every event committed on the subscribed chains is
    returned until it is acknowledged, across crashes and restarts of the
    subscriber and of the brokers, and an acknowledged event is never
    returned again. Three routes, by what a crash may do to the application:

    * ``event = await sub.get()``: the event is acknowledged by the next
      :meth:`get` (or :meth:`ack`). If the process dies before that, the
      same event is returned again after the restart: nothing is lost, and
      the only event ever repeated is the one not yet acknowledged. Call
      :meth:`ack` before :meth:`aclose` if the last event was handled.
    * ``async with sub.next() as event:``: acknowledged when the block
      exits normally; if it raises, or the process dies, the event comes
      again (at least once).
    * ``durable_subscription(..., cursor_in=connection)`` with
      ``async with sub.next() as event:``: the cursor lives in the
      application's own DB-API connection (table ``ketten_cursors``) and is
      written there after the block, in the same transaction as what the
      block wrote; then the connection is committed once. The effect and
      the acknowledgement commit or roll back together: each event's effect
      happens exactly once. An exception in the block rolls the connection
      back and the event comes again. The connection's transaction is the
      block's: what the application wrote on it before the block (and before
      opening the subscription, which commits the connection once to create
      the ``ketten_cursors`` table and a new cursor) commits or rolls back
      with it, so commit other work first, or give the subscription a
      connection of its own.

    Only committed events are delivered, so no delivered event is ever
    rolled back.
    """

    feeds: Feeds
    name: str
    _feed: Feed
    _state: CursorState
    request_timeout: float
    _connection: ConnectionCursor | None = None
    _scope: trio.CancelScope | None = None
    _pending: Event | None = attrs.field(default=None, init=False)
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _closing: Closing = attrs.field(init=False, default=attrs.Factory(
        lambda self: Closing(f"durable subscription {self.name!r}"), takes_self=True))

    @property
    def criteria(self) -> tuple[bytes, ...]:
        return self._state.criteria

    @property
    def position(self) -> Mapping[bytes, int]:
        """The next seq to acknowledge per criterion (as stored)."""
        return dict(self._state.next)

    @property
    def delivered(self) -> int:
        """How many events this subscription acknowledged over its whole life."""
        return self._state.delivered

    @property
    def pending(self) -> Event | None:
        """The event :meth:`get` returned that is not acknowledged yet."""
        return self._pending

    def statistics(self) -> SubscriptionStatistics:
        return self._feed.statistics()

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """A call that closing the node or this subscription ends (see :class:`Closing`)."""
        with self.feeds.closing.call(), self._closing.call():
            yield

    async def get(self) -> Event:
        """Acknowledge the event the previous call returned, then return the next one.

        Raises :class:`~ketten.errors.NodeClosed` after :meth:`unsubscribe`
        or :meth:`aclose` and once the node is closed (also to a call waiting
        for an event then); :class:`~ketten.errors.UsageError` on a
        subscription opened with ``cursor_in`` (use :meth:`next`);
        :class:`~ketten.errors.StoreError` if the acknowledgement could not
        be written (nothing moved: the previous event is still
        unacknowledged, and the next call tries again);
        :class:`~ketten.errors.HoldbackFull` and
        :class:`~ketten.errors.DependencyUnavailable` (see :class:`Subscription`).
        """
        with self._call():
            async with self._lock:
                return await self._get()

    async def _get(self) -> Event:
        if self._connection is not None:
            raise UsageError(
                f"durable subscription {self.name!r} keeps its cursor in the application's "
                "connection (cursor_in): use `async with sub.next() as event:`")
        await self._acknowledge()
        await self._feed.fill()
        self._pending = self._feed.pop()
        return self._pending

    async def ack(self) -> None:
        """Acknowledge the event :meth:`get` returned (a no-op if there is none).

        Raises :class:`~ketten.errors.NodeClosed` after :meth:`unsubscribe`
        or :meth:`aclose` and once the node is closed;
        :class:`~ketten.errors.StoreError` if the acknowledgement could not be
        written.
        """
        with self._call():
            async with self._lock:
                await self._acknowledge()

    @asynccontextmanager
    async def next(self) -> AsyncIterator[Event]:
        """``async with sub.next() as event:`` - acknowledged when the block exits
        normally (with ``cursor_in``: in the application's transaction, which is
        then committed); if it raises (or the process dies), the event comes
        again. An event :meth:`get` returned is acknowledged first.

        Raises what :meth:`get` raises, except that ``cursor_in`` is the
        route this method is for. Closing the node or the subscription ends
        a wait for the next event, not the block.
        """
        with self._call():
            await self._lock.acquire()
        try:
            with self._call():
                await self._acknowledge()
                await self._feed.fill()
                event = self._feed.pop()
            try:
                yield event
            except BaseException:
                self._feed.push_back(event)
                if self._connection is not None:
                    with contextlib.suppress(StoreError):
                        self._connection.rollback()
                raise
            try:
                # The application's connection is its own: its transaction still
                # commits after the node closed.
                with (self.feeds.closing.call() if self._connection is None
                      else contextlib.nullcontext()):
                    await self._commit(event)
            except BaseException:
                self._feed.push_back(event)
                raise
        finally:
            self._lock.release()

    async def _acknowledge(self) -> None:
        if self._pending is not None:
            await self._commit(self._pending)
            self._pending = None

    async def _commit(self, event: Event) -> None:
        state = self._state
        if state.next.get(event.criterion) != event.seq:
            raise InternalError(
                f"durable subscription {self.name!r} would deliver seq {event.seq} of criterion "
                f"{event.criterion.hex()[:16]} out of order (expected "
                f"{state.next.get(event.criterion)})")
        advanced = state.advance(event.criterion, event.seq, event.hash)
        await self._write(advanced)
        self._state = advanced

    async def _write(self, state: CursorState) -> None:
        data = state.encode()
        if self._connection is None:
            with trio.CancelScope(shield=True):
                await self.feeds.chains.store.put_cursor(_DURABLE_CURSOR + self.name, data)
            return
        self._connection.write(data)

    async def aclose(self) -> None:
        """Stop receiving here; the subscription stays (its cursor is kept, the
        brokers keep it until its lease expires) and can be opened again. An
        event :meth:`get` returned and nobody acknowledged comes again then. A
        call waiting for an event (in another task) ends with
        :class:`~ketten.errors.NodeClosed`."""
        self._closing.close()
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None
        self.feeds.detach(self._feed)
        await trio.lowlevel.checkpoint()

    async def unsubscribe(self) -> None:
        """End the subscription: drop it at the brokers and mark the cursor closed.

        Brokers that miss the drop learn it from the others, and forget the
        subscriber when its lease expires in any case. A call waiting for an
        event ends first (see :meth:`aclose`). Raises
        :class:`~ketten.errors.NodeClosed` once the node is closed and
        :class:`~ketten.errors.StoreError` if the cursor could not be written.
        """
        with self.feeds.closing.call():
            await self.aclose()
            async with self._lock:
                with trio.move_on_after(self.request_timeout * 2):
                    await self._feed.renew(live=False)
                closed = attrs.evolve(self._state, closed=True)
                await self._write(closed)
                self._state = closed
                self._pending = None


async def open_durable(
    feeds: Feeds, nursery: trio.Nursery, make_feed: MakeFeed, own_key: bytes, name: str,
    criteria: Any, *, delivery: str | None, options: Mapping[str, Any] | None,
    cursor_in: Any = None,
) -> DurableSubscription:
    """See :meth:`ketten.Node.durable_subscription`."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise UsageError("a durable subscription name must be a string of 1 to 200 characters")
    keys = parse_criteria(criteria)
    cursor = _DURABLE_CURSOR + name
    store = feeds.chains.store
    connection = ConnectionCursor.attach(cursor_in, name) if cursor_in is not None else None
    stored = connection.load() if connection is not None else await store.get_cursor(cursor)
    where = (f"row {name!r} of the application's {APP_CURSOR_TABLE}" if connection is not None
             else f"cursor {cursor!r}")
    state: CursorState | None = None
    if stored is not None:
        try:
            state = CursorState.decode(stored, where=where)
        except DecodeError as exc:
            raise StoreCorrupted(f"durable subscription {name!r}: {exc}") from None
        if state.closed:
            state = None
        elif set(state.criteria) != set(keys):
            raise UsageError(f"durable subscription {name!r} exists with other criteria")
    if state is None:
        state = CursorState.fresh(keys)
        if connection is not None:
            connection.write(state.encode())
        else:
            await store.put_cursor(cursor, state.encode())
    sid = hashlib.sha256(b"ketten-durable\0" + own_key + name.encode()).digest()[:SID_SIZE]
    feed = make_feed(state.criteria, sid, delivery, state.next, options)
    feeds.attach(feed)
    sub = DurableSubscription(feeds, name, feed, state, feeds.request_timeout, connection)
    try:
        sub._scope = await nursery.start(feed.maintain)
    except BaseException:
        feeds.detach(feed)
        raise
    return sub
