"""One node's GosSkip neighbour lists, built by gossip: a sans-IO state machine.

Rules (chapters 3.1 and 5.2 of the GosSkip seed):

* Level 0 is the ring: the node's successor (its *right* neighbour) and its
  predecessor (*left*). Level ``i`` links to the ``k**i``-th neighbour on each
  side once the gossip has converged.
* Every round the node gossips on each level it has a link for: to the right
  on even levels, to the left on odd ones. A message on level ``i`` carries
  the sender (counter 0) and the chain of nodes behind it that it heard of on
  level ``i`` (counters 1, 2, ...): the receiver's ``c+1``-th level-``i``
  neighbour on the side the message came from has counter ``c``. Counter 0
  is the receiver's level-``i`` link on that side, counter ``k - 1`` its
  level-``i + 1`` link. Chains are cut where they would pass the receiver or
  turn back: on a ring too small for level ``i + 1`` that link is dropped, so
  the number of levels follows the network size.
* Level-0 messages carry the chain further, as far as the repair list is
  long: the receiver's predecessor list. The answer to a level-0 message
  carries the receiver's successor list (the *repair list*): the sender keeps
  the receiver followed by that list.
* Link notification: a node that gets level-0 gossip from a node farther than
  its live predecessor answers with that predecessor; the sender, if the
  named node lies between them, takes it as its successor and gossips to it
  at once. A node nearer than the predecessor becomes the new predecessor.
  So a ring broken by failures or joins closes again.
* Leaving is falling silent: links not heard of for ``stale`` seconds are
  dropped; a successor that failed ``drop_after`` requests in a row is
  replaced by the next node of the repair list.

Nothing here does I/O: the driver hands in messages, answers, failures and
``now``, and sends what :meth:`Ring.gossip_due` returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from ketten.errors import ProtocolError

from ._names import Contact, between, clockwise

__all__ = ["MAX_ENTRIES", "MAX_LEVELS", "Answer", "Gossip", "Link", "Ring", "RingStatistics"]

MAX_LEVELS = 64
"""No ring of 2**64 nodes exists: levels at and above this are refused."""
MAX_ENTRIES = 64
"""The longest chain a gossip message or repair list may carry."""


@attrs.frozen
class Link:
    """A neighbour and when this node last heard of it."""

    contact: Contact
    heard: float


@attrs.frozen
class Gossip:
    """A gossip message to send: ``entries[j]`` carries counter ``j + 1``."""

    level: int
    to: Contact
    entries: tuple[Contact, ...]


@attrs.frozen
class Answer:
    """The answer to a gossip message: the receiver's repair list, and on level 0
    the better predecessor it knows of (a link notification) or ``None``."""

    successors: tuple[Contact, ...]
    notify: Contact | None = None


@attrs.frozen
class RingStatistics:
    """A snapshot of one node's neighbour lists."""

    levels: int
    successors: int
    predecessors: int
    contacts: int
    repairs: int
    notifications: int


def _direction(me: int, side: str, other: int) -> int:
    return clockwise(me, other) if side == "right" else clockwise(other, me)


