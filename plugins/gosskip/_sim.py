"""A deterministic simulation of a GosSkip ring on the sans-IO :class:`~._ring.Ring`.

Every node is a :class:`~._ring.Ring` in one process; a round lets every
live node (in a seeded random order) send the messages of its gossip round,
each delivered and answered at once. A message to a dead node fails. This
is how the tests check convergence to a perfect skip list, routing in
``O(log n)`` hops and the repair of the ring after mass failures, for
thousands of nodes in seconds.
"""

from __future__ import annotations

import random

import attrs

from ketten.interfaces import Peer

from ._names import Contact, between, clockwise
from ._ring import Gossip, Ring

__all__ = ["RingSimulation"]


@attrs.define(eq=False)
class RingSimulation:
    """A simulated ring; :meth:`build` it, then run :meth:`round`s."""

    seed: int = 0
    k: int = 2
    repair: int = 5
    interval: float = 1.0
    stale_rounds: int = 3
    now: float = attrs.field(default=0.0, init=False)
    rings: dict[bytes, Ring] = attrs.field(factory=dict, init=False)
    alive: set[bytes] = attrs.field(factory=set, init=False)
    messages: int = attrs.field(default=0, init=False)
    _rng: random.Random = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def build(self, count: int) -> None:
        """``count`` nodes with random keys and orders, each knowing its successors
        (level 0 as a join leaves it); the long links are left to the gossip."""
        contacts = [Contact(Peer(f"sim:{i}", self._rng.randbytes(32)),
                            self._rng.getrandbits(64)) for i in range(count)]
        contacts.sort(key=lambda c: c.position)
        for contact in contacts:
            self.rings[contact.key] = Ring(contact, k=self.k, repair=self.repair,
                                           stale=self.stale_rounds * self.interval)
            self.alive.add(contact.key)
        for i, contact in enumerate(contacts):
            following = [contacts[(i + j) % count] for j in range(1, self.repair + 1)]
            self.rings[contact.key].adopt(following)

    def live(self) -> list[Contact]:
        """The live nodes in ring order."""
        return sorted((self.rings[key].me for key in self.alive), key=lambda c: c.position)

    def round(self) -> None:
        """One gossip round of every live node."""
        self.now += self.interval
        order = sorted(self.alive)
        self._rng.shuffle(order)
        for key in order:
            ring = self.rings[key]
            for gossip in ring.gossip_due(self.now):
                self._deliver(ring, gossip)

    def _deliver(self, ring: Ring, gossip: Gossip, depth: int = 0) -> None:
        self.messages += 1
        target = gossip.to
        if target.key not in self.alive:
            again = ring.on_failure(target, gossip.level, self.now)
        else:
            answer = self.rings[target.key].on_gossip(ring.me, gossip.level, gossip.entries,
                                                      self.now)
            again = ring.on_answer(target, gossip.level, answer, self.now)
        if again and depth < 4:
            for follow in ring.gossip_due(self.now):
                if follow.level == 0:
                    self._deliver(ring, follow, depth + 1)

    def kill(self, fraction: float) -> list[bytes]:
        """Stop a random ``fraction`` of the live nodes at once (they fall silent)."""
        victims = self._rng.sample(sorted(self.alive), int(len(self.alive) * fraction))
        self.alive.difference_update(victims)
        return victims

    # -- measurements ----------------------------------------------------------

    def link_accuracy(self) -> float:
        """The share of (node, side, level) with ``2**level`` below the ring size whose
        level link points at the ``k**level``-th neighbour on that side."""
        ring = self.live()
        n = len(ring)
        good = total = 0
        for index, contact in enumerate(ring):
            node = self.rings[contact.key]
            level = 0
            while self.k ** level < n:
                step = self.k ** level
                for side, sign in (("right", 1), ("left", -1)):
                    total += 1
                    found = node.link(side, level)
                    good += found is not None and found.key == ring[(index + sign * step) % n].key
                level += 1
        return good / total if total else 1.0

    def ring_formed(self) -> bool:
        """Whether every live node's successor and predecessor are the true ones."""
        ring = self.live()
        n = len(ring)
        for index, contact in enumerate(ring):
            node = self.rings[contact.key]
            right, left = node.link("right", 0), node.link("left", 0)
            if right is None or right.key != ring[(index + 1) % n].key:
                return False
            if left is None or left.key != ring[(index - 1) % n].key:
                return False
        return True

    def successor_of(self, target: int) -> Contact:
        """The live node first met clockwise from ``target`` (the truth)."""
        return min(self.live(), key=lambda c: clockwise(target, c.position))

    def lookup(self, start: bytes, target: int, limit: int = 256) -> tuple[Contact | None, int]:
        """Route from node ``start`` to ``target``'s successor by the skip-list rule.

        Returns the successor found (``None`` if the route failed) and the hops
        taken. A link to a dead node is reported as a failure and the next one
        tried."""
        node = self.rings[start]
        hops = 0
        while hops < limit:
            ahead = node.route(target, count=64)
            live = [c for c in ahead if c.key in self.alive]
            for dead in ahead:
                if dead.key not in self.alive:
                    node.on_failure(dead, 1, self.now)
            if ahead and not live:
                return None, hops
            if not ahead:
                successor = node.link("right", 0)
                if successor is None or successor.key not in self.alive:
                    return None, hops
                if not (between(node.me.position, target, successor.position)
                        or target == successor.position):
                    return None, hops
                return successor, hops
            node = self.rings[live[0].key]
            hops += 1
        return None, hops
