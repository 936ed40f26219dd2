"""The iterative Kademlia lookup with S/Kademlia disjoint paths, sans-IO.

The initiator splits the ``k`` closest contacts it knows into ``paths``
groups; each path then runs its own iterative FIND_NODE lookup with up to
``alpha`` queries in flight. No node is queried by two paths, so a path
captured by adversaries (who answer only with each other) cannot spoil the
others. A path ends when the ``k`` closest contacts it knows (and no other
path queried) have all answered it. The result is the closest nodes that
answered any path: a node only counts once it replied with its own key.

A reply names a contact by key and a claimed address, unverified until the
contact answers there with that key. Each path keeps the addresses it heard
for a key, up to :data:`MAX_ADDRESSES`, first heard first: a key that failed
at one address is tried at the next one a path heard. So a liar who names a
real key at an address of its own (a trap that never answers with that key)
cannot hide the node from a path that heard its real address, and a
captured path cannot spoil the others' addresses.

The driver sends each returned :class:`Query`, sets its own timeouts and
feeds back :meth:`Lookup.on_reply` or :meth:`Lookup.on_failure`.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable

import attrs

from ketten.errors import UsageError

from ._ids import Contact

__all__ = ["MAX_ADDRESSES", "Lookup", "LookupStatistics", "Query"]

MAX_ADDRESSES = 3
"""Addresses a path keeps per key (the first it heard, then alternatives)."""


class _State(enum.Enum):
    KNOWN = 0
    WAITING = 1
    ANSWERED = 2
    FAILED = 3


@attrs.frozen
class Query:
    """Ask ``contact`` for the nodes it knows closest to the target."""

    contact: Contact
    path: int


@attrs.frozen
class LookupStatistics:
    queries: int
    failures: int
    answered: int
    hops: int
    """Sequential queries that led to the closest node found (0 if none answered)."""


@attrs.define(eq=False, slots=True)
class _Path:
    shortlist: list[tuple[int, int]] = attrs.field(factory=list)
    heard: dict[int, list[Contact]] = attrs.field(factory=dict)
    """The addresses this path heard for each key, first heard first."""
    waiting: int = 0
    done: bool = False


@attrs.define(eq=False)
class Lookup:
    """One lookup of ``target``; ``own_id`` is never queried nor returned."""

    target: int
    own_id: int
    k: int = 20
    alpha: int = 3
    paths: int = 1
    _paths: list[_Path] = attrs.field(init=False)
    _asked: dict[int, Contact] = attrs.field(factory=dict, init=False)
    """The contact (address) each key was last queried at."""
    _tried: dict[int, set[str]] = attrs.field(factory=dict, init=False)
    _state: dict[int, _State] = attrs.field(factory=dict, init=False)
    _owner: dict[int, int] = attrs.field(factory=dict, init=False)
    _depth: dict[int, int] = attrs.field(factory=dict, init=False)
    _answered: list[tuple[int, int]] = attrs.field(factory=list, init=False)
    _queries: int = attrs.field(default=0, init=False)
    _failures: int = attrs.field(default=0, init=False)
    _started: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        if self.k < 1 or self.alpha < 1 or self.paths < 1:
            raise UsageError("k, alpha and paths must be positive")
        self._paths = [_Path() for _ in range(self.paths)]

    @property
    def finished(self) -> bool:
        return self._started and all(path.done for path in self._paths)

    def start(self, seeds: Iterable[Contact]) -> list[Query]:
        """Begin with contacts from the own routing table (any order)."""
        if self._started:
            raise UsageError("a lookup starts once")
        self._started = True
        ordered = sorted(
            {c.id: c for c in seeds if c.id != self.own_id}.values(),
            key=lambda c: c.id ^ self.target,
        )[: self.k]
        for i, contact in enumerate(ordered):
            self._learn(i % self.paths, contact, 1)
        return self._advance()

    def on_reply(self, node_id: int, contacts: Iterable[Contact]) -> list[Query]:
        """``node_id`` answered (authenticated as the key it was contacted for)."""
        path_index = self._owner.get(node_id)
        if path_index is None or self._state.get(node_id) is not _State.WAITING:
            return []
        self._state[node_id] = _State.ANSWERED
        path = self._paths[path_index]
        path.waiting -= 1
        bisect.insort(self._answered, (node_id ^ self.target, node_id))
        depth = self._depth[node_id] + 1
        for contact in contacts:
            if contact.id != self.own_id:
                self._learn(path_index, contact, depth)
        return self._advance()

    def on_failure(self, node_id: int) -> list[Query]:
        """``node_id`` did not answer, answered with an error or with another key."""
        path_index = self._owner.get(node_id)
        if path_index is None or self._state.get(node_id) is not _State.WAITING:
            return []
        self._state[node_id] = _State.FAILED
        self._failures += 1
        self._paths[path_index].waiting -= 1
        del self._owner[node_id]  # never reached: any path may try another address
        return self._advance()

    def result(self, count: int) -> list[Contact]:
        """The ``count`` closest nodes that answered, nearest first."""
        return [self._asked[node_id] for _, node_id in self._answered[:count]]

    def statistics(self) -> LookupStatistics:
        hops = self._depth[self._answered[0][1]] if self._answered else 0
        return LookupStatistics(
            queries=self._queries, failures=self._failures,
            answered=len(self._answered), hops=hops,
        )

    def _learn(self, path_index: int, contact: Contact, depth: int) -> None:
        node_id = contact.id
        path = self._paths[path_index]
        heard = path.heard.get(node_id)
        if heard is not None:
            if len(heard) < MAX_ADDRESSES and all(
                    c.peer.address != contact.peer.address for c in heard):
                heard.append(contact)
            return
        path.heard[node_id] = [contact]
        state = self._state.get(node_id)
        if state is None:
            self._state[node_id] = _State.KNOWN
            self._depth[node_id] = depth
        elif depth < self._depth[node_id] and state is _State.KNOWN:
            self._depth[node_id] = depth
        bisect.insort(path.shortlist, (node_id ^ self.target, node_id))

    def _untried(self, path: _Path, node_id: int) -> Contact | None:
        tried = self._tried.get(node_id, ())
        for contact in path.heard[node_id]:
            if contact.peer.address not in tried:
                return contact
        return None

    def _advance(self) -> list[Query]:
        out: list[Query] = []
        for index, path in enumerate(self._paths):
            if path.done:
                continue
            eligible = 0
            pending = False
            for _, node_id in path.shortlist:
                if eligible >= self.k:
                    break
                state = self._state[node_id]
                owner = self._owner.get(node_id)
                if owner is not None and owner != index:
                    continue
                if state is _State.KNOWN or state is _State.FAILED:
                    contact = self._untried(path, node_id)
                    if contact is None:
                        continue  # failed at every address this path heard
                    eligible += 1
                    pending = True
                    if path.waiting < self.alpha:
                        self._state[node_id] = _State.WAITING
                        self._owner[node_id] = index
                        self._asked[node_id] = contact
                        self._tried.setdefault(node_id, set()).add(contact.peer.address)
                        path.waiting += 1
                        self._queries += 1
                        out.append(Query(contact, index))
                else:
                    eligible += 1
            if not pending and path.waiting == 0:
                path.done = True
        return out