@attrs.define(eq=False)
class Ring:
    """The neighbour lists of the node ``me``.

    ``k`` is the skip length, ``repair`` the shortest repair and predecessor
    list (they grow to the number of levels), ``stale`` the seconds after
    which an unheard neighbour is dropped, ``drop_after`` the failed requests
    in a row that remove a neighbour, ``max_levels`` the highest level + 1.
    """

    me: Contact
    k: int = 2
    repair: int = 5
    stale: float = 6.0
    drop_after: int = 1
    max_levels: int = 32
    _successors: list[Contact] = attrs.field(factory=list, init=False)
    _predecessors: list[Contact] = attrs.field(factory=list, init=False)
    _pred_heard: float = attrs.field(default=0.0, init=False)
    _links: dict[tuple[str, int], Link] = attrs.field(factory=dict, init=False)
    _buffers: dict[int, tuple[tuple[Contact, ...], float]] = attrs.field(factory=dict, init=False)
    _failures: dict[bytes, int] = attrs.field(factory=dict, init=False)
    _version: int = attrs.field(default=0, init=False)
    _view: frozenset[tuple[bytes, str, int]] = attrs.field(factory=frozenset, init=False)
    _repairs: int = attrs.field(default=0, init=False)
    _notifications: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        if self.k < 2 or self.repair < 1 or self.drop_after < 1:
            raise ValueError("k must be at least 2, repair and drop_after at least 1")
        self.max_levels = min(self.max_levels, MAX_LEVELS)

    # -- reading -------------------------------------------------------------

    @property
    def version(self) -> int:
        """Changes whenever the set of known nodes (or an address or order) changes."""
        return self._version

    @property
    def successors(self) -> list[Contact]:
        """The repair list: the known successors, nearest first."""
        return list(self._successors)

    @property
    def predecessors(self) -> list[Contact]:
        """The known predecessors, nearest first."""
        return list(self._predecessors)

    def link(self, side: str, level: int) -> Contact | None:
        """The level-``level`` neighbour on ``side`` (``"left"`` or ``"right"``)."""
        if level == 0:
            chain = self._successors if side == "right" else self._predecessors
            return chain[0] if chain else None
        found = self._links.get((side, level))
        return None if found is None else found.contact

    @property
    def height(self) -> int:
        """The number of levels this node has a link on."""
        levels = [level for _, level in self._links]
        return (max(levels) if levels else 0) + 1

    def list_size(self) -> int:
        """How long the repair and predecessor lists are kept: ``repair`` at least,
        more on larger rings (one per level)."""
        return min(MAX_ENTRIES, max(self.repair, self.height + 1))

    def known(self) -> dict[bytes, Contact]:
        """Every node this one links to, by public key."""
        found: dict[bytes, Contact] = {}
        for link in self._links.values():
            found[link.contact.key] = link.contact
        for contact in self._predecessors:
            found[contact.key] = contact
        for contact in self._successors:
            found[contact.key] = contact
        found.pop(self.me.key, None)
        return found

    def nearest(self, target: int, count: int) -> list[Contact]:
        """The ``count`` known nodes (this one included) first met going clockwise
        from ``target``: its ring successors as far as this node knows."""
        everyone = [self.me, *self.known().values()]
        everyone.sort(key=lambda c: clockwise(target, c.position))
        return everyone[:count]

    def route(self, target: int, count: int = 1) -> list[Contact]:
        """Skip-list routing: the known nodes that precede ``target`` and lie after this
        one, nearest to the target first; empty when this node is the target's
        predecessor (the target lies between it and its successor)."""
        successor = self.link("right", 0)
        if successor is None or between(self.me.position, target, successor.position) or (
                target == successor.position):
            return []
        ahead = [c for c in self.known().values()
                 if between(self.me.position, c.position, target)]
        ahead.sort(key=lambda c: clockwise(c.position, target))
        return ahead[:count]

    def statistics(self) -> RingStatistics:
        return RingStatistics(
            levels=self.height, successors=len(self._successors),
            predecessors=len(self._predecessors), contacts=len(self.known()),
            repairs=self._repairs, notifications=self._notifications,
        )

    # -- gossip --------------------------------------------------------------

    def gossip_due(self, now: float) -> list[Gossip]:
        """The messages of one gossip round (stale neighbours are dropped first)."""
        self.expire(now)
        out: list[Gossip] = []
        for level in range(self.max_levels):
            target = self.link("right" if level % 2 == 0 else "left", level)
            if target is None:
                continue
            chain = self._buffers.get(level, ((), 0.0))[0]
            out.append(Gossip(level, target, chain[: self._limit(level) - 1]))
        return out

    def on_gossip(self, sender: Contact, level: int, entries: Sequence[Contact],
                  now: float) -> Answer:
        """Take a level-``level`` gossip message from ``sender`` (authenticated) and
        answer it. Raises :class:`~ketten.errors.ProtocolError` for a level out of
        range, an overlong chain or a message from this node itself."""
        if not 0 <= level < self.max_levels:
            raise ProtocolError(f"gossip on level {level} (this node keeps {self.max_levels})")
        if len(entries) > MAX_ENTRIES:
            raise ProtocolError(f"a gossip chain of {len(entries)} entries")
        if sender.key == self.me.key:
            raise ProtocolError("gossip from this node's own key")
        side = "left" if level % 2 == 0 else "right"
        chain, wrapped = self._chain(side, [sender, *entries])
        notify: Contact | None = None
        if level == 0:
            pred = self._predecessors[0] if self._predecessors else None
            if (pred is None or pred.key == sender.key
                    or between(pred.position, sender.position, self.me.position)):
                self._predecessors = list(chain[: self.list_size()])
                self._pred_heard = now
                self._buffers[0] = (chain, now)
                self._learn(side, 0, chain, wrapped, now)
                if not self._successors:
                    self._successors = [sender]  # a ring of two closes
            else:
                notify = pred
        else:
            self._links[(side, level)] = Link(sender, now)
            self._buffers[level] = (chain, now)
            self._learn(side, level, chain, wrapped, now)
        self._changed()
        return Answer(tuple(self._successors[:MAX_ENTRIES]), notify)

    def on_answer(self, responder: Contact, level: int, answer: Answer, now: float) -> bool:
        """Take the answer to a gossip message on ``level``. True when the successor
        changed and a level-0 message should go to the new one now."""
        self._failures.pop(responder.key, None)
        again = False
        if level == 0:
            current = self.link("right", 0)
            if current is None or current.key != responder.key:
                return False
            notify = answer.notify
            if (notify is not None and notify.key != self.me.key
                    and between(self.me.position, notify.position, responder.position)):
                self._successors = [notify, *self._successors]
                self._notifications += 1
                again = True
            chain, _ = self._chain("right", [self._successors[0], *(
                [responder] if again else []), *answer.successors])
            self._successors = list(chain[: self.list_size()])
        else:
            side = "right" if level % 2 == 0 else "left"
            link = self._links.get((side, level))
            if link is not None and link.contact.key == responder.key:
                self._links[(side, level)] = Link(link.contact, now)
        self._changed()
        return again

    def on_failure(self, contact: Contact, level: int, now: float) -> bool:
        """A request to ``contact`` failed. After ``drop_after`` failures in a row it is
        dropped everywhere. True when the successor changed (gossip to the new one now)."""
        failures = self._failures.get(contact.key, 0) + 1
        if failures < self.drop_after:
            self._failures[contact.key] = failures
            return False
        self._failures.pop(contact.key, None)
        was_successor = bool(self._successors) and self._successors[0].key == contact.key
        self.forget(contact.key)
        if was_successor:
            self._repairs += 1
        return was_successor and bool(self._successors)

    def forget(self, key: bytes) -> None:
        """Drop the node with this public key from every list."""
        self._successors = [c for c in self._successors if c.key != key]
        self._predecessors = [c for c in self._predecessors if c.key != key]
        for where, link in list(self._links.items()):
            if link.contact.key == key:
                del self._links[where]
        self._changed()

    def adopt(self, found: Iterable[Contact]) -> bool:
        """Take nodes a lookup of this node's own name found: when one of them lies
        between this node and its successor, they become the repair list (the ring
        closes over a node this one missed). True when the successor changed."""
        chain, _ = self._chain("right", sorted(
            (c for c in found if c.key != self.me.key),
            key=lambda c: clockwise(self.me.position, c.position)))
        if not chain:
            return False
        current = self.link("right", 0)
        if current is not None and not between(self.me.position, chain[0].position,
                                                current.position):
            return False
        self._successors = list(chain[: self.list_size()])
        self._changed()
        return True

    def expire(self, now: float) -> None:
        """Drop what was not heard of for ``stale`` seconds."""
        horizon = now - self.stale
        if self._predecessors and self._pred_heard < horizon:
            self._predecessors = []
        for where, link in list(self._links.items()):
            if link.heard < horizon:
                del self._links[where]
        for level, (_, heard) in list(self._buffers.items()):
            if heard < horizon:
                del self._buffers[level]
        self._changed()

    # -- internals -------------------------------------------------------------

    def _limit(self, level: int) -> int:
        return max(self.k, self.list_size()) if level == 0 else self.k

    def _chain(self, side: str, contacts: Sequence[Contact]) -> tuple[tuple[Contact, ...], bool]:
        """The prefix of ``contacts`` that moves steadily away on ``side``; and
        whether it was cut because it came back to or passed this node."""
        out: list[Contact] = []
        last = 0
        for contact in contacts:
            if contact.key == self.me.key:
                return tuple(out), True
            distance = _direction(self.me.position, side, contact.position)
            if distance <= last:
                return tuple(out), True
            out.append(contact)
            last = distance
        return tuple(out), False

    def _learn(self, side: str, level: int, chain: tuple[Contact, ...], wrapped: bool,
               now: float) -> None:
        if len(chain) >= self.k and level + 1 < self.max_levels:
            self._links[(side, level + 1)] = Link(chain[self.k - 1], now)
        elif wrapped:
            # The ring is too small for the next level on this side.
            for where in [w for w in self._links if w[0] == side and w[1] > level]:
                del self._links[where]

    def _changed(self) -> None:
        view = frozenset((c.key, c.peer.address, c.order) for c in self.known().values())
        if view != self._view:
            self._view = view
            self._version += 1
