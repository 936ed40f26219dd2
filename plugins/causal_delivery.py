"""The ``causal`` delivery: CBCAST over the chains a subscriber reads.

An event reaches the application only after every event of the subscribed
criteria that happened before it (by the vector stamps in ``Event.clock``),
and each criterion's events come in chain order.

How the CBCAST conditions are scoped
------------------------------------
Seed 001 delivers a message from ``j`` with vector ``vt`` when
``VT[j] + 1 == vt[j]`` and ``VT[k] >= vt[k]`` for every other ``k``. That
rule assumes the receiver sees *every* message of every author. A ketten
subscriber does not: an author's counter also ticks for events in criteria
the subscriber does not read (and for publishes that were retried), so its
counters have gaps, and a dependency ``(author, counter)`` may name an event
the subscriber can never receive. Waiting for it would block forever.

So dependencies are taken from the subscribed chains, not from author
counters. Each subscribed criterion is a FIFO stream (its chain). The rule,
for an event ``e`` of criterion ``X`` with stamp ``V`` by author ``a``:

1. *Chain order*: every event of ``X`` before ``e`` is delivered.
2. *Causal order*: for every other subscribed criterion ``Y``, no undelivered
   event of ``Y`` happened before ``e``.

Condition 2 needs only the next undelivered event ``n`` of ``Y``, because
stamps grow along a chain (see the requirement below): if anything later in
``Y`` happened before ``e``, so did ``n``. ``n`` happened before ``e`` iff
``V(n)[author(n)] <= V[author(n)]`` (``V[a] - 1`` when ``n`` is also by
``a``): one dictionary lookup. If ``n`` has not arrived yet, ``Y`` cannot hold
an undelivered event that happened before ``e`` when

* the last delivered event ``f`` of ``Y`` did not happen before ``e``
  (everything after ``f`` in ``Y`` happened after ``f``), or
* ``V[k] <= max(F[k], D[k])`` for every author ``k`` in ``V`` (own entry
  minus one), where ``F`` is the stamp of ``f`` (every later event of ``Y``
  carries an own counter above ``F``) and ``D[k]`` the largest ``c`` such
  that ``k``'s counters ``1..c`` have all been delivered (a counter names one
  event; when every author writes only in subscribed chains this is
  exactly seed 001's ``VT[k] >= vt[k]``), or
* ``Y`` has been delivered up to the head the subscription layer reported
  for it (:meth:`CausalDelivery.note_head`).

Otherwise ``e`` waits for the arrival of ``n``. A criterion found clear for
``e`` stays clear, since later events of it only grow.

Consequences, stated as guarantees:

* No event is ever waited for by its ``(author, counter)``: an event waits
  only for positions of subscribed chains. Authors who write only in
  criteria the subscriber does not read therefore never block it; their
  entries in ``V`` delay an event only until every subscribed chain shows
  (by its next event, its last delivered event or its reported head) that
  it holds nothing the event depends on.
* An author who writes both inside and outside the subscription delays an
  event only while a subscribed chain could still hold one of its earlier
  events.
* Nothing waits forever once every subscribed chain has been received up to
  the head reported for it. A criterion whose head was never reported
  counts as possibly holding more, so the subscription layer must report
  heads (after its initial sync, and from each notification).
* An event that was still being appended to a subscribed chain when a
  causally later event became deliverable (the reported head did not yet
  include it) is delivered after that event: causality is guaranteed for
  everything the reported heads cover.

Requirement on publishers (the replication layer): before stamping an event,
the publisher observes the stamp of the head it builds on, so stamps grow
along every chain (``V(prev) < V(e)``). Events whose stamp is not a valid
vector stamp naming their own author are ordered by their chain only
(``statistics().unstamped``).

The holdback queue
------------------
Events that arrive ahead of their chain wait in a per-criterion map keyed by
seq. The next event of each chain is a *candidate*; a candidate that must wait
is filed under the one position it waits for, ``(criterion, seq)``: the
position whose arrival or delivery can release it. An arrival or delivery
wakes only the candidates filed under that position, and each candidate
resumes its scan of the criteria where it stopped (a criterion once found
clear stays clear), so the work per event is one pass over the subscribed
criteria plus one step per wake-up: nothing ever rescans the queue.

The queue is bounded by ``max_held``: an event that would wait while the
queue is full is refused with :class:`HoldbackFull` (the queue is unchanged)
and counted in ``statistics().refused``.

Options of the factory: ``criteria`` (required: the subscribed criterion
keys), ``start`` (``{criterion: first seq}``, default 0), ``heads``
(``{criterion: head seq or None for an empty chain}`` known at creation),
``max_held`` (default 65536), ``max_authors`` (the largest stamp accepted,
default 4096 authors).

Calling it: the subscription layer calls :meth:`CausalDelivery.offer` for
every received event of the subscribed criteria (any order, duplicates fine)
and :meth:`CausalDelivery.note_head` whenever it learns a chain's head; it
hands the returned events to the application in the returned order and
calls ``node.clock.observe(event.clock)`` for each of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from ketten import Event, hookimpl
from ketten.errors import ConfigError, DecodeError, UsageError

from ._clock_vector import DEFAULT_MAX_AUTHORS, decode_vector
from ._holdback import (
    DEFAULT_MAX_HELD,
    DeliveryStatistics,
    HoldbackFull,
    parse_criteria,
    parse_max_held,
    parse_positions,
)

if TYPE_CHECKING:
    from ketten import Node

__all__ = ["CausalDelivery", "DeliveryStatistics", "HoldbackFull"]

_Slot = tuple[bytes, int]
_MAX_ABOVE = 1024
_ABOVE_ALL = 1 << 64


def _as_tuple(criteria: Iterable[bytes]) -> tuple[bytes, ...]:
    return tuple(criteria)


class _Held:
    """An offered event with what the queue needs to know about it."""

    __slots__ = ("as_dependency", "counter", "cursor", "event", "index", "need", "stored", "vector")

    def __init__(
        self,
        event: Event,
        vector: dict[bytes, int] | None,
        need: dict[bytes, int],
        counter: int,
        index: int,
        as_dependency: tuple[bytes, int],
    ) -> None:
        self.event = event
        self.vector = vector
        self.need = need
        """``V`` with the own entry lowered by one: what must precede the event."""
        self.counter = counter
        """The author's own entry in the stamp (0: unstamped)."""
        self.index = index
        """Position of the event's criterion in the subscription."""
        self.as_dependency = as_dependency
        """``(author, counter)``; the counter of an unstamped event is above every counter."""
        self.cursor = 0
        """The criteria before this index are known to hold nothing the event needs."""
        self.stored = False


