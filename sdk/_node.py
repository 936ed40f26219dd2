"""The node: composition root that owns a nursery, the plugins and the services."""

from __future__ import annotations

import time as _time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import attrs
import pluggy
import trio

from ._broker import Broker
from ._core.chain import Chain, Verify, WriterPolicy, check_successor
from ._config import NodeConfig
from ._core.event import Event
from ._core.identity import Identity, criterion_key
from ._plugins import make_plugin, plugin_manager
from ._publisher import ConflictHandler, Publisher
from ._subscriptions import (
    BrokerSubscriptionStatistics,
    DurableSubscription,
    Subscription,
    SubscriptionService,
    open_durable,
    open_subscription,
)
from ._sync import ReplicationStatistics, Replicator, read_batch
from ._wire import decode_message, encode_message, field
from .errors import (
    BrokenLink,
    ConfigError,
    DecodeError,
    KettenError,
    PeerUnreachable,
    ProtocolError,
    UsageError,
)
from .interfaces import Clock, Overlay, Peer, Reply, Store, Transport

__all__ = ["Node", "NodeStatistics", "open_node"]

_MAX_CACHED_HEADS = 1 << 16
Service = Callable[[Peer, Any], Awaitable[Any]]
MessageService = Callable[[Peer, Any], Awaitable[None]]


@attrs.frozen
class NodeStatistics:
    """A snapshot of a node's counters (see :meth:`Node.statistics`)."""

    address: str
    node_id: str
    events_appended: int
    events_received: int
    invalid_events: int
    requests_served: int
    requests_refused: int
    decode_errors: int
    transport: Any


