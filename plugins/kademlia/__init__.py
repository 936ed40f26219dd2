"""The ``kademlia`` overlay: Kademlia routing with S/Kademlia hardening.

The routing table (:mod:`._kademlia_routing`) and the lookup
(:mod:`._kademlia_lookup`) are sans-IO state machines; this module is the
thin trio driver around them. Its RPCs are the node service ``"kad"``:

* ``{"op": "ping"}`` -> ``{"op": "pong"}``
* ``{"op": "find", "target": <32 bytes>[, "count": n]}`` ->
  ``{"nodes": [[address, public key], ...]}`` (the ``max(k, n)`` closest known,
  at most 256; ``count`` is sent when a lookup wants more than ``k`` nodes)

S/Kademlia: only an authenticated peer (the :class:`~ketten.interfaces.Peer`
the transport hands over, whose node id is ``SHA-256(public key)``) ever
enters the routing table, and only at an address where it answered with its
key: a node that answers this node's request enters at once; one that sends a
request only claims its address, so unless the transport vouches for it
(:func:`~ketten.interfaces.address_proven`) the claim is checked with one
ping there first (bounded as :class:`~ketten.AddressClaims` says), and a
peer claiming another node's address never enters. Contacts learned from answers are only
lookup candidates until they answer themselves. An optional
static puzzle (``puzzle_difficulty`` leading zero bits of ``H(H(pubkey))``)
makes ids expensive; the TCP transport reads the same option and refuses
peers that do not solve it. Lookups can run over ``paths`` disjoint paths.

Options (``NodeConfig.options["overlay"]``):

``bootstrap`` (list of addresses, default none), ``k`` (20), ``alpha`` (3),
``paths`` (disjoint lookup paths d, 1), ``puzzle_difficulty`` (0),
``refresh_interval`` (seconds, 3600), ``rpc_timeout`` (seconds, 2.0),
``lookup_timeout`` (seconds a lookup may take as a whole, ``8 * rpc_timeout``),
``siblings`` (sibling list size, default ``5 * replication``),
``stale_after`` (failed requests in a row before a contact is dropped, 5),
``ping_interval`` (seconds between liveness pings of the siblings, 10.0),
``join_refresh`` (after joining, refresh every bucket the lookup of the own id did
not find complete, true).

Under loss the table does not flap: requests are retransmitted on lossy
transports, a contact is dropped only after ``stale_after`` failures in a row
and replaced from its bucket's replacement cache. Every ``ping_interval``
the siblings (the nodes closest to this one, which hold the same chains) not
heard from for most of that period are pinged (siblings ping each other, so
each pair needs about one ping per period), so dead neighbours leave and
chains move off them; a node whose
table has fallen below ``k`` contacts joins again through its bootstrap
addresses and every peer it has known.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import trio

from ketten import AddressClaims, Option, PluginSpec, hookimpl, node_id_of
from ketten.errors import (
    ConfigError,
    DecodeError,
    KettenError,
    ProtocolError,
    UsageError,
)
from ketten.interfaces import Peer, address_proven
from ketten.wire import field

from ._ids import Contact, puzzle_ok
from ._lookup import Lookup, Query
from ._routing import Observation, Outcome, RoutingTable

if TYPE_CHECKING:
    from ketten import Node

__all__ = ["KademliaOptions", "KademliaOverlay", "KademliaStatistics", "decode_contacts"]

SERVICE = "kad"
MAX_REPLY_CONTACTS = 256
_log = logging.getLogger("ketten.kademlia")


@attrs.frozen
class KademliaOptions:
    """The overlay's options, validated."""

    bootstrap: tuple[str, ...] = ()
    k: int = 20
    alpha: int = 3
    paths: int = 1
    puzzle_difficulty: int = 0
    refresh_interval: float = 3600.0
    rpc_timeout: float = 2.0
    lookup_timeout: float = 16.0
    siblings: int = 15
    stale_after: int = 5
    ping_interval: float = 10.0
    join_refresh: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, Any], replication: int) -> KademliaOptions:
        """Raises :class:`~ketten.errors.ConfigError` for unknown or bad options."""
        known = {a.name for a in attrs.fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise ConfigError(f"unknown kademlia options: {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {"siblings": 5 * replication}
        bootstrap = options.get("bootstrap", ())
        if isinstance(bootstrap, str) or not isinstance(bootstrap, Sequence) or not all(
            isinstance(a, str) and a for a in bootstrap
        ):
            raise ConfigError("kademlia option 'bootstrap' must be a list of addresses")
        values["bootstrap"] = tuple(bootstrap)
        for name, low in (("k", 1), ("alpha", 1), ("paths", 1), ("stale_after", 1),
                          ("siblings", 0), ("puzzle_difficulty", 0)):
            if name in options:
                value = options[name]
                if type(value) is not int or value < low:
                    raise ConfigError(f"kademlia option {name!r} must be an integer >= {low}")
                values[name] = value
        if values.get("puzzle_difficulty", 0) > 64:
            raise ConfigError("kademlia option 'puzzle_difficulty' must be at most 64")
        for name in ("refresh_interval", "rpc_timeout", "ping_interval", "lookup_timeout"):
            if name in options:
                value = options[name]
                if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                    raise ConfigError(f"kademlia option {name!r} must be a positive number")
                values[name] = float(value)
        values.setdefault("lookup_timeout", 8 * values.get("rpc_timeout", 2.0))
        if "join_refresh" in options:
            if type(options["join_refresh"]) is not bool:
                raise ConfigError("kademlia option 'join_refresh' must be a boolean")
            values["join_refresh"] = options["join_refresh"]
        return cls(**values)


@attrs.frozen
class KademliaStatistics:
    """A snapshot of the overlay's counters."""

    contacts: int
    siblings: int
    replacements: int
    lookups: int
    queries: int
    query_failures: int
    requests_served: int
    peers_joined: int
    evictions: int
    refused: int
    claims_checked: int = 0
    """Pings sent to check the address a requester claims before it enters the table."""
    claims_refuted: int = 0
    """Of those, the ones not answered there with the requester's key."""


def encode_contacts(contacts: Sequence[Contact]) -> list[list[Any]]:
    return [[c.peer.address, c.peer.public_key] for c in contacts]


def decode_contacts(body: Any, difficulty: int, limit: int = MAX_REPLY_CONTACTS, *,
                    name: str = "nodes", where: str = "kad find answer") -> list[Contact]:
    """Contacts (``[address, public key]`` pairs, in field ``name``) of an answer that
    asked for ``limit``; those whose ids do not solve the puzzle are left out.
    Raises :class:`DecodeError`, :class:`ProtocolError` (more contacts than asked for)."""
    nodes = field(body, name, list, where=where)
    if len(nodes) > limit:
        raise ProtocolError(f"{where} for {limit} contacts held {len(nodes)}")
    out: list[Contact] = []
    for item in nodes:
        if (type(item) is not list or len(item) != 2 or type(item[0]) is not str
                or type(item[1]) is not bytes or len(item[1]) != 32 or not item[0]):
            raise DecodeError("a contact must be [address, 32-byte public key]", where=where)
        contact = Contact.of(Peer(item[0], item[1]))
        if puzzle_ok(contact.node_id, difficulty):
            out.append(contact)
    return out


def _check_pong(answer: Any) -> None:
    if field(answer, "op", str, where="kad ping answer") != "pong":
        raise DecodeError("expected a pong", where="kad ping answer")


def _check_key(contact: Contact, peer: Peer) -> None:
    if peer.public_key != contact.peer.public_key:
        raise ProtocolError(f"{contact.peer.address} answered with another key")


@attrs.define(eq=False)
class KademliaOverlay:
    """The trio driver of one node's routing table and lookups."""

    _node: Node = attrs.field(alias="node", repr=False)
    options: KademliaOptions
    _table: RoutingTable = attrs.field(init=False)
    _own: int = attrs.field(init=False)
    _rng: random.Random = attrs.field(init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _known_addresses: dict[str, None] = attrs.field(factory=dict, init=False)
    _peak: int = attrs.field(default=0, init=False)
    """The most contacts the table held: a network smaller than k never fills it, so
    only a table below k that lost contacts calls for joining again."""
    _counts: dict[str, int] = attrs.field(init=False)
    _client: bool = attrs.field(default=False, init=False)
    _claims: AddressClaims = attrs.field(init=False)

    supports_client: ClassVar[bool] = True
    """A client node (``NodeConfig.client``) looks nodes up but never enters a
    routing table: its requests say so, and it leaves itself out of its own
    closest sets."""

    def __attrs_post_init__(self) -> None:
        self._own = int.from_bytes(self._node.identity.node_id, "big")
        self._client = bool(getattr(self._node.config, "client", False))
        if not puzzle_ok(self._node.identity.node_id, self.options.puzzle_difficulty):
            raise ConfigError(
                f"this node's identity does not solve the id puzzle of difficulty "
                f"{self.options.puzzle_difficulty} (see solve_puzzle)"
            )
        self._table = RoutingTable(
            self._own, k=self.options.k, sibling_size=self.options.siblings,
            difficulty=self.options.puzzle_difficulty, stale_after=self.options.stale_after,
        )
        self._rng = random.Random(self._own)
        self._claims = AddressClaims(retry_after=6 * self.options.ping_interval)
        self._counts = dict.fromkeys(
            ("lookups", "queries", "query_failures", "requests_served", "peers_joined"), 0
        )

    @property
    def table(self) -> RoutingTable:
        """The routing table (read it, do not change it)."""
        return self._table

    # -- Overlay -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve ``"kad"``, join through the bootstrap addresses, then keep the table
        (sibling pings, bucket refreshes, joining again when it runs low) until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._node.register_service(SERVICE, self._serve)
            await self._join()
            task_status.started()
            await self._join_until_heard()
            last_refresh = trio.current_time()
            while True:
                await trio.sleep(self.options.ping_interval * (0.75 + 0.5 * self._rng.random()))
                self._peak = max(self._peak, len(self._table))
                if len(self._table) < min(self.options.k, self._peak or 1):
                    await self._join(again=True)
                await self._ping_siblings()
                if trio.current_time() - last_refresh >= self.options.refresh_interval:
                    last_refresh = trio.current_time()
                    await self._refresh()

    async def _join_until_heard(self) -> None:
        """A node whose bootstrap nodes did not answer (they start at the same time,
        after a power cut say) tries again soon: after 0.5 s, then twice as long
        each time, up to the ping interval, where the regular rounds take over."""
        wait = 0.5
        while not len(self._table) and self.options.bootstrap and wait < self.options.ping_interval:
            await trio.sleep(wait * (0.75 + 0.5 * self._rng.random()))
            wait *= 2
            await self._join(again=True)

    async def _ping_siblings(self) -> None:
        # Siblings ping each other: one that pinged us within the period is alive.
        since = trio.current_time() - 0.75 * self.options.ping_interval
        async with trio.open_nursery() as nursery:
            for contact in self._table.unheard_siblings(since):
                nursery.start_soon(self._ping, contact.peer.address, contact)

    async def closest(self, key: bytes, count: int) -> list[Peer]:
        """The ``count`` live nodes closest to ``key`` (this one included), nearest first.

        Runs a network lookup. Raises :class:`~ketten.errors.UsageError` for a
        key that is not 32 bytes or a count below 1.
        """
        if type(key) is not bytes or len(key) != 32:
            raise UsageError("a key must be 32 bytes")
        if type(count) is not int or count < 1:
            raise UsageError("count must be a positive integer")
        target = int.from_bytes(key, "big")
        lookup = await self._lookup(target, self._breadth(count))
        found = lookup.result(count)
        if not self._client:
            found.append(Contact(self._own, self._local_peer()))
        found.sort(key=lambda c: c.id ^ target)
        return [c.peer for c in found[:count]]

    def _breadth(self, count: int) -> int:
        # A lookup ends once the closest `breadth` nodes it learned of have all
        # answered. Twice the wanted count (at least alpha more) finds the
        # `count` closest as surely in a table that knows the key's region,
        # for a fraction of the queries of a full k-wide lookup.
        if count >= self.options.k:
            return count
        return min(self.options.k, max(2 * count, count + self.options.alpha))

    def nearest(self, key: bytes, count: int) -> list[Peer]:
        """The ``count`` known nodes closest to ``key`` (this one included), from the
        routing table alone: no network traffic."""
        target = int.from_bytes(key, "big")
        found = self._table.closest(target, count)
        if not self._client:
            found.append(Contact(self._own, self._local_peer()))
        found.sort(key=lambda c: c.id ^ target)
        return [c.peer for c in found[:count]]

    @property
    def version(self) -> int:
        """Changes whenever :meth:`nearest` may answer differently (callers cache by it)."""
        return self._table.version

    def address_of(self, public_key: bytes) -> str | None:
        """Where the routing table last reached the node with this key, if it knows it."""
        contact = self._table.get(int.from_bytes(node_id_of(public_key), "big"))
        return None if contact is None else contact.peer.address

    def admits(self, public_key: bytes) -> bool:
        """Whether a node with this key may join: its id solves the id puzzle."""
        difficulty = self.options.puzzle_difficulty
        return difficulty <= 0 or puzzle_ok(node_id_of(public_key), difficulty)

    def siblings(self) -> list[Peer]:
        """The known nodes closest to this node's id, nearest first (no network traffic)."""
        return [c.peer for c in self._table.siblings()]

    def statistics(self) -> KademliaStatistics:
        table = self._table.statistics()
        return KademliaStatistics(
            contacts=table.contacts, siblings=table.siblings, replacements=table.replacements,
            evictions=table.evictions, refused=table.refused, claims_checked=self._claims.checks,
            claims_refuted=self._claims.refutations, **self._counts,
        )

    # -- driver --------------------------------------------------------------

    def _local_peer(self) -> Peer:
        return Peer(self._node.address, self._node.identity.public_key)

    async def _join(self, *, again: bool = False) -> None:
        own_address = self._node.address
        addresses = list(self.options.bootstrap)
        if again:
            # Every peer this node has known may still be there.
            addresses += [a for a in self._known_addresses if a not in addresses]
        async with trio.open_nursery() as nursery:
            for address in addresses:
                if address != own_address:
                    nursery.start_soon(self._ping, address, None)
        if not len(self._table):
            if self.options.bootstrap and not again:
                _log.warning("%s: no bootstrap node answered; running alone", own_address)
            return
        found = await self._lookup(self._own, self.options.k)
        if self.options.join_refresh:
            self._table.joined(found.result(self.options.k), trio.current_time())
            await self._refresh()

    async def _refresh(self) -> None:
        now = trio.current_time()
        for index in self._table.stale_buckets(now, self.options.refresh_interval):
            await self._lookup(self._table.refresh_target(index, self._rng), self.options.k)

    async def _lookup(self, target: int, k: int) -> Lookup:
        self._counts["lookups"] += 1
        self._table.touch(target, trio.current_time())
        lookup = Lookup(target, self._own, k=k, alpha=self.options.alpha,
                        paths=self.options.paths)
        wanted = target.to_bytes(32, "big")
        send, receive = trio.open_memory_channel[tuple[Query, list[Contact] | None]](math.inf)
        # A lookup as a whole has a deadline: liars naming unreachable contacts
        # cost it time, never more than this; it returns the best that answered.
        with trio.move_on_after(self.options.lookup_timeout):
            async with trio.open_nursery() as nursery:

                def launch(queries: list[Query]) -> None:
                    for query in queries:
                        self._counts["queries"] += 1
                        nursery.start_soon(self._query, query, wanted, k, send)

                launch(lookup.start(self._table.closest(target, k)))
                while not lookup.finished:
                    query, contacts = await receive.receive()
                    if contacts is None:
                        launch(lookup.on_failure(query.contact.id))
                    else:
                        launch(lookup.on_reply(query.contact.id, contacts))
                nursery.cancel_scope.cancel()  # queries still out cannot change the result
        return lookup

    async def _query(self, query: Query, target: bytes, count: int,
                     send: trio.MemorySendChannel[tuple[Query, list[Contact] | None]]) -> None:
        contact = query.contact
        contacts: list[Contact] | None = None
        request: dict[str, Any] = {"op": "find", "target": target}
        if count > self.options.k:
            request["count"] = count
        limit = max(self.options.k, min(count, MAX_REPLY_CONTACTS))
        try:
            peer, answer = await self._rpc(contact.peer.address, request)
            _check_key(contact, peer)
            contacts = self._verified_first(
                decode_contacts(answer, self.options.puzzle_difficulty, limit))
        except KettenError as exc:  # any failure of one query is a failed contact
            _log.debug("find at %s failed: %s", contact.peer.address, exc)
            self._counts["query_failures"] += 1
            self._failed(contact)
        send.send_nowait((query, contacts))

    def _verified_first(self, contacts: list[Contact]) -> list[Contact]:
        # An address in a reply is only claimed; where the routing table holds the key
        # at an address it answered at, the lookup tries that one first.
        out: list[Contact] = []
        for contact in contacts:
            known = self._table.get(contact.id)
            if known is not None and known.peer.address != contact.peer.address:
                out.append(known)
            out.append(contact)
        return out

    async def _ping(self, address: str, expected: Contact | None) -> None:
        try:
            peer, answer = await self._rpc(address, {"op": "ping"})
            _check_pong(answer)
            if expected is not None:
                _check_key(expected, peer)
        except KettenError as exc:  # any failure of one query is a failed contact
            _log.debug("ping %s failed: %s", address, exc)
            if expected is not None:
                self._failed(expected)

    async def _rpc(self, address: str, body: Any) -> tuple[Peer, Any]:
        if self._client:
            body = {**body, "client": True}
        # Kademlia requests are reads: repeating a lost one is safe.
        peer, answer = await self._node.request(address, SERVICE, body,
                                                timeout=self.options.rpc_timeout,
                                                retransmit=True)
        self._claims.prove(int.from_bytes(peer.node_id, "big"), peer.address)
        self._observe(peer)
        return peer, answer

    def _claimed(self, peer: Peer) -> None:
        """``peer`` sent a request: its key is proven, the address it claims is not.
        A claim proven before refreshes its contact; a new one is checked first."""
        node_id = int.from_bytes(peer.node_id, "big")
        known = self._table.get(node_id)
        if (node_id == self._own or not self.admits(peer.public_key)  # the table refuses it
                or (known is not None and known.peer.address == peer.address)
                or self._claims.proven(node_id, peer.address)
                or address_proven(self._node.transport, peer)):
            self._observe(peer)
        elif (self._nursery is not None
              and self._claims.check(node_id, peer.address, trio.current_time())):
            self._nursery.start_soon(self._check_claim, peer)

    async def _check_claim(self, peer: Peer) -> None:
        # The ping's answer, with the claimed key, is what lets the contact in (_rpc).
        answered: bytes | None = None
        try:
            responder, answer = await self._rpc(peer.address, {"op": "ping"})
            _check_pong(answer)
            answered = responder.public_key
        except KettenError as exc:
            _log.debug("nobody answered at the address %s claims: %s", peer.address, exc)
        finally:
            self._claims.settle(int.from_bytes(peer.node_id, "big"), peer.address,
                                answered, peer.public_key)

    def _observe(self, peer: Peer) -> None:
        known = self._known_addresses
        if peer.address not in known:
            known[peer.address] = None
            while len(known) > 4 * self.options.k:
                del known[next(iter(known))]
        seen = self._table.observe(Contact.of(peer), trio.current_time())
        self._after(seen)
        if seen.outcome is Outcome.ADDED:
            self._joined(peer)

    def _after(self, seen: Observation) -> None:
        if seen.ping is not None and self._nursery is not None:
            self._nursery.start_soon(self._ping, seen.ping.peer.address, seen.ping)

    def _failed(self, contact: Contact) -> None:
        promoted = self._table.failed(contact.id, trio.current_time())
        if promoted is not None:
            self._joined(promoted.peer)

    def _joined(self, peer: Peer) -> None:
        self._counts["peers_joined"] += 1
        self._node.plugins.hook.ketten_peer_joined(node=self._node, peer=peer)

    async def _serve(self, peer: Peer, body: Any) -> Any:
        op = field(body, "op", str, where="kad request")
        member = body.get("client") is not True  # a client is answered, never added
        if op == "ping":
            if member:
                self._claimed(peer)
            self._counts["requests_served"] += 1
            return {"op": "pong"}
        if op == "find":
            target = field(body, "target", bytes, where="kad find request")
            if len(target) != 32:
                raise DecodeError("target must be 32 bytes", where="kad find request")
            wanted = self.options.k
            if "count" in body:
                count = field(body, "count", int, where="kad find request")
                if count < 1:
                    raise DecodeError("count must be positive", where="kad find request")
                wanted = max(wanted, min(count, MAX_REPLY_CONTACTS))
            if member:
                self._claimed(peer)
            self._counts["requests_served"] += 1
            sender = int.from_bytes(peer.node_id, "big")
            nearest = self._table.closest(int.from_bytes(target, "big"), wanted,
                                          exclude=sender)
            return {"nodes": encode_contacts(nearest)}
        raise ProtocolError(f"unknown kad operation {op!r}")


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"overlay": ["kademlia"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("overlay", "kademlia"):
        return None
    seconds = (int, float)
    return PluginSpec({
        "bootstrap": Option("addresses of nodes to join through", (list, tuple)),
        "k": Option("bucket size", int),
        "alpha": Option("lookup parallelism", int),
        "paths": Option("disjoint lookup paths", int),
        "puzzle_difficulty": Option("leading zero bits of a node id's puzzle", int),
        "refresh_interval": Option("seconds between bucket refreshes", seconds),
        "rpc_timeout": Option("seconds to wait for one answer", seconds),
        "lookup_timeout": Option("seconds a lookup may take", seconds),
        "siblings": Option("sibling list size", int),
        "stale_after": Option("failed requests in a row before a contact is dropped", int),
        "ping_interval": Option("seconds between pings of the siblings", seconds),
        "join_refresh": Option("refresh every bucket after joining", bool),
    })


@hookimpl
def ketten_make_overlay(name: str, options: Mapping[str, Any], node: Node) -> KademliaOverlay | None:
    if name != "kademlia":
        return None
    return KademliaOverlay(node=node, options=KademliaOptions.parse(options, node.config.replication))