@attrs.define(eq=False, on_setattr=attrs.setters.NO_OP)
class CausalDelivery:
    """A :class:`~ketten.interfaces.Delivery` in causal order over ``criteria``."""

    _criteria: tuple[bytes, ...] = attrs.field(alias="criteria", converter=_as_tuple)
    _start: Mapping[bytes, int | None] = attrs.field(factory=dict, alias="start")
    _heads: dict[bytes, int] = attrs.field(factory=dict, alias="heads")
    _max_held: int = attrs.field(default=DEFAULT_MAX_HELD, alias="max_held")
    _max_authors: int = attrs.field(default=DEFAULT_MAX_AUTHORS, alias="max_authors")
    _next: dict[bytes, int] = attrs.field(factory=dict, init=False)
    _held: dict[bytes, dict[int, _Held]] = attrs.field(factory=dict, init=False)
    _frontier: dict[bytes, dict[bytes, int]] = attrs.field(factory=dict, init=False)
    _last: dict[bytes, tuple[bytes, int]] = attrs.field(factory=dict, init=False)
    """Author and own counter of the last delivered stamped event of each criterion."""
    _dense: dict[bytes, int] = attrs.field(factory=dict, init=False)
    """Per author, the largest ``c`` such that its counters ``1..c`` are all delivered."""
    _above: dict[bytes, set[int]] = attrs.field(factory=dict, init=False)
    _waiting: dict[_Slot, list[_Held]] = attrs.field(factory=dict, init=False)
    _index: dict[bytes, int] = attrs.field(factory=dict, init=False)
    _candidates: list[tuple[bytes, int] | None] = attrs.field(factory=list, init=False)
    """Per criterion index: ``as_dependency`` of its next event if that is held."""
    _held_count: int = attrs.field(default=0, init=False)
    _stats: dict[str, int] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        if not self._criteria:
            raise UsageError("a causal delivery needs at least one criterion")
        self._stats = dict.fromkeys(attrs.fields_dict(DeliveryStatistics), 0)
        for index, criterion in enumerate(self._criteria):
            self._index[criterion] = index
            self._candidates.append(None)
            self._next[criterion] = self._start.get(criterion) or 0
            self._held[criterion] = {}
            self._frontier[criterion] = {}
        self._heads = {k: v for k, v in self._heads.items() if k in self._next}

    # -- public API ----------------------------------------------------------

    def offer(self, event: Event) -> list[Event]:
        """Take a received event; return the events deliverable now, in order.

        Raises :class:`~ketten.errors.UsageError` for an event of a criterion
        that is not subscribed and :class:`HoldbackFull` when the event would
        have to wait and the queue is at its bound (the event is not taken).
        """
        criterion = event.criterion
        nxt = self._next.get(criterion)
        if nxt is None:
            raise UsageError(f"criterion {criterion.hex()[:16]} is not one this queue delivers")
        stats = self._stats
        stats["offered"] += 1
        seq = event.seq
        if seq < nxt:
            stats["duplicates"] += 1
            return []
        chain = self._held[criterion]
        other = chain.get(seq)
        if other is not None:
            stats["duplicates"] += 1
            if other.event.hash != event.hash:
                stats["conflicts"] += 1
            return []
        head = self._heads.get(criterion)
        if head is not None and seq > head:
            self._heads[criterion] = seq
        held = self._make_held(event)
        if seq != nxt:
            self._store(held, chain)
            return []
        blocker = self._blocker(held)
        out: list[Event] = []
        if blocker is None:
            self._run([held], out)
            return out
        self._store(held, chain)
        self._candidates[held.index] = held.as_dependency
        self._wait(blocker, held)
        woken = self._waiting.pop((criterion, seq), None)
        if woken:
            stats["wakeups"] += len(woken)
            self._run(woken, out)
        return out

    def note_head(self, criterion: bytes, seq: int | None) -> list[Event]:
        """Record that the chain of ``criterion`` reaches ``seq`` (``None``: it is empty).

        Returns the events this releases, in order. Raises
        :class:`~ketten.errors.UsageError` for a criterion that is not
        subscribed or a negative seq.
        """
        nxt = self._next.get(criterion)
        if nxt is None:
            raise UsageError(f"criterion {criterion.hex()[:16]} is not one this queue delivers")
        if seq is None:
            seq = -1
        elif type(seq) is not int or seq < 0:
            raise UsageError(f"a head seq must be an int >= 0 or None, got {seq!r}")
        known = self._heads.get(criterion)
        if known is None or seq > known:
            self._heads[criterion] = seq
        out: list[Event] = []
        if nxt > self._heads[criterion]:
            woken = self._waiting.pop((criterion, nxt), None)
            if woken:
                self._stats["wakeups"] += len(woken)
                self._run(woken, out)
        return out

    def pending(self) -> int:
        """How many events are held back."""
        return self._held_count

    def next_seq(self, criterion: bytes) -> int:
        """The seq the application receives next from ``criterion``.

        Raises :class:`~ketten.errors.UsageError` for a criterion not subscribed.
        """
        nxt = self._next.get(criterion)
        if nxt is None:
            raise UsageError(f"criterion {criterion.hex()[:16]} is not one this queue delivers")
        return nxt

    def statistics(self) -> DeliveryStatistics:
        """A frozen snapshot of the counters."""
        return DeliveryStatistics(**{**self._stats, "held": self._held_count})

    # -- internals -------------------------------------------------------------

    def _make_held(self, event: Event) -> _Held:
        try:
            vector = decode_vector(event.clock, max_authors=self._max_authors)
        except DecodeError:
            vector = None
        author = event.author
        counter = vector.get(author, 0) if vector is not None else 0
        index = self._index[event.criterion]
        if vector is None or counter == 0:
            self._stats["unstamped"] += 1
            return _Held(event, None, {}, 0, index, (author, _ABOVE_ALL))
        need = dict(vector)
        if counter == 1:
            del need[author]
        else:
            need[author] = counter - 1
        return _Held(event, vector, need, counter, index, (author, counter))

    def _store(self, held: _Held, chain: dict[int, _Held]) -> None:
        if self._held_count >= self._max_held:
            self._stats["refused"] += 1
            raise HoldbackFull(held.event.criterion, held.event.seq, self._max_held)
        chain[held.event.seq] = held
        held.stored = True
        self._held_count += 1
        if self._held_count > self._stats["peak_held"]:
            self._stats["peak_held"] = self._held_count

    def _wait(self, slot: _Slot, held: _Held) -> None:
        waiters = self._waiting.get(slot)
        if waiters is None:
            self._waiting[slot] = [held]
        else:
            waiters.append(held)

    def _blocker(self, held: _Held) -> _Slot | None:
        """The position ``held`` (a candidate) must wait for, or ``None``."""
        need = held.need
        if not need:
            return None
        own = held.index
        criteria = self._criteria
        candidates = self._candidates
        count = len(criteria)
        i = held.cursor
        while i < count:
            if i != own:
                candidate = candidates[i]
                if candidate is not None:
                    if candidate[1] <= need.get(candidate[0], 0):
                        held.cursor = i
                        return (criteria[i], self._next[criteria[i]])
                elif self._may_hold_dependency(criteria[i], need):
                    held.cursor = i
                    return (criteria[i], self._next[criteria[i]])
            i += 1
        held.cursor = count
        return None

    def _may_hold_dependency(self, criterion: bytes, need: dict[bytes, int]) -> bool:
        """Whether the undelivered, not yet received rest of ``criterion`` could
        hold an event that must precede an event needing ``need``."""
        last = self._last.get(criterion)
        if last is not None and last[1] > need.get(last[0], 0):
            return False
        head = self._heads.get(criterion)
        if head is not None and self._next[criterion] > head:
            return False
        frontier = self._frontier[criterion]
        dense = self._dense
        for author, counter in need.items():
            if counter > frontier.get(author, 0) and counter > dense.get(author, 0):
                return True
        return False

    def _count_delivered(self, author: bytes, counter: int) -> None:
        dense = self._dense.get(author, 0)
        if counter != dense + 1:
            above = self._above.setdefault(author, set())
            if len(above) >= _MAX_ABOVE:
                above.clear()  # forgetting only makes the rule more cautious
            above.add(counter)
            return
        dense = counter
        above_dense = self._above.get(author)
        if above_dense:
            while dense + 1 in above_dense:
                dense += 1
                above_dense.discard(dense)
        self._dense[author] = dense

    def _run(self, work: list[_Held], out: list[Event]) -> None:
        """Deliver every candidate in ``work`` that is free, and what that frees."""
        stats = self._stats
        waiting = self._waiting
        while work:
            held = work.pop()
            blocker = self._blocker(held)
            if blocker is not None:
                self._wait(blocker, held)
                continue
            event = held.event
            criterion = event.criterion
            seq = event.seq
            chain = self._held[criterion]
            if held.stored:
                del chain[seq]
                self._held_count -= 1
            out.append(event)
            stats["delivered"] += 1
            self._next[criterion] = seq + 1
            if held.vector is not None:
                self._frontier[criterion] = held.vector
                self._last[criterion] = (event.author, held.counter)
                self._count_delivered(event.author, held.counter)
            following = chain.get(seq + 1)
            if following is not None:
                work.append(following)
                self._candidates[held.index] = following.as_dependency
            else:
                self._candidates[held.index] = None
            woken = waiting.pop((criterion, seq), None)
            if woken:
                stats["wakeups"] += len(woken)
                work.extend(woken)


