"""The ``gosskip`` overlay: a ring ordered by name whose long links gossip builds.

Each node is named ``(node id, random order)`` on a ring (see
:mod:`._names`). Its neighbour lists (:mod:`._ring`) are built by periodic
gossip with skip length ``k`` until level ``i`` links to the ``k**i``-th
neighbour, as in a perfect skip list; lookups (:mod:`._lookup`) route like
a skip list in ``O(log n)`` hops. ``closest(key, r)`` returns the ``r`` ring
successors of ``key`` (this node included when it is one), so a replica set
is the ``r`` nodes that follow a criterion's key on the ring.

Both are sans-IO; this module is the trio driver that carries their
messages (service ``"gosskip"``, see :mod:`._messages`) and sleeps between
gossip rounds. A node joins through any node it knows (``bootstrap``) by
looking up its own name, and every ``rejoin_rounds`` rounds looks it up
again through known nodes, so rings split by a partition merge when it
heals. It leaves by falling silent. Only peers the transport authenticated
answer for themselves in :meth:`GosskipOverlay.closest`. A node that sends
gossip only claims the address it listens at, and the contacts a gossip
message, an answer or a lookup names are only claims of a third party: each
enters this node's lists only once a request there was answered with its
key or the transport vouches for it
(:func:`~ketten.interfaces.address_proven`). One find checks a new claim,
bounded as :class:`~ketten.AddressClaims` says; until then the sender is
answered but not taken, and a chain of contacts is taken up to the first
unproven one (its counters count from the sender, so none may be left out
in between). A lookup still asks the contacts it is told of: an answer with
the named key is the check.

Options (``NodeConfig.options["overlay"]``): ``bootstrap`` (list of
addresses, default none), ``k`` (skip length, 2), ``interval`` (seconds
between gossip rounds, 1.0), ``rpc_timeout`` (seconds, 1.0),
``lookup_timeout`` (seconds a lookup may take, ``8 * rpc_timeout``),
``stale_rounds`` (rounds a silent neighbour is kept, 3), ``drop_after``
(failed requests in a row before a neighbour is dropped, 2), ``repair``
(shortest repair list, default ``2 * replication + 2``), ``alpha``
(lookup parallelism, 3), ``rejoin_rounds`` (rounds between lookups of the
own name, 5), ``max_levels`` (32).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ketten import AddressClaims, Option, PluginSpec, hookimpl
from ketten.errors import ConfigError, KettenError, ProtocolError, UsageError
from ketten.interfaces import Peer, address_proven

from ._lookup import Found, Lookup, Query
from ._messages import (
    FindRequest,
    decode_answer,
    decode_found,
    decode_request,
    encode_answer,
    encode_find,
    encode_found,
    encode_gossip,
)
from ._names import Contact, key_distance, point
from ._ring import MAX_ENTRIES, MAX_LEVELS, Answer, Gossip, Ring

if TYPE_CHECKING:
    from ketten import Node

__all__ = ["GosskipOptions", "GosskipOverlay", "GosskipStatistics", "key_distance"]

SERVICE = "gosskip"
_MAX_REMEMBERED = 256
_MAX_REPORTED = 4096
_REJOIN_FANOUT = 3
_log = logging.getLogger("ketten.gosskip")


@attrs.frozen
class GosskipOptions:
    """The overlay's options, validated."""

    bootstrap: tuple[str, ...] = ()
    k: int = 2
    interval: float = 1.0
    rpc_timeout: float = 1.0
    lookup_timeout: float = 8.0
    stale_rounds: int = 3
    drop_after: int = 2
    repair: int = 8
    alpha: int = 3
    rejoin_rounds: int = 5
    max_levels: int = 32

    @classmethod
    def parse(cls, options: Mapping[str, Any], replication: int) -> GosskipOptions:
        """Raises :class:`~ketten.errors.ConfigError` for unknown or bad options."""
        unknown = set(options) - {a.name for a in attrs.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown gosskip options: {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {"repair": 2 * replication + 2}
        bootstrap = options.get("bootstrap", ())
        if isinstance(bootstrap, str) or not isinstance(bootstrap, Sequence) or not all(
                isinstance(a, str) and a for a in bootstrap):
            raise ConfigError("gosskip option 'bootstrap' must be a list of addresses")
        values["bootstrap"] = tuple(bootstrap)
        for name, low, high in (("k", 2, 16), ("stale_rounds", 1, 1000),
                                ("drop_after", 1, 1000), ("repair", 1, 64),
                                ("alpha", 1, 64), ("rejoin_rounds", 1, 1_000_000),
                                ("max_levels", 1, MAX_LEVELS)):
            if name in options:
                value = options[name]
                if type(value) is not int or not low <= value <= high:
                    raise ConfigError(
                        f"gosskip option {name!r} must be an integer from {low} to {high}")
                values[name] = value
        for name in ("interval", "rpc_timeout", "lookup_timeout"):
            if name in options:
                value = options[name]
                if (not isinstance(value, int | float) or isinstance(value, bool)
                        or not 0 < value < math.inf):
                    raise ConfigError(f"gosskip option {name!r} must be a positive number")
                values[name] = float(value)
        values.setdefault("lookup_timeout", 8 * values.get("rpc_timeout", 1.0))
        return cls(**values)


@attrs.frozen
class GosskipStatistics:
    """A snapshot of the overlay's counters."""

    levels: int
    successors: int
    predecessors: int
    contacts: int
    repairs: int
    notifications: int
    gossip_sent: int
    gossip_failures: int
    lookups: int
    queries: int
    requests_served: int
    claims_checked: int = 0
    """Finds sent to check the address a gossiping node claims before it is taken."""
    claims_refuted: int = 0
    """Of those, the ones not answered there with the sender's key."""


@attrs.define(eq=False)
class GosskipOverlay:
    """The trio driver of one node's :class:`~._ring.Ring` and lookups."""

    _node: Node = attrs.field(alias="node", repr=False)
    options: GosskipOptions
    _order: int = attrs.field(init=False)
    _rng: random.Random = attrs.field(init=False)
    _ring: Ring | None = attrs.field(default=None, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _remembered: dict[str, None] = attrs.field(factory=dict, init=False)
    _reported: dict[bytes, None] = attrs.field(factory=dict, init=False)
    _sending: set[int] = attrs.field(factory=set, init=False)
    """Levels with a gossip request out: at most one each."""
    _joining: bool = attrs.field(default=False, init=False)
    _counts: dict[str, int] = attrs.field(init=False)
    _claims: AddressClaims = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self._node.identity.node_id)
        self._order = self._rng.getrandbits(64)
        self._counts = dict.fromkeys(
            ("gossip_sent", "gossip_failures", "lookups", "queries", "requests_served"), 0)
        self._claims = AddressClaims(retry_after=self.options.interval
                                     * (self.options.stale_rounds + 1))

    @property
    def ring(self) -> Ring:
        """The neighbour lists (read them, do not change them); exists once running."""
        if self._ring is None:
            raise UsageError("the gosskip overlay is not running")
        return self._ring

    # -- Overlay -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve ``"gosskip"``, join through the bootstrap addresses, then gossip every
        ``interval`` (and look up the own name every ``rejoin_rounds``) until cancelled."""
        opts = self.options
        self._ring = Ring(self._me(), k=opts.k, repair=opts.repair,
                          stale=opts.interval * (opts.stale_rounds + 0.5),
                          drop_after=opts.drop_after, max_levels=opts.max_levels)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._node.register_service(SERVICE, self._serve)
            await self._join(again=False)
            task_status.started()
            rounds = 0
            while True:
                await trio.sleep(opts.interval * (0.9 + 0.2 * self._rng.random()))
                rounds += 1
                for gossip in self.ring.gossip_due(trio.current_time()):
                    self._send(gossip, 0)
                if not self._joining and (self.ring.link("right", 0) is None
                                          or rounds % opts.rejoin_rounds == 0):
                    nursery.start_soon(self._join, True)

    async def closest(self, key: bytes, count: int) -> list[Peer]:
        """The ``count`` live nodes first met clockwise from ``key`` on the ring (this
        one included), nearest first; a network lookup. Raises
        :class:`~ketten.errors.UsageError` for a key that is not 32 bytes or a count
        below 1."""
        if type(key) is not bytes or len(key) != 32:
            raise UsageError("a key must be 32 bytes")
        if type(count) is not int or count < 1:
            raise UsageError("count must be a positive integer")
        lookup = await self._lookup(point(key), count, ())
        return [c.peer for c in lookup.result()]

    def nearest(self, key: bytes, count: int) -> list[Peer]:
        """The ``count`` known nodes first met clockwise from ``key`` (this one
        included), from the neighbour lists alone: no network traffic."""
        if self._ring is None:
            return []  # not serving yet: no address to name this node by
        return [c.peer for c in self._ring.nearest(point(key), count)]

    def distance(self, node_id: bytes, key: bytes) -> int:
        """The ring metric: how far ``node_id`` follows ``key`` clockwise (the node
        ranks its remembered nodes for a key by it, as :meth:`closest` does)."""
        return key_distance(node_id, key)

    @property
    def version(self) -> int:
        """Changes whenever :meth:`nearest` may answer differently (callers cache by it)."""
        return 0 if self._ring is None else self._ring.version

    def address_of(self, public_key: bytes) -> str | None:
        """Where the neighbour lists last placed the node with this key, if they know it."""
        if self._ring is None:
            return None
        contact = self._ring.known().get(public_key)
        return None if contact is None else contact.peer.address

    def statistics(self) -> GosskipStatistics:
        ring = None if self._ring is None else self._ring.statistics()
        return GosskipStatistics(
            levels=ring.levels if ring else 0, successors=ring.successors if ring else 0,
            predecessors=ring.predecessors if ring else 0,
            contacts=ring.contacts if ring else 0, repairs=ring.repairs if ring else 0,
            notifications=ring.notifications if ring else 0,
            claims_checked=self._claims.checks, claims_refuted=self._claims.refutations,
            **self._counts)

    # -- driver --------------------------------------------------------------

    def _me(self) -> Contact:
        return Contact(Peer(self._node.address, self._node.identity.public_key), self._order)

    def _local(self, target: int) -> Found:
        ring = self.ring
        return Found(ring.me, tuple(ring.successors), tuple(ring.route(target, 4)),
                     tuple(ring.predecessors))

    async def _join(self, again: bool) -> None:
        """Look up this node's own name through the bootstrap nodes (and, ``again``,
        some nodes it has known) and take the successors found. One at a time."""
        self._joining = True
        try:
            await self._join_once(again)
        finally:
            self._joining = False

    async def _join_once(self, again: bool) -> None:
        own = self._node.address
        addresses = [a for a in self.options.bootstrap if a != own]
        if again:
            others = [a for a in self._remembered if a != own and a not in addresses]
            addresses += self._rng.sample(others, min(_REJOIN_FANOUT, len(others)))
        if not addresses and not self.ring.successors:
            return
        ring = self.ring
        lookup = await self._lookup(ring.me.position, ring.list_size() + 1, addresses)
        if ring.adopt(c for c in lookup.result() if self._vouched((c,))):
            self._gossip_now()
        elif not again and self.options.bootstrap and len(lookup.answered()) <= 1:
            _log.warning("%s: no bootstrap node answered; running alone", own)

    def _gossip_now(self, depth: int = 1) -> None:
        for gossip in self.ring.gossip_due(trio.current_time()):
            if gossip.level == 0:
                self._send(gossip, depth)

    def _send(self, gossip: Gossip, depth: int) -> None:
        """Send ``gossip`` unless a request on its level is still out (a slow or dead
        neighbour never piles up requests)."""
        if self._nursery is None or gossip.level in self._sending:
            return
        self._sending.add(gossip.level)
        self._nursery.start_soon(self._gossip, gossip, depth)

    async def _gossip(self, gossip: Gossip, depth: int) -> None:
        try:
            again = await self._exchange(gossip)
        finally:
            self._sending.discard(gossip.level)
        if again and depth < 4:  # the successor changed: tell the new one at once
            self._gossip_now(depth + 1)

    async def _exchange(self, gossip: Gossip) -> bool:
        """One gossip request and its answer; True when the successor changed."""
        ring = self.ring
        self._counts["gossip_sent"] += 1
        try:
            peer, body = await self._rpc(gossip.to.peer.address,
                                         encode_gossip(gossip.level, self._order, gossip.entries))
            responder, answer = decode_answer(peer, body)
            if responder.key != gossip.to.key:
                raise ProtocolError(f"{gossip.to.peer.address} answered with another key")
            notify = answer.notify
            answer = Answer(self._vouched(answer.successors),
                            notify if notify is not None and self._vouched((notify,)) else None)
        except KettenError as exc:  # any failure of one request is a failed neighbour
            _log.debug("gossip to %s failed: %s", gossip.to.peer.address, exc)
            self._counts["gossip_failures"] += 1
            return ring.on_failure(gossip.to, gossip.level, trio.current_time())
        return ring.on_answer(responder, gossip.level, answer, trio.current_time())

    async def _lookup(self, target: int, count: int, addresses: Sequence[str]) -> Lookup:
        self._counts["lookups"] += 1
        lookup = Lookup(target, count, alpha=self.options.alpha)
        send, receive = trio.open_memory_channel[tuple[Query, Found | None]](math.inf)
        with trio.move_on_after(self.options.lookup_timeout):
            async with trio.open_nursery() as nursery:

                def launch(queries: list[Query]) -> None:
                    for query in queries:
                        self._counts["queries"] += 1
                        nursery.start_soon(self._query, query, target, send)

                launch(lookup.start(self._local(target), addresses))
                while not lookup.finished:
                    query, found = await receive.receive()
                    if found is None:
                        launch(lookup.on_failure(query.address))
                    else:
                        launch(lookup.on_reply(query.address, found))
                nursery.cancel_scope.cancel()
        return lookup

    async def _query(self, query: Query, target: int,
                     send: trio.MemorySendChannel[tuple[Query, Found | None]]) -> None:
        found: Found | None = None
        key, at = divmod(target, 1 << 64)
        try:
            peer, body = await self._rpc(query.address, encode_find(key.to_bytes(32, "big"), at))
            found = decode_found(peer, body)
        except KettenError as exc:  # a failed query only leaves this node out
            _log.debug("find at %s failed: %s", query.address, exc)
        send.send_nowait((query, found))

    async def _rpc(self, address: str, body: Any) -> tuple[Peer, Any]:
        # Gossip and finds are safe to repeat: a lost request is retransmitted.
        peer, answer = await self._node.request(address, SERVICE, body,
                                                timeout=self.options.rpc_timeout,
                                                retransmit=True)
        self._claims.prove(int.from_bytes(peer.node_id, "big"), peer.address)
        self._heard(peer)
        return peer, answer

    def _proven(self, peer: Peer) -> bool:
        """Whether the address ``peer`` claims answered with its key; a new claim is
        checked with one find there (the answer proves it, see :meth:`_rpc`)."""
        node_id = int.from_bytes(peer.node_id, "big")
        if self._claims.proven(node_id, peer.address) or address_proven(self._node.transport, peer):
            return True
        if (self._nursery is not None and peer.public_key != self._node.identity.public_key
                and self._claims.check(node_id, peer.address, trio.current_time())):
            self._nursery.start_soon(self._check_claim, peer)
        return False

    def _vouched(self, contacts: Sequence[Contact]) -> tuple[Contact, ...]:
        """The contacts others named, up to the first whose address is not proven
        (this node's own entry counts as proven: the ring cuts a chain there).
        Every unproven one is checked, so the whole chain passes once they answer."""
        own = self._node.identity.public_key
        proven = [c.key == own or self._proven(c.peer) for c in contacts]
        cut = proven.index(False) if False in proven else len(contacts)
        return tuple(contacts[:cut])

    async def _check_claim(self, peer: Peer) -> None:
        answered: bytes | None = None
        try:
            answered = (await self._rpc(peer.address, encode_find(peer.node_id)))[0].public_key
        except KettenError as exc:
            _log.debug("nobody answered at the address %s claims: %s", peer.address, exc)
        finally:
            self._claims.settle(int.from_bytes(peer.node_id, "big"), peer.address,
                                answered, peer.public_key)

    def _heard(self, peer: Peer) -> None:
        """An authenticated peer spoke: remember its address, report it once."""
        remembered = self._remembered
        remembered.pop(peer.address, None)
        remembered[peer.address] = None
        while len(remembered) > _MAX_REMEMBERED:
            del remembered[next(iter(remembered))]
        if peer.public_key in self._reported or peer.public_key == self._node.identity.public_key:
            return
        self._reported[peer.public_key] = None
        while len(self._reported) > _MAX_REPORTED:
            del self._reported[next(iter(self._reported))]
        self._node.plugins.hook.ketten_peer_joined(node=self._node, peer=peer)

    async def _serve(self, peer: Peer, body: Any) -> Any:
        request = decode_request(body)
        ring = self.ring
        self._counts["requests_served"] += 1
        proven = self._proven(peer)
        if isinstance(request, FindRequest):
            if proven:
                self._heard(peer)
            return encode_found(self._order, ring.successors, ring.predecessors,
                                ring.route(request.target, 4))
        if not proven:  # answered, but not taken until its address is proven
            return encode_answer(self._order, Answer(tuple(ring.successors[:MAX_ENTRIES])))
        answer = ring.on_gossip(Contact(peer, request.order), request.level,
                                self._vouched(request.entries), trio.current_time())
        self._heard(peer)
        if answer.notify is None and request.level == 0 and not ring.link("right", 0):
            self._gossip_now()
        return encode_answer(self._order, answer)


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"overlay": ["gosskip"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("overlay", "gosskip"):
        return None
    seconds = (int, float)
    return PluginSpec({
        "bootstrap": Option("addresses of nodes to join through", (list, tuple)),
        "k": Option("skip length: level i links to the k**i-th neighbour", int),
        "interval": Option("seconds between gossip rounds", seconds),
        "rpc_timeout": Option("seconds to wait for one answer", seconds),
        "lookup_timeout": Option("seconds a lookup may take", seconds),
        "stale_rounds": Option("gossip rounds a silent neighbour is kept", int),
        "drop_after": Option("failed requests in a row before a neighbour is dropped", int),
        "repair": Option("shortest repair (successor) list", int),
        "alpha": Option("lookup parallelism", int),
        "rejoin_rounds": Option("gossip rounds between lookups of the own name", int),
        "max_levels": Option("most skip-list levels", int),
    })


@hookimpl
def ketten_make_overlay(name: str, options: Mapping[str, Any], node: Node) -> GosskipOverlay | None:
    if name != "gosskip":
        return None
    return GosskipOverlay(node=node, options=GosskipOptions.parse(options, node.config.replication))