@attrs.define(eq=False)
class Node:
    """A ketten node. Build one with :func:`open_node`; it is only usable inside it."""

    config: NodeConfig
    identity: Identity
    plugins: pluggy.PluginManager
    _transport: Transport | None = attrs.field(default=None, init=False)
    _store: Store | None = attrs.field(default=None, init=False)
    _overlay: Overlay | None = attrs.field(default=None, init=False)
    _clock: Clock | None = attrs.field(default=None, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _address: str | None = attrs.field(default=None, init=False)
    _services: dict[str, Service] = attrs.field(factory=dict, init=False)
    _message_services: dict[str, MessageService] = attrs.field(factory=dict, init=False)
    _policies: dict[bytes, WriterPolicy] = attrs.field(factory=dict, init=False)
    _locks: dict[bytes, trio.Lock] = attrs.field(factory=dict, init=False)
    _counts: dict[str, int] = attrs.field(init=False)
    _replicator: Replicator = attrs.field(init=False)
    _publisher: Publisher = attrs.field(init=False)
    _subscriptions: SubscriptionService = attrs.field(init=False)
    _time: Callable[[], int] | None = attrs.field(default=None, init=False)
    _heads: dict[bytes, Event] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self._counts = {
            "events_appended": 0,
            "events_received": 0,
            "invalid_events": 0,
            "requests_served": 0,
            "requests_refused": 0,
            "decode_errors": 0,
        }
        self.register_service("chain", self._serve_chain)
        options = self.config.options_for("replication")
        interval = options.get("anti_entropy", 2.0)
        if not isinstance(interval, int | float) or isinstance(interval, bool) or interval <= 0:
            raise ConfigError(f"replication option 'anti_entropy' must be a positive number of "
                              f"seconds, got {interval!r}")
        clock = options.get("time")
        if clock is not None and not callable(clock):
            raise ConfigError("replication option 'time' must be a callable returning ms")
        self._time = clock
        self._replicator = Replicator(self, interval=float(interval))
        broker = Broker(self, self._replicator)
        self._publisher = Publisher(self, self._replicator, broker)
        self._subscriptions = SubscriptionService.build(self, self._replicator)

    # -- components --------------------------------------------------------

    @property
    def address(self) -> str:
        """Where peers reach this node."""
        if self._address is None:
            raise UsageError("the node is not serving yet")
        return self._address

    @property
    def transport(self) -> Transport:
        assert self._transport is not None
        return self._transport

    @property
    def store(self) -> Store:
        assert self._store is not None
        return self._store

    @property
    def overlay(self) -> Overlay | None:
        return self._overlay

    @property
    def clock(self) -> Clock | None:
        return self._clock

    @property
    def nursery(self) -> trio.Nursery:
        """The node's nursery: services started here end when the node closes."""
        if self._nursery is None:
            raise UsageError("the node is not open")
        return self._nursery

    def statistics(self) -> NodeStatistics:
        """A frozen snapshot of this node's counters."""
        return NodeStatistics(
            address=self._address or "",
            node_id=self.identity.node_id.hex(),
            transport=self._transport.statistics() if self._transport else None,
            **self._counts,
        )

    # -- services ----------------------------------------------------------

    def register_service(self, name: str, handler: Service) -> None:
        """Answer requests addressed to ``name`` with ``handler(peer, body)``.

        Raises :class:`~ketten.errors.UsageError` if the name is taken.
        """
        if name in self._services:
            raise UsageError(f"service {name!r} is already registered")
        self._services[name] = handler

    def register_message_service(self, name: str, handler: MessageService) -> None:
        """Take one-way messages addressed to ``name`` with ``handler(peer, body)``."""
        if name in self._message_services:
            raise UsageError(f"message service {name!r} is already registered")
        self._message_services[name] = handler

    async def call(self, address: str, service: str, body: Any, *,
                   timeout: float | None = None, retransmit: bool = False) -> Any:
        """Send a request to ``service`` at ``address`` and return the reply body.

        With ``retransmit`` the request is sent again when no reply has come
        after 1/8 of ``timeout``, then every 1/4 of it: a lost request or
        reply then costs a fraction of the timeout instead of all of it. Only
        for requests the peer may safely handle twice (reads, idempotent
        offers). Transports whose ``loses_frames`` attribute is false (TCP)
        are not retransmitted on; a transport without it is.

        Raises :class:`~ketten.errors.PeerUnreachable` (refused, or no reply
        within ``timeout``, default ``config.request_timeout``),
        :class:`~ketten.errors.RemoteError` (the peer answered with an error),
        :class:`~ketten.errors.DecodeError` (the reply is malformed).
        """
        _, reply_body = await self.request(address, service, body, timeout=timeout,
                                           retransmit=retransmit)
        return reply_body

    async def request(self, address: str, service: str, body: Any, *,
                      timeout: float | None = None,
                      retransmit: bool = False) -> tuple[Peer, Any]:
        """Like :meth:`call`, and also return the authenticated peer that answered."""
        limit = self.config.request_timeout if timeout is None else timeout
        data = encode_message(service, body)
        with trio.move_on_after(limit):
            # A transport that cannot lose frames (TCP) gets nothing from a
            # second copy but the extra work of answering it.
            if retransmit and getattr(self.transport, "loses_frames", True):
                reply = await self._request_with_retransmits(address, data, limit)
            else:
                reply = await self.transport.request(address, data)
            name, reply_body = decode_message(reply.data)
            if name != service:
                raise ProtocolError(f"{address} answered a {service!r} request as {name!r}")
            return reply.peer, reply_body
        raise PeerUnreachable(f"no reply from {address} within {limit} s")

    async def _request_with_retransmits(self, address: str, data: bytes, limit: float) -> Reply:
        # Earlier copies stay outstanding: a reply that is merely slow (longer
        # than the retransmission interval) still counts, whichever copy it answers.
        replies: list[Reply] = []
        failures: list[KettenError] = []
        async with trio.open_nursery() as nursery:

            async def attempt() -> None:
                try:
                    replies.append(await self.transport.request(address, data))
                except KettenError as exc:  # refused, or the peer answered with an error
                    failures.append(exc)
                nursery.cancel_scope.cancel()

            wait = limit / 8
            while True:
                nursery.start_soon(attempt)
                await trio.sleep(wait)
                wait = min(wait * 2, limit / 4)
        if replies:
            return replies[0]
        raise failures[0]

    async def notify(self, address: str, service: str, body: Any) -> None:
        """Send a one-way message to ``service`` at ``address`` (it may be lost)."""
        await self.transport.send(address, encode_message(service, body))

    async def handle_request(self, peer: Peer, data: bytes) -> bytes:
        try:
            service, body = decode_message(data)
        except DecodeError:
            self._counts["decode_errors"] += 1
            raise
        handler = self._services.get(service)
        if handler is None:
            self._counts["requests_refused"] += 1
            raise ProtocolError(f"unknown service {service!r}")
        try:
            answer = await handler(peer, body)
        except KettenError:
            self._counts["requests_refused"] += 1
            raise
        self._counts["requests_served"] += 1
        return encode_message(service, answer)

    async def handle_message(self, peer: Peer, data: bytes) -> None:
        try:
            service, body = decode_message(data)
        except DecodeError:
            self._counts["decode_errors"] += 1
            return
        handler = self._message_services.get(service)
        if handler is None:
            self._counts["requests_refused"] += 1
            return
        try:
            await handler(peer, body)
        except KettenError:
            self._counts["requests_refused"] += 1

    def replication_statistics(self) -> ReplicationStatistics:
        """A frozen snapshot of the sync, fork and anti-entropy counters."""
        return self._replicator.statistics()

    def now_ms(self) -> int:
        """Wall-clock milliseconds for event ``time`` fields (informational only).

        The ``replication`` option ``time`` (a callable) replaces the system
        clock, so that simulations in virtual time replay exactly.
        """
        if self._time is not None:
            return int(self._time())
        return int(_time.time() * 1000)

    def appended(self, events: Sequence[Event]) -> None:
        """Account for events just written to the store (each chain's last one as its
        new head; the events may belong to several chains) and tell the plugins."""
        self._counts["events_appended"] += len(events)
        heads = self._heads
        hook = self.plugins.hook.ketten_event_appended
        for event in events:
            if len(heads) >= _MAX_CACHED_HEADS:
                heads.clear()
            heads[event.criterion] = event
            hook(node=self, event=event)
        self._subscriptions.appended(events)

    async def head(self, criterion: bytes) -> Event | None:
        """The head of the local chain; from memory when this node wrote it last."""
        cached = self._heads.get(criterion)
        if cached is not None:
            return cached
        head = await self.store.head(criterion)
        if head is not None:
            self._heads[criterion] = head
        return head

    def forget_head(self, criterion: bytes) -> None:
        """Drop the remembered head (the store answered otherwise)."""
        self._heads.pop(criterion, None)

    def observe_clock(self, event: Event) -> None:
        """Merge the clock stamp of an event received from a peer, if this node has a clock."""
        if self._clock is not None and event.author != self.identity.public_key:
            try:
                self._clock.observe(event.clock)
            except DecodeError:
                self._counts["decode_errors"] += 1

    # -- replicated chains -------------------------------------------------

    @staticmethod
    def _key(criterion: bytes | str) -> bytes:
        if isinstance(criterion, str):
            return criterion_key(criterion)
        if type(criterion) is not bytes or len(criterion) != 32:
            raise UsageError(
                "criterion must be a name (str) or a 32-byte key (see ketten.criterion_key)")
        return criterion

    async def publish(
        self,
        criterion: bytes | str,
        payload: bytes,
        *,
        command: int | None = None,
        on_conflict: ConflictHandler | None = None,
        deadline: float = 10.0,
        writers: Sequence[bytes] | None = None,
        author: Identity | None = None,
    ) -> Event:
        """Append ``payload`` to the replicated chain of ``criterion``; return the event.

        ``criterion`` is a name (hashed with :func:`ketten.criterion_key`) or a
        32-byte key. The event is built on the latest known head and offered
        to the ``r`` brokers of the criterion at once; it is acknowledged
        when a majority of ``r`` holds it. When a majority answers that the
        chain has moved on, the node syncs, calls ``on_conflict(new_head)``
        (sync or async; it returns the payload to retry with, ``None`` for
        the same one, or raises to give up) and retries with jittered
        exponential backoff. ``deadline`` is how many seconds to keep
        trying. ``command`` makes the publish idempotent: the id
        ``(author, command)`` is applied at most once per chain, and
        publishing it again with the same payload returns the event already
        applied (see :class:`ketten.Agent`). ``writers`` (only for the first
        event of a chain) restricts who may append. ``author`` signs as
        another identity (default: the node's).

        Raises :class:`~ketten.errors.QuorumUnavailable` when fewer than a
        majority of the brokers answered (nothing was acknowledged),
        :class:`~ketten.errors.Unavailable` when no event gathered a majority
        before the deadline, :class:`~ketten.errors.CommandIdReused` when the
        command id already names other content,
        :class:`~ketten.errors.WriterNotAllowed` /
        :class:`~ketten.errors.InvalidEvent` when the brokers refuse the
        event, :class:`~ketten.errors.UsageError` for bad arguments.
        After an :class:`~ketten.errors.Unavailable` error the event may still
        reach the chain later (a minority of brokers may hold it, and brokers
        that catch up can adopt it): publish with a ``command`` id and retry
        the same id to settle the outcome exactly once.
        """
        key = self._key(criterion)
        if not isinstance(payload, bytes):
            raise UsageError(f"payload must be bytes, not {type(payload).__name__}")
        if command is not None and (type(command) is not int or command < 0):
            raise UsageError("command must be a non-negative integer")
        if not isinstance(deadline, int | float) or deadline <= 0:
            raise UsageError("deadline must be a positive number of seconds")
        self.nursery  # noqa: B018 - raises UsageError unless the node is open
        return await self._publisher.publish(
            key, payload, identity=author if author is not None else self.identity,
            command=command, on_conflict=on_conflict, deadline=float(deadline),
            writers=list(writers) if writers is not None else None,
        )

    async def sync(self, criterion: bytes | str) -> Event | None:
        """Bring the local copy of ``criterion`` in line with a majority of its brokers.

        Returns the local head afterwards (``None``: the chain is empty).
        Raises :class:`~ketten.errors.QuorumUnavailable` if fewer than a
        majority of the brokers answered.
        """
        return await self._replicator.sync(self._key(criterion), quorum=True)

    async def read(self, criterion: bytes | str, since: int = 0) -> list[Event]:
        """The events of ``criterion`` from seq ``since`` on, after a sync with a majority.

        Raises :class:`~ketten.errors.QuorumUnavailable` if fewer than a
        majority of the brokers answered.
        """
        key = self._key(criterion)
        await self._replicator.sync(key, quorum=True)
        return await self.store.range(key, max(since, 0))

    async def replay(self, criterion: bytes | str, from_seq: int = 0) -> AsyncIterator[Event]:
        """The local copy of ``criterion`` from ``from_seq`` to its head, in chain order.

        Reads the store in pages, so long chains stream. No network.
        """
        key = self._key(criterion)
        start = max(from_seq, 0)
        while True:
            page = await self.store.range(key, start, start + 512)
            for event in page:
                yield event
            if len(page) < 512:
                return
            start += 512

    async def view(self, criterion: bytes | str, at: bytes) -> Chain:
        """The chain of ``criterion`` as it was when the event ``at`` was its head.

        ``at`` may also be an orphaned event: the view is then the branch it
        was on. Rolling application state back is replaying this view. No
        network. Raises :class:`KeyError` if no stored event has that hash
        in this chain.
        """
        key = self._key(criterion)
        target = await self.store.get(at)
        if target is None or target.criterion != key:
            raise KeyError(at.hex())
        path: list[Event] = []
        tip: Event | None = target
        while tip is not None:
            found = await self.store.range(key, tip.seq, tip.seq + 1)
            if found and found[0].hash == tip.hash:
                break
            path.append(tip)
            tip = await self.store.get(tip.prev) if tip.prev is not None else None
            if tip is None and path[-1].seq > 0:
                raise KeyError(at.hex())
        prefix = await self.store.range(key, 0, tip.seq + 1) if tip is not None else []
        return Chain(key, verify=Verify.LINKS, events=[*prefix, *reversed(path)])

    async def orphans(self, criterion: bytes | str) -> list[Event]:
        """Events of ``criterion`` that lost a fork here, oldest first."""
        return await self.store.orphans(self._key(criterion))

    # -- subscriptions -----------------------------------------------------

    def subscribe(
        self,
        criteria: str | bytes | Sequence[str | bytes],
        *,
        delivery: str | None = None,
        start: int | str | Mapping[str | bytes, int] = 0,
        options: Mapping[str, Any] | None = None,
    ) -> AbstractAsyncContextManager[Subscription]:
        """Push subscription: ``async with node.subscribe(c) as sub: async for event in sub:``.

        ``criteria`` are names or 32-byte keys. The brokers of each criterion
        keep a lease for the subscription (renewed every ``check`` seconds of
        the ``subscriptions`` options) and notify it of every event they
        append; a lost notification is made up by the gap it leaves or by the
        next renewal, which reports the brokers' heads. Every event is verified
        as a synced one and handed to the application once a majority of its
        brokers hold it, through the delivery plugin ``delivery`` (default
        ``config.delivery``; e.g. ``"causal"``), built with ``options`` plus
        ``criteria`` and ``start``. ``start`` is the first seq (default 0: the
        whole chain, then live events), a ``{criterion: seq}`` map, or
        ``"head"`` (only events appended after subscribing). Leaving the block
        drops the leases.

        Raises :class:`~ketten.errors.UsageError` for bad criteria or start,
        :class:`~ketten.errors.PluginNotFound` / :class:`~ketten.errors.ConfigError`
        for the delivery plugin, :class:`~ketten.errors.QuorumUnavailable`
        (``start="head"`` only) when a majority of brokers is unreachable;
        iterating raises :class:`~ketten.errors.HoldbackFull` when the delivery
        plugin's queue is at its bound and nothing can be delivered.
        """
        return open_subscription(self, self._subscriptions, criteria, delivery=delivery,
                                 start=start, options=options)

    async def durable_subscription(
        self,
        name: str,
        criteria: str | bytes | Sequence[str | bytes],
        *,
        delivery: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> DurableSubscription:
        """Open (or resume) the durable subscription ``name`` of this node.

        ``await sub.get()`` returns each event of ``criteria`` exactly once,
        across restarts of this node and of the brokers: see
        :class:`~ketten.DurableSubscription` for what *delivered* means. A
        subscription that was unsubscribed starts afresh.

        Raises :class:`~ketten.errors.UsageError` for a bad name or criteria,
        or criteria other than those the subscription was created with;
        :class:`~ketten.errors.StoreCorrupted` if its stored cursor is damaged;
        :class:`~ketten.errors.PluginNotFound` / :class:`~ketten.errors.ConfigError`
        for the delivery plugin.
        """
        return await open_durable(self, self._subscriptions, name, criteria,
                                  delivery=delivery, options=options)

    def subscription_statistics(self) -> BrokerSubscriptionStatistics:
        """A frozen snapshot of the broker side of subscriptions (subscriber lists)."""
        return self._subscriptions.statistics()

    # -- local chains ------------------------------------------------------

    def _lock(self, criterion: bytes) -> trio.Lock:
        lock = self._locks.get(criterion)
        if lock is None:
            lock = self._locks[criterion] = trio.Lock()
        return lock

    async def policy(self, criterion: bytes) -> WriterPolicy | None:
        """The writer policy of a stored chain, or ``None`` if there is no genesis."""
        policy = self._policies.get(criterion)
        if policy is None:
            first = await self.store.range(criterion, 0, 1)
            if not first:
                return None
            policy = self._policies[criterion] = WriterPolicy.of(first[0])
        return policy

    async def append_local(
        self,
        criterion: bytes,
        payload: bytes,
        *,
        command: int | None = None,
        writers: Sequence[bytes] | None = None,
    ) -> Event:
        """Sign an event on the local head of ``criterion`` and store it here only.

        ``writers`` (genesis only) restricts who may append. Raises
        :class:`~ketten.errors.UsageError` for bad arguments and
        :class:`~ketten.errors.InvalidEvent` if this node may not write.
        """
        if type(criterion) is not bytes or len(criterion) != 32:
            raise UsageError("criterion must be a 32-byte key (see ketten.criterion_key)")
        async with self._lock(criterion):
            head = await self.store.head(criterion)
            if writers is not None and head is not None:
                raise UsageError("writers can only be declared by the genesis of a chain")
            event = Event.create(
                self.identity,
                criterion=criterion,
                seq=0 if head is None else head.seq + 1,
                prev=None if head is None else head.hash,
                payload=payload,
                time=int(_time.time() * 1000),
                command=command,
                clock=self._clock.stamp() if self._clock is not None else b"",
                writers=writers,
            )
            await self._store_checked([event])
            return event

    async def store_events(self, events: Sequence[Event], *, verify: Verify = Verify.FULL) -> int:
        """Validate events of one chain against the stored head and store the new ones.

        Events already stored are skipped. Returns how many were added.
        Raises :class:`~ketten.errors.InvalidEvent` for an event that breaks
        the chain rules (nothing after it is stored).
        """
        if not events:
            return 0
        criterion = events[0].criterion
        async with self._lock(criterion):
            head = await self.store.head(criterion)
            fresh = [e for e in events if head is None or e.seq > head.seq]
            if not fresh:
                return 0
            await self._store_checked(fresh, head=head, verify=verify)
            return len(fresh)

    async def _store_checked(self, events: Sequence[Event], *, head: Event | None = None,
                             verify: Verify = Verify.FULL) -> None:
        criterion = events[0].criterion
        if head is None:
            head = await self.store.head(criterion)
        policy = await self.policy(criterion)
        prev = head
        try:
            for event in events:
                if event.criterion != criterion:
                    raise BrokenLink("a batch may only hold events of one criterion")
                check_successor(prev, event, policy=policy, verify=verify)
                if event.seq == 0:
                    policy = WriterPolicy.of(event)
                prev = event
        except KettenError:
            self._counts["invalid_events"] += 1
            raise
        await self.store.append(events)
        if policy is not None:
            self._policies[criterion] = policy
        self.appended(events)

    async def pull(self, address: str, criterion: bytes) -> int:
        """Fetch what ``address`` has of ``criterion`` beyond the local head.

        Every event is verified before it is stored. Returns how many events
        were added. Raises :class:`~ketten.errors.PeerUnreachable`,
        :class:`~ketten.errors.RemoteError`, :class:`~ketten.errors.DecodeError`
        or :class:`~ketten.errors.InvalidEvent` (the peer's chain does not
        extend ours).
        """
        added = 0
        while True:
            head = await self.store.head(criterion)
            next_seq = 0 if head is None else head.seq + 1
            body = await self.call(address, "chain", {
                "op": "after", "c": criterion, "seq": next_seq,
                "max_bytes": self.config.sync_batch_bytes,
            })
            raw_events = field(body, "events", list, where="chain reply")
            more = field(body, "more", bool, where="chain reply")
            events = []
            for raw in raw_events:
                if type(raw) is not bytes:
                    raise DecodeError("events must be byte strings", where="chain reply")
                events.append(Event.from_bytes(raw, max_size=self.config.max_event_size))
            self._counts["events_received"] += len(events)
            if events and events[0].criterion != criterion:
                raise ProtocolError(f"{address} answered with events of another criterion")
            added += await self.store_events(events)
            if not more or not events:
                return added

    async def _serve_chain(self, peer: Peer, body: Any) -> Any:
        op = field(body, "op", str, where="chain request")
        criterion = field(body, "c", bytes, where="chain request")
        if op == "head":
            head = await self.store.head(criterion)
            return None if head is None else [head.seq, head.hash]
        if op == "after":
            seq = field(body, "seq", int, where="chain request")
            budget = min(field(body, "max_bytes", int, where="chain request"),
                         self.config.sync_batch_bytes)
            out, more = await read_batch(self.store, criterion, max(seq, 0), budget)
            return {"events": out, "more": more}
        raise ProtocolError(f"unknown chain operation {op!r}")


@asynccontextmanager
async def open_node(
    config: NodeConfig | None = None, *, plugins: pluggy.PluginManager | None = None
) -> AsyncIterator[Node]:
    """Open a node: build its plugins by name, open its store, serve, join.

    ``plugins`` lets many nodes share one plugin manager (see
    :func:`ketten.plugin_manager`); by default the installed plugins are
    discovered. Leaving the block cancels the node's tasks and closes its
    store. Raises :class:`~ketten.errors.PluginNotFound` for unknown plugin
    names and :class:`~ketten.errors.ConfigError` for bad options.
    """
    config = config if config is not None else NodeConfig()
    pm = plugins if plugins is not None else plugin_manager()
    identity = config.identity if config.identity is not None else Identity.generate()
    node = Node(config, identity, pm)
    node._store = make_plugin(pm, "store", config.store, config.options_for("store"), node)
    node._transport = make_plugin(
        pm, "transport", config.transport, config.options_for("transport"), node
    )
    if config.clock is not None:
        node._clock = make_plugin(pm, "clock", config.clock, config.options_for("clock"), node)
    if config.overlay is not None:
        node._overlay = make_plugin(
            pm, "overlay", config.overlay, config.options_for("overlay"), node
        )
    await node.store.open()
    # An error raised by the application's block is re-raised as itself, not
    # wrapped in the ExceptionGroup of the node's nursery; so is a single
    # ketten error that keeps the node from starting (a port in use, say).
    body_error: BaseException | None = None
    started = False
    try:
        async with trio.open_nursery() as nursery:
            node._nursery = nursery
            node._address = await nursery.start(node.transport.serve, node)
            if node._overlay is not None:
                await nursery.start(node._overlay.run)
            await nursery.start(node._replicator.run)
            await nursery.start(node._subscriptions.run)
            pm.hook.ketten_node_started(node=node)
            started = True
            try:
                yield node
            except BaseException as exc:
                body_error = exc
            finally:
                pm.hook.ketten_node_stopping(node=node)
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        leaves = group.exceptions
        if not started and len(leaves) == 1 and isinstance(leaves[0], KettenError):
            raise leaves[0] from None
        raise
    finally:
        node._nursery = None
        with trio.CancelScope(shield=True):
            await node.store.aclose()
    if body_error is not None:
        raise body_error