def make_causal_delivery(options: Mapping[str, Any]) -> CausalDelivery:
    """Build a causal delivery from factory options. Raises :class:`~ketten.errors.ConfigError`."""
    unknown = set(options) - {"criteria", "start", "heads", "max_held", "max_authors"}
    if unknown:
        raise ConfigError(f"unknown causal delivery options: {', '.join(sorted(unknown))}")
    raw: Iterable[bytes] | None = options.get("criteria")
    if raw is None:
        raise ConfigError("the causal delivery needs the option 'criteria' (the subscribed keys)")
    criteria = parse_criteria(raw)
    if not criteria:
        raise ConfigError("delivery option 'criteria' must name at least one criterion")
    start = parse_positions(options.get("start", {}), "start", allow_none=False)
    heads = {
        k: (-1 if v is None else v)
        for k, v in parse_positions(options.get("heads", {}), "heads", allow_none=True).items()
    }
    max_authors = options.get("max_authors", DEFAULT_MAX_AUTHORS)
    if type(max_authors) is not int or max_authors < 1:
        raise ConfigError(f"delivery option 'max_authors' must be a positive int, got {max_authors!r}")
    return CausalDelivery(
        criteria=criteria, start=start, heads=heads,
        max_held=parse_max_held(options), max_authors=max_authors,
    )


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"delivery": ["causal"]}


@hookimpl
def ketten_make_delivery(
    name: str, options: Mapping[str, Any], node: Node
) -> CausalDelivery | None:
    if name != "causal":
        return None
    return make_causal_delivery(options)
