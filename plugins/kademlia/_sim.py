"""A deterministic discrete-event simulation of a Kademlia network.

It drives the very same sans-IO objects as the trio overlay
(:class:`~._kademlia_routing.RoutingTable`, :class:`~._kademlia_lookup.Lookup`)
with an event queue in virtual time instead of a transport, so networks of
tens of thousands of nodes run in seconds. Every random choice (keys,
latencies, churn) comes from one seeded generator: a seed replays exactly.

Messages take ``latency`` plus up to ``jitter`` seconds each way; a request
to a node that is gone fails after ``timeout``. Requests and replies are
authenticated as on a real transport: a reply counts for a contact only if
it comes from the node owning the contact's id. Adversaries answer every
FIND_NODE at once with the colluding nodes closest to the target (ids of
their choosing among the nodes they control), which captures any lookup path
that asks them before it has come close to the target.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import random
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from ketten.interfaces import Peer

from ._ids import ID_BITS, Contact
from ._lookup import Lookup, Query
from ._routing import RoutingTable

__all__ = ["SimNode", "Simulation"]

Done = Callable[[Lookup], None]


@attrs.define(eq=False, slots=True)
class SimNode:
    contact: Contact
    table: RoutingTable
    alive: bool = True
    adversary: bool = False


@attrs.define(eq=False)
class Simulation:
    """A simulated network; build it with :meth:`grow`, then :meth:`lookups`."""

    seed: int = 0
    k: int = 20
    alpha: int = 3
    latency: float = 0.01
    jitter: float = 0.01
    timeout: float = 1.0
    sibling_size: int = 15
    join_refresh: bool = False
    now: float = attrs.field(default=0.0, init=False)
    nodes: list[SimNode] = attrs.field(factory=list, init=False)
    messages: int = attrs.field(default=0, init=False)
    _rng: random.Random = attrs.field(init=False)
    _heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = attrs.field(
        factory=list, init=False
    )
    _seq: int = attrs.field(default=0, init=False)
    _by_address: dict[str, SimNode] = attrs.field(factory=dict, init=False)
    _colluders: list[Contact] = attrs.field(factory=list, init=False)
    _joined: list[SimNode] = attrs.field(factory=list, init=False)
    _live_ids: list[int] | None = attrs.field(default=None, init=False)
    """The live nodes' ids in order (``None``: to be sorted again)."""

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @property
    def rng(self) -> random.Random:
        return self._rng

    def alive(self) -> list[SimNode]:
        return [n for n in self.nodes if n.alive]

    def closest(self, src: SimNode, lookup: Lookup, count: int) -> list[int]:
        """What ``closest(key, count)`` of the overlay returns: the lookup's result
        merged with the node itself."""
        found = [c.id for c in lookup.result(count)] + [src.contact.id]
        return sorted(found, key=lambda i: i ^ lookup.target)[:count]

    def true_closest(self, target: int, count: int) -> list[int]:
        """The ids of the ``count`` live nodes closest to ``target``, from all of them.

        The ids sharing ``bits`` leading bits with ``target`` are one range of the
        sorted ids, and each is closer than any id outside it: the answer lies in
        the narrowest such range that holds ``count`` ids."""
        if self._live_ids is None:
            self._live_ids = sorted(n.contact.id for n in self.nodes if n.alive)
        ids = self._live_ids
        first, last = 0, len(ids)
        for bits in range(1, ID_BITS + 1):
            shift = ID_BITS - bits
            low = (target >> shift) << shift
            narrower = (bisect.bisect_left(ids, low, first, last),
                        bisect.bisect_left(ids, low + (1 << shift), first, last))
            if narrower[1] - narrower[0] < count:
                break
            first, last = narrower
        return heapq.nsmallest(count, ids[first:last], key=lambda i: i ^ target)

    # -- membership ----------------------------------------------------------

    def new_node(self) -> SimNode:
        key = self._rng.randbytes(32)
        peer = Peer(f"sim:{len(self.nodes)}", key)
        contact = Contact(int.from_bytes(hashlib.sha256(key).digest(), "big"), peer)
        node = SimNode(contact, RoutingTable(contact.id, k=self.k,
                                             sibling_size=self.sibling_size))
        self.nodes.append(node)
        self._live_ids = None
        self._by_address[peer.address] = node
        return node

    def grow(self, count: int, *, wave: int = 50) -> None:
        """Add ``count`` nodes, joining ``wave`` of them at a time."""
        while count > 0:
            batch = [self.new_node() for _ in range(min(wave, count))]
            count -= len(batch)
            for node in batch:
                self.join(node)
            self.run()

    def join(self, node: SimNode) -> None:
        """Meet a random live node, then look up the own id (and refresh buckets)."""
        joined = self._joined
        self._joined.append(node)
        if len(joined) < 2:
            return
        while True:
            seed = self._rng.choice(joined)
            if seed.alive and seed is not node:
                break
        node.table.observe(seed.contact, self.now)
        seed.table.observe(node.contact, self.now)

        def refresh(own: Lookup) -> None:
            if not self.join_refresh or not node.alive:
                return
            node.table.joined(own.result(self.k), self.now)
            for index in node.table.stale_buckets(self.now, 3600.0):
                self.start_lookup(node, node.table.refresh_target(index, self._rng))

        self.start_lookup(node, node.contact.id, done=refresh)

    def kill(self, node: SimNode) -> None:
        if node.alive:
            node.alive = False
            self._live_ids = None

    def make_adversaries(self, fraction: float) -> list[SimNode]:
        """Turn a random ``fraction`` of the live nodes into colluding adversaries."""
        live = self.alive()
        chosen = self._rng.sample(live, round(len(live) * fraction))
        for node in chosen:
            node.adversary = True
        self._colluders = [n.contact for n in chosen]
        return chosen

    # -- lookups -------------------------------------------------------------

    def lookups(self, pairs: Iterable[tuple[SimNode, int]], *, paths: int = 1) -> list[Lookup]:
        """Run lookups concurrently until all finished; in the order given."""
        started = [self.start_lookup(src, target, paths=paths) for src, target in pairs]
        self.run()
        return started

    def start_lookup(self, src: SimNode, target: int, *, paths: int = 1,
                     done: Done | None = None) -> Lookup:
        lookup = Lookup(target, src.contact.id, k=self.k, alpha=self.alpha, paths=paths)
        src.table.touch(target, self.now)
        self._send(src, lookup, lookup.start(src.table.closest(target, self.k)), done)
        if lookup.finished and done is not None:
            done(lookup)
        return lookup

    def run(self) -> None:
        """Process events until none are left."""
        heap = self._heap
        while heap:
            when, _, action, args = heapq.heappop(heap)
            self.now = when
            action(*args)

    # -- events --------------------------------------------------------------

    def _at(self, delay: float, action: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (self.now + delay, self._seq, action, args))

    def _delay(self) -> float:
        return self.latency + self._rng.random() * self.jitter

    def _send(self, src: SimNode, lookup: Lookup, queries: list[Query], done: Done | None) -> None:
        for query in queries:
            self.messages += 1
            dst = self._by_address.get(query.contact.peer.address)
            if dst is None or not dst.alive:
                self._at(self.timeout, self._timed_out, src, lookup, query, done)
            else:
                self._at(self._delay(), self._arrive, src, lookup, query, done, dst)

    def _arrive(self, src: SimNode, lookup: Lookup, query: Query, done: Done | None,
                dst: SimNode) -> None:
        if not dst.alive:
            self._at(self.timeout, self._timed_out, src, lookup, query, done)
            return
        self._observe(dst, src.contact)
        if dst.adversary:
            answer = heapq.nsmallest(self.k, self._colluders, key=lambda c: c.id ^ lookup.target)
            delay = self.latency / 10
        else:
            answer = dst.table.closest(lookup.target, self.k, exclude=src.contact.id)
            delay = self._delay()
        self._at(delay, self._answered, src, lookup, query, done, dst, answer)

    def _answered(self, src: SimNode, lookup: Lookup, query: Query, done: Done | None,
                  dst: SimNode, answer: list[Contact]) -> None:
        if not src.alive:
            return
        self._observe(src, dst.contact)
        if dst.contact.id != query.contact.id:
            queries = lookup.on_failure(query.contact.id)
        else:
            queries = lookup.on_reply(query.contact.id, answer)
        self._send(src, lookup, queries, done)
        if lookup.finished and done is not None:
            done(lookup)

    def _timed_out(self, src: SimNode, lookup: Lookup, query: Query, done: Done | None) -> None:
        if not src.alive:
            return
        src.table.failed(query.contact.id, self.now)
        self._send(src, lookup, lookup.on_failure(query.contact.id), done)
        if lookup.finished and done is not None:
            done(lookup)

    def _observe(self, node: SimNode, contact: Contact) -> None:
        seen = node.table.observe(contact, self.now)
        if seen.ping is not None:
            target = self._by_address.get(seen.ping.peer.address)
            if target is not None and target.alive:
                self._at(2 * self._delay(), self._pong, node, seen.ping)
            else:
                self._at(self.timeout, self._ping_failed, node, seen.ping)

    def _pong(self, node: SimNode, contact: Contact) -> None:
        if node.alive:
            node.table.observe(contact, self.now)

    def _ping_failed(self, node: SimNode, contact: Contact) -> None:
        if node.alive:
            node.table.failed(contact.id, self.now)
