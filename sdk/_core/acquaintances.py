"""Nodes this node has recently exchanged authenticated messages with, sans-IO.

An overlay forgets nodes it cannot reach: behind a partition, every broker
of a chain can drop out of the routing table. A node that then surveys the
nodes it still sees would find nobody holding the chain and start a second
one, and one of the two would later be given up with its acknowledged
events. Remembering whom this node talked to, and when, lets it tell "no
node near the key holds the chain" from "the nodes near the key are out of
reach": creation waits until the nodes near the key that were seen within
the memory window answer (or the window passes).

The memory is bounded (least recently seen first out) and keyed by the
authenticated public key, so a peer cannot place entries under keys it does
not own. A node first heard from through its own request is remembered at
the address it claims (the overlay admits it to its routing table the same
way, and the brokers of a chain that all crash may never have answered this
node: forgetting them would let it start a second chain); an answer moves an
entry to the address that answered, and a claimed address never replaces
one that answered. Nodes known only by their requests are kept apart, with
their own bound: a peer that makes up many keys can push out other claims,
never the nodes that answered. The node pings a claimed address once, right
after the claim (an honest node is there then): an answer moves the node to
the answered tier, and a claim refused there is forgotten
(:meth:`Acquaintances.refute`), so a peer claiming an address that is not
its own cannot hold back the creation of chains near its key for long.

A claim whose check got no answer in time (:meth:`Acquaintances.doubt`)
counts only for a short grace after it (a partition may have begun just
then), not for the whole memory: else a peer could make up keys claiming an
address that accepts connections and never answers, and hold back every new
chain near those keys for the whole memory. And one address holds one node:
a key that claims an address another unproven key claimed takes its place.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable

import attrs

from .identity import node_id_of
from .membership import Member

__all__ = ["Acquaintances"]


@attrs.define(eq=False)
class Acquaintances:
    """When each node was last heard from, and where (bounded, most recent kept): up to
    ``capacity`` nodes that answered and as many more known only by their requests."""

    capacity: int = 4096
    _answered: OrderedDict[bytes, tuple[str, float, int]] = attrs.field(factory=OrderedDict,
                                                                         init=False)
    _claimed: OrderedDict[bytes, tuple[str, float, int]] = attrs.field(factory=OrderedDict,
                                                                        init=False)
    _claimants: dict[str, bytes] = attrs.field(factory=dict, init=False)
    """The key claiming each address of the claimed tier."""
    _doubted: dict[bytes, float] = attrs.field(factory=dict, init=False)
    """Claims whose check got no answer, with when they stop counting."""

    def saw(self, key: bytes, address: str, now: float, *, reached: bool = True) -> None:
        """``key`` sent an authenticated message at ``now``: an answer from ``address``
        (``reached``), or a request claiming ``address``, which is taken only for a node
        not known yet (never in place of an address that answered)."""
        known = self._answered.get(key)
        tier = self._answered
        if known is None:
            known = self._claimed.get(key)
            if reached:
                self._claimed.pop(key, None)
            else:
                tier = self._claimed
        if known is not None and not reached:
            address = known[0]
        if reached:
            self._forget_claim(key)
        elif known is None:
            rival = self._claimants.get(address)
            if rival is not None and rival != key:
                self._forget_claim(rival)  # one address, one node: the newest claim
            self._claimants[address] = key
        node_id = known[2] if known is not None else int.from_bytes(node_id_of(key), "big")
        tier[key] = (address, now, node_id)
        tier.move_to_end(key)
        while len(tier) > self.capacity:
            oldest = next(iter(tier))
            if tier is self._claimed:
                self._forget_claim(oldest)
            else:
                del tier[oldest]

    def _forget_claim(self, key: bytes) -> None:
        known = self._claimed.pop(key, None)
        self._doubted.pop(key, None)
        if known is not None and self._claimants.get(known[0]) == key:
            del self._claimants[known[0]]

    def answered_at(self, key: bytes) -> str | None:
        """The address ``key`` last answered at, if it ever answered."""
        known = self._answered.get(key)
        return None if known is None else known[0]

    def claimed_at(self, key: bytes) -> str | None:
        """The address ``key`` claimed, if it is known only by its requests."""
        known = self._claimed.get(key)
        return None if known is None else known[0]

    def refute(self, key: bytes, address: str) -> bool:
        """``address``, claimed by ``key``, did not answer as ``key`` right after the
        claim: forget the claim (a node that answered is kept). ``True`` if forgotten."""
        known = self._claimed.get(key)
        if known is None or known[0] != address:
            return False
        self._forget_claim(key)
        return True

    def doubt(self, key: bytes, address: str, until: float) -> None:
        """The check of ``address``, claimed by ``key``, got no answer in time: the
        claim counts in :meth:`nearest` only until ``until`` (unless it is proven
        meanwhile, or claimed again and checked again)."""
        known = self._claimed.get(key)
        if known is not None and known[0] == address:
            self._doubted[key] = until

    def doubted(self, key: bytes) -> bool:
        """Whether ``key``'s claim got no answer when last checked."""
        return key in self._doubted

    def last_seen(self, key: bytes) -> float | None:
        known = self._answered.get(key) or self._claimed.get(key)
        return None if known is None else known[1]

    def nearest(self, target: bytes, count: int, *, since: float, now: float | None = None,
                distance: Callable[[int, int], int] = operator.xor) -> list[Member]:
        """The ``count`` nodes seen at or after ``since`` whose node ids are nearest to
        ``target`` by ``distance(node id, target)`` (XOR unless the overlay has its
        own metric), nearest first; with ``now``, no claim doubted until before it."""
        goal = int.from_bytes(target, "big")
        recent = []
        doubted = self._doubted
        for tier in (self._answered, self._claimed):
            for key in reversed(tier):  # most recently seen first
                address, when, node_id = tier[key]
                if when < since:
                    break
                if now is not None and key in doubted and doubted[key] < now:
                    continue
                recent.append((distance(node_id, goal), key, address))
        recent.sort()
        return [Member(key, address) for _, key, address in recent[:count]]

    def __len__(self) -> int:
        return len(self._answered) + len(self._claimed)
