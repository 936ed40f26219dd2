"""``Node``: the composition root and public façade.

It builds the plugins by name, builds the parts (:class:`Rpc`,
:class:`LocalChains`, :class:`ReplicaSets`, :class:`Replicator`,
:class:`Broker`, :class:`Publisher`, :class:`Feeds`), wires them with the
narrow callables each needs, runs their tasks in its nursery and forwards
the public methods. No part holds a reference to the node.
"""

from __future__ import annotations

import functools
import os
import random
import time as _time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

import attrs
import pluggy
import trio
import trio.testing

from .._core.chain import Chain, Verify
from .._core.copies import CopyBudget
from .._core.event import Event
from .._core.identity import Identity, criterion_key
from .._core.membership import ChainConfig, Member, Pos
from .._core.quota import RateLimit
from ..errors import (
    ConfigError,
    InternalError,
    KettenError,
    NodeClosed,
    PeerUnreachable,
    StoreCorrupted,
    UsageError,
)
from ..interfaces import Clock, Overlay, Peer, Store, Transport
from .broker import Broker
from .closing import Closing
from .config import NodeConfig
from .copies import Copies, CopyStatistics
from .feeds import (
    BrokerSubscriptionStatistics,
    DurableSubscription,
    Feed,
    Feeds,
    Subscription,
    open_durable,
    open_subscription,
)
from .local_chains import LocalChains
from .node_key import claim_store, keep, kept_identity
from .plugins import check_selected, make_plugin, plugin_manager
from .publisher import PUBLISH_DEADLINE, ConflictHandler, Publisher
from .reader import Reader
from .replica_sets import Creation, ReplicaSets
from .replicator import ReplicationOptions, ReplicationStatistics, Replicator
from .rpc import Rpc, guarded

