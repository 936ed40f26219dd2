"""Finding a key's ring successors: an iterative skip-list lookup, sans-IO.

The asking node keeps every node it has heard of as a candidate. It asks
the candidate nearest *before* the target (skip-list routing: each answer
names the answering node's links nearest before the target, so every hop
at least halves the distance on a converged ring) and the ``count``
candidates nearest *after* it (each answer also carries the node's
successor and predecessor lists: a node that lies about its successors
is contradicted by the predecessor lists of the nodes after it, which they
heard from those successors themselves). It is finished when all of those have answered or failed;
the result is made only of nodes that answered for themselves, so a node
that names others by forged keys cannot put them into it.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from ._names import RING, Contact, clockwise

__all__ = ["Found", "Lookup", "Query"]


@attrs.frozen
class Found:
    """What a node answered: itself (as authenticated), its successor and predecessor
    lists and its links nearest before the target."""

    contact: Contact
    successors: tuple[Contact, ...] = ()
    closer: tuple[Contact, ...] = ()
    predecessors: tuple[Contact, ...] = ()


@attrs.frozen
class Query:
    """Ask the node at ``address`` (``contact`` is what it is believed to be, if known)."""

    address: str
    contact: Contact | None


@attrs.define(eq=False)
class Lookup:
    """One lookup of the ``count`` successors of ``target`` (a ring position).

    At most ``alpha`` queries are out at once and ``max_queries`` in all.
    """

    target: int
    count: int
    alpha: int = 3
    max_queries: int = 200
    _unnamed: dict[str, None] = attrs.field(factory=dict, init=False)
    """Addresses to ask whose names are not known."""
    _candidates: dict[tuple[str, bytes], Contact] = attrs.field(factory=dict, init=False)
    """Every contact heard of, by address and key: two nodes may claim one address."""
    _answered: dict[str, Found] = attrs.field(factory=dict, init=False)
    _done: set[str] = attrs.field(factory=set, init=False)
    """Addresses asked (answered, failed or out)."""
    _out: set[str] = attrs.field(factory=set, init=False)
    _failed: set[str] = attrs.field(factory=set, init=False)
    queries: int = attrs.field(default=0, init=False)

    def start(self, local: Found | None, addresses: Iterable[str] = ()) -> list[Query]:
        """Begin with this node's own answer (``None``: it is not on a ring yet) and
        addresses of nodes whose names are not known (bootstrap nodes)."""
        if local is not None:
            address = local.contact.peer.address
            self._done.add(address)
            self._take(address, local)
        for address in addresses:
            self._unnamed[address] = None
        return self._next()

    def on_reply(self, address: str, found: Found) -> list[Query]:
        """The node at ``address`` answered (``found.contact`` as it authenticated)."""
        self._out.discard(address)
        self._take(address, found)
        return self._next()

    def on_failure(self, address: str) -> list[Query]:
        """The node at ``address`` did not answer (or answered wrongly)."""
        self._out.discard(address)
        self._failed.add(address)
        return self._next()

    @property
    def finished(self) -> bool:
        return not self._out and not self._wanted()

    def result(self) -> list[Contact]:
        """The nodes that answered, first met clockwise from the target, at most ``count``."""
        answered = {f.contact.key: f.contact for f in self._answered.values()}
        ranked = sorted(answered.values(), key=lambda c: clockwise(self.target, c.position))
        return ranked[: self.count]

    def answered(self) -> list[Found]:
        """Every answer so far."""
        return list(self._answered.values())

    def _take(self, address: str, found: Found) -> None:
        self._answered[address] = found
        for contact in (found.contact, *found.successors, *found.closer, *found.predecessors):
            self._candidates[(contact.peer.address, contact.key)] = contact

    def _wanted(self) -> list[str]:
        if self.queries >= self.max_queries:
            return []
        wanted = [a for a in self._unnamed if a not in self._done]
        # A contact is refuted when its address failed or another key answered there.
        named = [c for c in self._candidates.values() if not self._refuted(c)]
        # A node at the target itself is its first successor, not a predecessor.
        before = min(named, key=lambda c: clockwise(c.position, self.target) or RING,
                     default=None)
        if before is not None and before.peer.address not in self._done:
            wanted.append(before.peer.address)
        after = sorted(named, key=lambda c: clockwise(self.target, c.position))
        for contact in after[: self.count]:
            address = contact.peer.address
            if address not in self._done and address not in wanted:
                wanted.append(address)
        return wanted

    def _next(self) -> list[Query]:
        out: list[Query] = []
        for address in self._wanted():
            if len(self._out) >= self.alpha or self.queries >= self.max_queries:
                break
            self._out.add(address)
            self._done.add(address)
            self.queries += 1
            named = [c for (a, _), c in self._candidates.items() if a == address]
            out.append(Query(address, named[0] if named else None))
        return out

    def _refuted(self, contact: Contact) -> bool:
        address = contact.peer.address
        if address in self._failed:
            return True
        found = self._answered.get(address)
        return found is not None and found.contact.key != contact.key