__all__ = ["Node", "NodeStatistics", "open_node"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


def _while_open(method: Callable[Concatenate[Node, _P], Coroutine[Any, Any, _T]],
                ) -> Callable[Concatenate[Node, _P], Coroutine[Any, Any, _T]]:
    """A public call that raises :class:`~ketten.errors.NodeClosed` on a closed node,
    and is cut short with it when the node closes while it runs (from a task of
    the application's own, which the node's closing does not cancel)."""

    @functools.wraps(method)
    async def call(self: Node, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        with self._closing.call():
            return await method(self, *args, **kwargs)

    return call


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
    internal_errors: int
    transport: Any


class _NoTransport:
    """Stands in until the transport plugin is built."""

    async def request(self, address: str, data: bytes) -> Any:
        raise PeerUnreachable("the node is not serving yet")

    async def send(self, address: str, data: bytes) -> None:
        raise PeerUnreachable("the node is not serving yet")


@attrs.define(eq=False, repr=False)
class Node:
    """A ketten node. Build one with :func:`open_node`; it is only usable inside it.

    Once the ``open_node`` block is left, the methods an application calls
    (publishing, reading, subscribing and the rest; not the ones plugins use
    to talk to peers) raise :class:`~ketten.errors.NodeClosed`, and such
    calls still running in tasks of the application's own (outside the node's
    nursery), subscriptions being iterated among them, end with it at once."""

    config: NodeConfig
    identity: Identity
    plugins: pluggy.PluginManager
    _rpc: Rpc = attrs.field(init=False)
    _transport: Transport | None = attrs.field(default=None, init=False)
    _store: Store | None = attrs.field(default=None, init=False)
    _overlay: Overlay | None = attrs.field(default=None, init=False)
    _clock: Clock | None = attrs.field(default=None, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _address: str | None = attrs.field(default=None, init=False)
    _rng: random.Random = attrs.field(init=False)
    _options: ReplicationOptions = attrs.field(init=False)
    _chains: LocalChains = attrs.field(init=False)
    _sets: ReplicaSets = attrs.field(init=False)
    _replicator: Replicator = attrs.field(init=False)
    _broker: Broker = attrs.field(init=False)
    _publisher: Publisher = attrs.field(init=False)
    _reader: Reader = attrs.field(init=False)
    _feeds: Feeds = attrs.field(init=False)
    _copies: Copies = attrs.field(init=False)
    _closing: Closing = attrs.field(init=False, factory=lambda: Closing("the node"))

    def __attrs_post_init__(self) -> None:
        self._rpc = Rpc(_NoTransport(), self.config.request_timeout,  # type: ignore[arg-type]
                        client=self.config.client)
        self._rng = random.Random(self.identity.node_id)
        self._options = ReplicationOptions.parse(
            self.config.options_for("replication"), request_timeout=self.config.request_timeout,
            batch_bytes=self.config.sync_batch_bytes, max_event_size=self.config.max_event_size)

    def _wire(self) -> None:
        """Build the parts once the plugins exist."""
        config = self.config
        threads = self._options.verify_threads
        if threads is None:
            cores = os.cpu_count() or 1
            # Work on a thread races a virtual clock: a seed would no longer replay.
            virtual = isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock)
            threads = 0 if virtual or cores < 2 else min(cores, 4)
        chains = self._chains = LocalChains(self.store, config.max_event_size,
                                            verify_threads=threads)
        replicator: Replicator | None = None

        def local_route(criterion: bytes) -> Any:
            return None if replicator is None else replicator.route_of(criterion)

        sets = self._sets = ReplicaSets(self._rpc, self._overlay, self._member,
                                        config.replication, local_route, config.request_timeout,
                                        lambda: self.nursery,
                                        memory=self._options.creation_memory)
        self._rpc.seen = sets.heard
        self._rpc.damaged = self._damaged
        replicator = self._replicator = Replicator(self._member, self._rpc, chains, sets,
                                                   self._options, self._rng)
        chains.replicated = replicator.holds
        sets.rival = replicator.settle_rival_soon
        sets.known_changed = replicator.flush_soon
        sets.load = replicator.route
        self._broker = Broker(self._rpc, chains, replicator, sets, None, config.request_timeout,
                              config.sync_batch_bytes,
                              RateLimit(self._options.creations_per_second,
                                        self._options.creation_burst),
                              RateLimit(self._options.author_bytes_per_second,
                                        self._options.author_bytes_burst))
        self._publisher = Publisher(self._rpc, sets, self._broker, self._member, self._stamp,
                                    self._observe, self._clock is not None, self.now_ms,
                                    config.request_timeout, self._rng, lambda: self.nursery,
                                    self._options.max_publishing, config.max_event_size)
        self._reader = Reader(self._rpc, chains, sets, replicator, self._broker,
                              self.identity.public_key, self._rng,
                              fetch_chain=getattr(self._overlay, "fetch_chain", None),
                              fetch_above=getattr(self._overlay, "fetch_above", 256),
                              fetch_timeout=10 * config.request_timeout)
        settings = Feeds.parse_options(config.options_for("subscriptions"),
                                       self._options.anti_entropy)
        self._feeds = Feeds(self._rpc, chains, self._member, self.now_ms, self._members_of,
                            self._is_broker, self._local_commit,
                            functools.partial(replicator.pull_committed, strict=True),
                            sets.address, config.request_timeout, self._rng,
                            closing=self._closing, **settings)
        replicator.on_committed(self._feeds.committed)
        feeds = self._feeds
        self._copies = Copies(chains, CopyBudget(self._options.copies_events),
                              lambda key: (replicator.holds(key) or replicator.busy(key)
                                           or feeds.subscribed(key)))
        replicator.on_released(self._copies.note)
        chains.on_appended(self._appended)
        chains.on_orphaned(self._orphaned)
        chains.on_dropped(self._dropped)

    def __repr__(self) -> str:
        where = self._address if self._address is not None else "not serving"
        return f"<Node {self.identity.node_id.hex()[:12]} at {where}>"

    # -- the plugin-facing side (ketten.interfaces.NodeContext) ---------------

    @property
    def address(self) -> str:
        """Where peers reach this node."""
        if self._address is None:
            raise UsageError("the node is not serving yet")
        return self._address

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            raise UsageError("the node has no transport yet")
        return self._transport

    @property
    def store(self) -> Store:
        if self._store is None:
            raise UsageError("the node has no store yet")
        return self._store

    @property
    def overlay(self) -> Overlay | None:
        return self._overlay

    @property
    def clock(self) -> Clock | None:
        return self._clock

    @property
    def nursery(self) -> trio.Nursery:
        """The node's nursery: tasks started here end when the node closes."""
        if self._nursery is None:
            self._closing.check()
            raise NodeClosed("the node is not open")
        return self._nursery

    def register_service(self, name: str,
                         handler: Callable[[Peer, Any], Awaitable[Any]]) -> None:
        """Answer requests addressed to ``name`` with ``handler(peer, body)``.

        The node's own services take the names ``offer``, ``append``, ``vote``,
        ``commit``, ``fetch``, ``locate``, ``handover``, ``digest``, ``sub`` and
        ``claim-check``; the overlay takes its own (``kad``, ``static``,
        ``gosskip``). Raises :class:`~ketten.errors.UsageError` if the name is taken.
        """
        self._rpc.serve_raw(name, handler)

    def register_message_service(self, name: str,
                                 handler: Callable[[Peer, Any], Awaitable[None]]) -> None:
        """Take one-way messages addressed to ``name`` with ``handler(peer, body)``
        (the node takes ``commit-notice``, ``elect`` and ``subev``). Raises
        :class:`~ketten.errors.UsageError` if the name is taken."""
        self._rpc.serve_messages(name, handler)

    async def request(self, address: str, service: str, body: Any, *,
                      timeout: float | None = None,
                      retransmit: bool = False) -> tuple[Peer, Any]:
        """Send a request to ``service`` at ``address``; the authenticated peer and its reply.

        Raises :class:`~ketten.errors.PeerUnreachable`,
        :class:`~ketten.errors.RemoteError`, :class:`~ketten.errors.DecodeError`.
        """
        return await self._rpc.call_raw(address, service, body, timeout=timeout,
                                        retransmit=retransmit)

    async def call(self, address: str, service: str, body: Any, *,
                   timeout: float | None = None, retransmit: bool = False) -> Any:
        """Like :meth:`request`, returning only the reply body."""
        _, reply = await self.request(address, service, body, timeout=timeout,
                                      retransmit=retransmit)
        return reply

    async def notify(self, address: str, service: str, body: Any) -> None:
        """Send a one-way message to ``service`` at ``address`` (it may be lost)."""
        await self._rpc.notify(address, service, body)

    async def handle_request(self, peer: Peer, data: bytes) -> bytes:
        return await self._rpc.handle_request(peer, data)

    async def handle_message(self, peer: Peer, data: bytes) -> None:
        await self._rpc.handle_message(peer, data)

    def now_ms(self) -> int:
        """Wall-clock milliseconds for event ``time`` fields (informational only).

        The ``replication`` option ``time`` (a callable) replaces the system
        clock, so that simulations in virtual time replay exactly.
        """
        if self._options.time is not None:
            return int(self._options.time())
        return int(_time.time() * 1000)

    # -- wiring helpers --------------------------------------------------------

    def _damaged(self, exc: StoreCorrupted) -> None:
        """Stored data of a chain failed its check: quarantine and refill it."""
        if exc.criterion is None or exc.seq is None or self._nursery is None:
            return
        self._nursery.start_soon(guarded, self._replicator.quarantine, exc.criterion, exc.seq)

    def _member(self) -> Member:
        return Member(self.identity.public_key, self._address or "unbound")

    def _stamp(self) -> bytes:
        return self._clock.stamp() if self._clock is not None else b""

    def _observe(self, event: Event) -> None:
        if self._clock is not None and event.clock:
            try:
                self._clock.observe(event.clock)
            except KettenError:
                pass

    def _appended(self, events: Sequence[Event]) -> None:
        hook = self.plugins.hook.ketten_event_appended
        for event in events:
            self._observe(event)
            hook(node=self, event=event)

    def _orphaned(self, criterion: bytes, orphans: Sequence[Event], head: Event | None) -> None:
        self.plugins.hook.ketten_fork_resolved(node=self, criterion=criterion,
                                               orphaned=list(orphans), head=head)

    def _dropped(self, criterion: bytes) -> None:
        self.plugins.hook.ketten_chain_dropped(node=self, criterion=criterion)

    async def _members_of(self, criterion: bytes) -> list[Member]:
        found = await self._sets.route(criterion)
        if isinstance(found, Creation):
            return list(found.members)  # the brokers it will be created on
        return list(found.config.members())

    async def _is_broker(self, criterion: bytes) -> bool:
        replica = await self._replicator.replica(criterion)
        if replica is not None and replica.config is not None:
            return replica.is_voter()
        # No such chain here yet: one of the nodes it would be created on.
        own = self.identity.public_key
        return own in self._sets.desired_keys(criterion)

    def _local_commit(self, criterion: bytes) -> Pos | None:
        replica = self._replicator.loaded(criterion)
        return None if replica is None else replica.commit

    def _key(self, criterion: bytes | str) -> bytes:
        if isinstance(criterion, str):
            return criterion_key(criterion)
        if type(criterion) is bytes and len(criterion) == 32:
            return criterion
        raise UsageError("criterion must be a name (str) or a 32-byte key")

    # -- statistics ------------------------------------------------------------

    def statistics(self) -> NodeStatistics:
        """A frozen snapshot of this node's counters."""
        rpc = self._rpc.statistics()
        local = self._chains.statistics()
        return NodeStatistics(
            address=self._address or "",
            node_id=self.identity.node_id.hex(),
            events_appended=local.events_appended,
            events_received=self._broker.events_received + self._replicator.statistics(
            ).events_synced,
            invalid_events=local.invalid_events,
            requests_served=rpc.requests_served,
            requests_refused=rpc.requests_refused,
            decode_errors=rpc.decode_errors,
            internal_errors=rpc.internal_errors,
            transport=self._transport.statistics() if self._transport else None,
        )

    def replication_statistics(self) -> ReplicationStatistics:
        """A frozen snapshot of elections, appends, moves and anti-entropy counters."""
        return self._replicator.statistics()

    def subscription_statistics(self) -> BrokerSubscriptionStatistics:
        """A frozen snapshot of the broker side of subscriptions (subscriber lists)."""
        return self._feeds.statistics()

    def copy_statistics(self) -> CopyStatistics:
        """A frozen snapshot of this node's reader copies (chains it holds but does not
        replicate) and of those dropped to stay within ``copies_events``."""
        return self._copies.statistics()

    # -- publishing --------------------------------------------------------------

    @_while_open
    async def publish(
        self,
        criterion: bytes | str,
        payload: bytes,
        *,
        command: int | None = None,
        on_conflict: ConflictHandler | None = None,
        deadline: float = PUBLISH_DEADLINE,
        writers: Sequence[bytes] | None = None,
        author: Identity | None = None,
    ) -> Event:
        """Append ``payload`` to the replicated chain of ``criterion``; return the event.

        ``criterion`` is a name (hashed with :func:`ketten.criterion_key`) or a
        32-byte key. The event is built on the latest head this node knows
        and offered to the chain's leader, which appends it if it extends its
        head and acknowledges it once a majority of the chain's configuration
        holds it (committed). When the chain has moved on, ``on_conflict(new_head)``
        is called (sync or async; it returns the payload to retry with,
        ``None`` for the same one, or raises to give up) and the event is
        rebuilt on the new head; retries back off with jitter until
        ``deadline`` seconds (default 30) have passed. A node works on at most
        ``max_publishing`` (a replication option, 16) publish calls at once, and
        on one criterion one call at a time (side by side they would only
        conflict with each other); later calls wait their turn in call order,
        and their ``deadline`` starts when it comes: an overloaded node slows
        its publishers down rather than failing them. Cancelling a call stops
        it, but an event it already offered may still commit (as when
        :class:`~ketten.errors.PublishOutcomeUnknown` is raised): publish with
        a ``command`` id to retry safely. Every attempt of one call carries the
        hashes of the earlier ones, so one call is applied at most once.
        ``command`` makes the publish idempotent across calls: the id
        ``(author, command)`` is applied at most once per chain, and
        publishing it again with the same payload returns the event already
        applied (see :class:`ketten.Agent`). ``writers`` (only for the first
        event of a chain) restricts who may append. ``author`` signs as
        another identity (default: the node's).

        Raises :class:`~ketten.errors.QuorumUnavailable` when no broker stored
        the event (nothing was acknowledged, publishing again is safe);
        :class:`~ketten.errors.PublishOutcomeUnknown` when a broker may hold
        it and it may still be committed (retry with the same ``command``, or
        wait for one of its ``event_hashes``);
        :class:`~ketten.errors.CommandIdReused` when the command id already
        names other content; :class:`~ketten.errors.QuotaExceeded` when the
        event would start a chain and its author started too many at the
        broker lately, or its author sent the leader too many bytes lately;
        :class:`~ketten.errors.WriterNotAllowed` /
        :class:`~ketten.errors.InvalidEvent` when the brokers refuse the
        event; :class:`~ketten.errors.UsageError` for bad arguments and for an
        event bigger than ``max_event_size`` (at once, nothing is sent).
        """
        key = self._key(criterion)
        if not isinstance(payload, bytes):
            raise UsageError(f"payload must be bytes, not {type(payload).__name__}")
        if len(payload) >= self.config.max_event_size:
            raise UsageError(
                f"a payload of {len(payload)} bytes cannot fit an event of at most "
                f"max_event_size ({self.config.max_event_size} bytes): split the payload, "
                "or raise max_event_size in every node's NodeConfig")
        if command is not None and (type(command) is not int or command < 0):
            raise UsageError("command must be a non-negative integer")
        deadline = _seconds(deadline)
        self.nursery  # noqa: B018 - raises UsageError unless the node is open
        base = await self._chains.head_pos(key)
        return await self._publisher.publish(
            key, payload, identity=author if author is not None else self.identity,
            command=command, on_conflict=on_conflict, deadline=float(deadline),
            writers=list(writers) if writers is not None else None, base=base,
        )

    # -- reading -----------------------------------------------------------------

    @_while_open
    async def sync(self, criterion: bytes | str, *, deadline: float = 10.0) -> Event | None:
        """Bring the local copy of ``criterion`` up to the chain's committed head.

        Asks the chain's leader for its commit position (confirmed by a
        majority of the configuration) and copies the committed events
        this node lacks. Returns the local head afterwards (``None``: the
        chain is empty or unknown). Raises
        :class:`~ketten.errors.QuorumUnavailable` if no leader confirmed a
        commit position in time, :class:`~ketten.errors.UsageError` for a bad
        criterion or deadline.
        """
        key = self._key(criterion)
        deadline = _seconds(deadline)
        commit, source = await self._reader.committed_head(key, trio.current_time() + deadline)
        with self._copies.using(key):
            if commit is not None:
                events = await self._reader.committed(key, commit, source, commit[0])
                if events:
                    return events[-1]
            return await self._chains.head(key)

    @_while_open
    async def read(self, criterion: bytes | str, since: int = 0, *,
                   deadline: float = 10.0) -> list[Event]:
        """The committed events of ``criterion`` from seq ``since`` on.

        Every event acknowledged to any publisher before the call began is
        included (the leader confirms its commit position with a majority
        first; a leader is elected if the chain has none). ``deadline`` is
        how many seconds to keep trying. Raises
        :class:`~ketten.errors.QuorumUnavailable` if that could not be done
        in time, and :class:`~ketten.errors.StoreCorrupted` if this node's copy
        is damaged (the damaged range is then fetched again from the chain's
        brokers; read again), :class:`~ketten.errors.UsageError` for a bad
        criterion, ``since`` or deadline.
        """
        key = self._key(criterion)
        deadline = _seconds(deadline)
        _seq(since, "since")
        commit, source = await self._reader.committed_head(key, trio.current_time() + deadline)
        if commit is None:
            return []
        try:
            with self._copies.using(key):
                return await self._reader.committed(key, commit, source, since)
        except StoreCorrupted as exc:
            self._damaged(exc)
            raise

    @_while_open
    async def pin(self, criterion: bytes | str) -> None:
        """Keep this node's copy of ``criterion`` whatever the ``replication`` option
        ``copies_events`` says (a copy of a chain this node does not replicate is
        otherwise dropped when the copies outgrow it, least recently used first).
        Durable: the pin holds across restarts. Raises
        :class:`~ketten.errors.UsageError` for a bad criterion,
        :class:`~ketten.errors.StoreError` if the store fails."""
        await self._copies.pin(self._key(criterion))

    @_while_open
    async def unpin(self, criterion: bytes | str) -> None:
        """Undo :meth:`pin`: the copy counts against ``copies_events`` again. Raises
        :class:`~ketten.errors.UsageError`, :class:`~ketten.errors.StoreError`."""
        await self._copies.pin(self._key(criterion), False)

    async def replay(self, criterion: bytes | str, from_seq: int = 0) -> AsyncIterator[Event]:
        """The local copy of ``criterion`` from ``from_seq`` to its head, in chain order.

        Reads the store in pages, so long chains stream. No network. Raises
        :class:`~ketten.errors.UsageError` for a bad criterion or ``from_seq``.
        """
        key = self._key(criterion)
        start = _seq(from_seq, "from_seq", clamp=True)
        while True:
            with self._closing.call():
                page = await self.store.range(key, start, start + 512)
            for event in page:
                yield event
            if len(page) < 512:
                return
            start += 512

    @_while_open
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

    @_while_open
    async def orphans(self, criterion: bytes | str) -> list[Event]:
        """Events of ``criterion`` that lost a fork here, oldest first."""
        return await self.store.orphans(self._key(criterion))

    @_while_open
    async def head(self, criterion: bytes | str) -> Event | None:
        """The head of the local copy (no network)."""
        return await self._chains.head(self._key(criterion))

    @_while_open
    async def local_commit(self, criterion: bytes | str) -> tuple[int, bytes] | None:
        """The highest position ``(seq, hash)`` of the local copy known to be committed
        (no network): a replica's durable commit mark, or the head of a reader's
        copy (which holds committed events only). ``None``: nothing known committed.
        """
        key = self._key(criterion)
        if self._replicator.holds(key):
            replica = await self._replicator.replica(key)
            commit = None if replica is None else replica.commit
            if commit is None or await self._chains.hash_at(key, commit[0]) != commit[1]:
                return None
            return commit
        return await self._chains.head_pos(key)

    @_while_open
    async def configuration(self, criterion: bytes | str, *,
                            refresh: bool = False) -> ChainConfig | None:
        """The configuration of ``criterion``: the brokers that hold it, with its epoch.

        From this node's own replica state; a node that holds none of the chain
        (or ``refresh``) asks the nodes nearest to the key, and falls back on the
        route it learned earlier only when none of them answers (that route may
        name a configuration that was abandoned since). ``None``: no such chain
        (yet), or nobody answered and no route was learned.
        """
        key = self._key(criterion)
        if not refresh:
            route = self._replicator.route_of(key) or await self._replicator.route(key)
            if route is not None:
                return route.config
        try:
            found = await self._sets.route(key, refresh=True)
        except KettenError:
            learned = None if refresh else self._sets.cached(key)
            return None if learned is None else learned.config
        return None if isinstance(found, Creation) else found.config

    @_while_open
    async def recover(self, criterion: bytes | str, *, confirm: str) -> ChainConfig:
        """Operator recovery of a chain whose configuration lost its majority for good.

        Off by default: the ``replication`` option ``allow_recovery`` must be
        true on this node, and ``confirm`` must be ``"may lose acknowledged
        events"``. Like Kafka's unclean leader election it gives up what the
        lost brokers held beyond the longest surviving copy, which this node
        must hold. The chain gets a new epoch: its surviving members plus the
        nodes the overlay names, led by this node. Logged at WARNING and
        counted in :meth:`replication_statistics`. Returns the new
        configuration. Raises :class:`~ketten.errors.UsageError` when not
        allowed, not confirmed, or another member holds a longer copy.
        """
        if confirm != "may lose acknowledged events":
            raise UsageError('recovery must be confirmed: confirm="may lose acknowledged events"')
        return await self._replicator.recover(self._key(criterion))

    # -- subscriptions -----------------------------------------------------

    def _make_feed(self, keys: tuple[bytes, ...], sid: bytes, delivery: str | None,
                   start: Mapping[bytes, int], options: Mapping[str, Any] | None) -> Feed:
        name = delivery if delivery is not None else self.config.delivery
        if not isinstance(name, str) or not name:
            raise UsageError("delivery must be a delivery plugin name")
        plugin_options = {**(options or {}), "criteria": keys, "start": dict(start)}
        made = make_plugin(self.plugins, "delivery", name, plugin_options, self)
        return Feed(self._feeds, keys, sid, made, start, self._observe)

    async def _synced_head(self, key: bytes) -> Pos | None:
        head = await self.sync(key)
        return None if head is None else (head.seq, head.hash)

    def subscribe(
        self,
        criteria: str | bytes | Sequence[str | bytes],
        *,
        delivery: str | None = None,
        start: int | str | Mapping[str | bytes, int] = 0,
        options: Mapping[str, Any] | None = None,
        overflow: str = "block",
    ) -> AbstractAsyncContextManager[Subscription]:
        """Push subscription: ``async with node.subscribe(c) as sub: async for event in sub:``.

        ``criteria`` are names or 32-byte keys. The brokers of each criterion
        keep a lease for the subscription (renewed every ``check`` seconds of
        the ``subscriptions`` options) and notify it of every event that
        commits; a lost notification is made up by the gap it leaves or by
        the next renewal, which reports the brokers' commit positions. Every
        event is verified and handed to the application only once committed,
        through the delivery plugin ``delivery`` (default
        ``config.delivery``; e.g. ``"causal"``), built with ``options`` plus
        ``criteria`` and ``start``. ``start`` is the first seq (default 0: the
        whole chain, then live events), a ``{criterion: seq}`` map, or
        ``"head"`` (only events committed after subscribing; ``"latest"`` is
        the same, ``"earliest"`` is 0, as Kafka names them). Leaving the
        block drops the leases.

        A slow application never makes the subscription hold more than the
        ``buffer`` option of ``subscriptions`` in memory; ``overflow`` says
        what happens to the rest. ``"block"`` (default): nothing is lost, the
        subscription reads on as the application takes events. ``"drop"``:
        when more committed events wait than the buffer holds, the oldest are
        skipped, and iterating raises :class:`~ketten.errors.EventsDropped`
        in their place (naming the criterion and seqs; iterating again goes
        on). Needs a delivery that can skip (``"chain"``; not ``"causal"``).

        Raises :class:`~ketten.errors.UsageError` for bad criteria, start or
        overflow, :class:`~ketten.errors.PluginNotFound` / :class:`~ketten.errors.ConfigError`
        for the delivery plugin (or one that cannot skip, with ``"drop"``),
        :class:`~ketten.errors.QuorumUnavailable` (``start="head"`` only) when
        no leader could be reached; iterating raises
        :class:`~ketten.errors.HoldbackFull` when the delivery plugin's queue
        is at its bound and nothing can be delivered, and
        :class:`~ketten.errors.EventsDropped` (``overflow="drop"`` only).
        """
        return open_subscription(self._feeds, self.nursery, self._make_feed, criteria,
                                 delivery=delivery, start=start, options=options,
                                 head=self._synced_head, overflow=overflow)

    @_while_open
    async def durable_subscription(
        self,
        name: str,
        criteria: str | bytes | Sequence[str | bytes],
        *,
        delivery: str | None = None,
        options: Mapping[str, Any] | None = None,
        cursor_in: Any = None,
    ) -> DurableSubscription:
        """Open (or resume) the durable subscription ``name`` of this node.

        Every event of ``criteria`` is returned until it is acknowledged,
        across restarts of this node and of the brokers, and never after:
        ``await sub.get()`` acknowledges the event the previous call returned,
        ``async with sub.next() as event:`` acknowledges when its block
        succeeds. With ``cursor_in`` (a DB-API connection the application
        owns, not in autocommit mode) the cursor is kept in that database and
        committed in the same transaction as what the ``next()`` block wrote,
        which makes the block's effect exactly once. See
        :class:`~ketten.DurableSubscription`. A subscription that was
        unsubscribed starts afresh.

        Raises :class:`~ketten.errors.UsageError` for a bad name or criteria,
        criteria other than those the subscription was created with, or a
        ``cursor_in`` that is not a transactional DB-API connection;
        :class:`~ketten.errors.StoreCorrupted` if its stored cursor is damaged;
        :class:`~ketten.errors.StoreError` if the cursor cannot be read or
        written; :class:`~ketten.errors.PluginNotFound` /
        :class:`~ketten.errors.ConfigError` for the delivery plugin.
        """
        return await open_durable(self._feeds, self.nursery, self._make_feed,
                                  self.identity.public_key, name, criteria,
                                  delivery=delivery, options=options, cursor_in=cursor_in)

    # -- local chains (no replication) ---------------------------------------

    @_while_open
    async def append_local(
        self,
        criterion: bytes,
        payload: bytes,
        *,
        command: int | None = None,
        writers: Sequence[bytes] | None = None,
    ) -> Event:
        """Sign an event on the local head of ``criterion`` and store it here only.

        For chains this node keeps for itself (tests, offline tools): a chain
        that is replicated here refuses it. ``writers`` (genesis only)
        restricts who may append. Raises :class:`~ketten.errors.UsageError`
        for bad arguments and :class:`~ketten.errors.InvalidEvent` if this
        node may not write.
        """
        if type(criterion) is not bytes or len(criterion) != 32:
            raise UsageError("criterion must be a 32-byte key (see ketten.criterion_key)")
        chains = self._chains
        async with chains.lock(criterion):
            if await chains.state(criterion) is not None:
                raise UsageError("this chain is replicated here; publish to it instead")
            head = await chains.head(criterion)
            if writers is not None and head is not None:
                raise UsageError("writers can only be declared by the genesis of a chain")
            event = Event.create(
                self.identity, criterion=criterion,
                seq=0 if head is None else head.seq + 1,
                prev=None if head is None else head.hash,
                payload=payload, time=self.now_ms(), command=command, clock=self._stamp(),
                writers=writers)
            await chains.verify_run(criterion, head, [event])
            await chains.append([event])
            return event

    @_while_open
    async def pull(self, address: str, criterion: bytes) -> int:
        """Copy the committed events ``address`` holds of ``criterion`` beyond the local head.

        Every event is verified before it is stored; a batch that does not verify
        is dropped whole and counted (``statistics().invalid_events``). Returns
        how many were added. Raises :class:`~ketten.errors.PeerUnreachable` (or
        another :class:`~ketten.errors.Unavailable`) if ``address`` does not answer.
        """
        return await self._replicator.pull_committed(address, self._key(criterion), strict=True)


def _seconds(deadline: object) -> float:
    """A call's ``deadline``, checked. Raises :class:`~ketten.errors.UsageError`."""
    if not isinstance(deadline, int | float) or isinstance(deadline, bool) or not deadline > 0:
        raise UsageError(f"deadline must be a positive number of seconds, got {deadline!r}")
    return float(deadline)


def _seq(value: object, name: str, *, clamp: bool = False) -> int:
    """A seq argument, checked (``clamp``: a negative one is 0). Raises
    :class:`~ketten.errors.UsageError`."""
    if type(value) is not int or (value < 0 and not clamp):
        raise UsageError(f"{name} must be a seq (an int >= 0), got {value!r}")
    return max(value, 0)


def _build(config: NodeConfig, plugins: pluggy.PluginManager | None,
           identity: Identity) -> Node:
    """The node ``config`` describes, with ``identity``, its plugins made by
    ``plugins`` (default: the installed ones) and wired; nothing opened yet.

    Raises :class:`~ketten.errors.PluginNotFound` and :class:`~ketten.errors.ConfigError`.
    """
    pm = plugins if plugins is not None else plugin_manager()
    check_selected(pm, "delivery", config.delivery, config.clock)
    node = Node(config, identity, pm)
    node._store = make_plugin(pm, "store", config.store, config.options_for("store"), node)
    node._transport = make_plugin(
        pm, "transport", config.transport, config.options_for("transport"), node)
    node._rpc.attach(node._transport)
    if config.clock is not None:
        node._clock = make_plugin(pm, "clock", config.clock, config.options_for("clock"), node)
    if config.overlay is not None:
        node._overlay = make_plugin(
            pm, "overlay", config.overlay, config.options_for("overlay"), node)
    if config.client and not getattr(node._overlay, "supports_client", False):
        raise ConfigError(f"client=True needs an overlay that supports client nodes, such "
                          f"as 'kademlia'; {config.overlay!r} does not")
    node._wire()
    return node


def _alone(group: BaseExceptionGroup, started: bool) -> BaseException | None:
    """The one error of the node's nursery to raise as itself, if any: a ketten error
    that kept the node from starting (a port in use, say), or an InternalError (a bug)."""
    leaves = group.exceptions
    if len(leaves) != 1:
        return None
    leaf = leaves[0]
    if (not started and isinstance(leaf, KettenError)) or isinstance(leaf, InternalError):
        return leaf
    return None


@asynccontextmanager
async def open_node(
    config: NodeConfig | None = None, *, plugins: pluggy.PluginManager | None = None
) -> AsyncIterator[Node]:
    """Open a node: build its plugins by name, open its store, serve, join.

    ``plugins`` lets many nodes share one plugin manager (see
    :func:`ketten.plugin_manager`); by default the installed plugins are
    discovered. Leaving the block cancels the node's tasks and closes its
    store. A node configured without an identity keeps its key in its store's
    directory (``node.key``), so that reopening the store is the same node;
    a store opened by one node is refused to any other. Raises
    :class:`~ketten.errors.PluginNotFound` for unknown plugin names and
    :class:`~ketten.errors.ConfigError` for bad options and for a store that
    belongs to another node.
    """
    config = config if config is not None else NodeConfig()
    kept = kept_identity(config)
    node = _build(config, plugins, kept.identity)
    pm = node.plugins
    await node.store.open()
    try:
        keep(kept)
        await claim_store(node.store, node.identity, node.config)
    except BaseException:
        with trio.CancelScope(shield=True):
            await node.store.aclose()
        raise
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
            await nursery.start(node._copies.run)
            nursery.start_soon(node._sets.settle, node._options.anti_entropy)
            await nursery.start(node._feeds.run)
            pm.hook.ketten_node_started(node=node)
            started = True
            try:
                yield node
            except BaseException as exc:
                body_error = exc
            finally:
                pm.hook.ketten_node_stopping(node=node)
                node._closing.close()  # calls from the application's own tasks end too
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        alone = _alone(group, started)
        if alone is None:
            raise
        raise alone from None
    finally:
        node._closing.close()
        node._nursery = None
        with trio.CancelScope(shield=True):
            try:
                await node._replicator.flush()
            except KettenError:
                pass
            await node.store.aclose()
    if body_error is not None:
        raise body_error
