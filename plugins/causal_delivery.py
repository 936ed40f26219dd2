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
criteria plus one step per wake-up: nothing ever rescans the queue. An
event's stamp is decoded once, when it becomes its chain's candidate.

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
from itertools import compress, count, islice, repeat
from operator import le
from typing import TYPE_CHECKING, Any

import attrs

from ketten import Event, Option, PluginSpec, hookimpl
from ketten.errors import ConfigError, DecodeError, UsageError

from ._clock_vector import DEFAULT_MAX_AUTHORS, VectorDecoder
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

_MAX_ABOVE = 1024
_ABOVE_ALL = 1 << 64
"""The counter of an unstamped event: above every counter, so it never precedes anything."""
_NOBODY = b""
"""An author no stamp names (keys are 32 bytes): ``need.get(_NOBODY, 0)`` is 0."""


def _as_tuple(criteria: Iterable[bytes]) -> tuple[bytes, ...]:
    return tuple(criteria)


class _Candidate:
    """The next undelivered event of a chain, with its decoded stamp."""

    __slots__ = ("author", "counter", "cursor", "event", "index", "need", "stored")

    def __init__(
        self, event: Event, need: dict[bytes, int], counter: int, index: int, stored: bool
    ) -> None:
        self.event = event
        self.author = event.author
        self.need = need
        """The stamp ``V`` with the own entry lowered by one: what must precede the event."""
        self.counter = counter
        """The author's own entry in the stamp; ``_ABOVE_ALL`` for an unstamped event."""
        self.index = index
        """Position of the event's criterion in the subscription."""
        self.cursor = 0
        """The criteria before this index are known to hold nothing the event needs."""
        self.stored = stored
        """Whether the event counts as held."""


@attrs.define(eq=False, on_setattr=attrs.setters.NO_OP)
class CausalDelivery:
    """A :class:`~ketten.interfaces.Delivery` in causal order over ``criteria``."""

    _criteria: tuple[bytes, ...] = attrs.field(alias="criteria", converter=_as_tuple)
    _start: Mapping[bytes, int | None] = attrs.field(factory=dict, alias="start")
    _heads: Mapping[bytes, int] = attrs.field(factory=dict, alias="heads")
    _max_held: int = attrs.field(default=DEFAULT_MAX_HELD, alias="max_held")
    _max_authors: int = attrs.field(default=DEFAULT_MAX_AUTHORS, alias="max_authors")
    _decode: VectorDecoder = attrs.field(init=False)
    _count: int = attrs.field(default=0, init=False)
    _index: dict[bytes, int] = attrs.field(factory=dict, init=False)
    # Per criterion index:
    _next: list[int] = attrs.field(factory=list, init=False)
    _head: list[int | None] = attrs.field(factory=list, init=False)
    """The highest seq known to exist (-1: the chain is empty), ``None`` if unknown."""
    _held: list[dict[int, Event]] = attrs.field(factory=list, init=False)
    """Events after the candidate, by seq."""
    _candidate: list[_Candidate | None] = attrs.field(factory=list, init=False)
    _last: list[_Candidate | None] = attrs.field(factory=list, init=False)
    """The last delivered stamped event."""
    # What the next undelivered event of each criterion is known as, for the
    # scan in ``_blocker``: criterion ``i`` needs a closer look for an event
    # needing ``need`` iff ``_dep_counter[i] <= need.get(_dep_author[i], 0)``.
    # A candidate: its author and own counter. No candidate: the last
    # delivered event's (clear unless that one happened before), or
    # (``_NOBODY``, 0) (always look), or (``_NOBODY``, ``_ABOVE_ALL``) once the
    # chain is delivered up to its head (never look). One more entry,
    # (``_NOBODY``, 0), ends every scan.
    _dep_author: list[bytes] = attrs.field(factory=list, init=False)
    _dep_counter: list[int] = attrs.field(factory=list, init=False)
    _dense: dict[bytes, int] = attrs.field(factory=dict, init=False)
    """Per author, the largest ``c`` such that its counters ``1..c`` are all delivered."""
    _above: dict[bytes, set[int]] = attrs.field(factory=dict, init=False)
    """Per author, delivered counters above its dense prefix."""
    _waiting: dict[int, list[_Candidate]] = attrs.field(factory=dict, init=False)
    """Candidates by the position they wait for, ``seq * count + criterion index``."""
    _held_count: int = attrs.field(default=0, init=False)
    _offered: int = attrs.field(default=0, init=False)
    _delivered: int = attrs.field(default=0, init=False)
    _duplicates: int = attrs.field(default=0, init=False)
    _conflicts: int = attrs.field(default=0, init=False)
    _peak_held: int = attrs.field(default=0, init=False)
    _refused: int = attrs.field(default=0, init=False)
    _wakeups: int = attrs.field(default=0, init=False)
    _unstamped: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        if not self._criteria:
            raise UsageError("a causal delivery needs at least one criterion")
        self._decode = VectorDecoder(max_authors=self._max_authors)
        self._count = len(self._criteria)
        for index, criterion in enumerate(self._criteria):
            self._index[criterion] = index
            self._next.append(self._start.get(criterion) or 0)
            self._head.append(self._heads.get(criterion))
            self._held.append({})
            self._candidate.append(None)
            self._last.append(None)
            self._dep_author.append(_NOBODY)
            self._dep_counter.append(0)
            self._refresh(index)
        self._dep_author.append(_NOBODY)
        self._dep_counter.append(0)

    # -- public API ----------------------------------------------------------

    def offer(self, event: Event) -> list[Event]:
        """Take a received event; return the events deliverable now, in order.

        Raises :class:`~ketten.errors.UsageError` for an event of a criterion
        that is not subscribed and :class:`HoldbackFull` when the event would
        have to wait and the queue is at its bound (the event is not taken).
        """
        index = self._index.get(event.criterion)
        if index is None:
            raise UsageError(
                f"criterion {event.criterion.hex()[:16]} is not one this queue delivers"
            )
        self._offered += 1
        seq = event.seq
        nxt = self._next[index]
        if seq < nxt:
            self._duplicates += 1
            return []
        head = self._head[index]
        raised = head is not None and seq > head
        if raised:
            self._head[index] = seq
        if seq != nxt:
            chain = self._held[index]
            other = chain.get(seq)
            if other is not None:
                self._count_duplicate(other, event)
                return []
            if self._held_count >= self._max_held:
                self._refused += 1
                raise HoldbackFull(event.criterion, seq, self._max_held)
            chain[seq] = event
            self._held_count += 1
            if self._held_count > self._peak_held:
                self._peak_held = self._held_count
            if raised and self._candidate[index] is None:
                self._refresh(index)
            return []
        waiting = self._candidate[index]
        if waiting is not None:
            self._count_duplicate(waiting.event, event)
            return []
        held = self._make_candidate(event, index, False)
        blocker = self._blocker(held)
        out: list[Event] = []
        if blocker is None:
            self._run([held], out)
            return out
        try:
            self._hold(event)
        except HoldbackFull:
            self._candidate[index] = None
            self._refresh(index)
            raise
        held.stored = True
        self._wait(blocker, held)
        woken = self._waiting.pop(seq * self._count + index, None)
        if woken:
            self._wakeups += len(woken)
            self._run(woken, out)
        return out

    def note_head(self, criterion: bytes, seq: int | None) -> list[Event]:
        """Record that the chain of ``criterion`` reaches ``seq`` (``None``: it is empty).

        Returns the events this releases, in order. Raises
        :class:`~ketten.errors.UsageError` for a criterion that is not
        subscribed or a negative seq.
        """
        index = self._index.get(criterion)
        if index is None:
            raise UsageError(f"criterion {criterion.hex()[:16]} is not one this queue delivers")
        if seq is None:
            seq = -1
        elif type(seq) is not int or seq < 0:
            raise UsageError(f"a head seq must be an int >= 0 or None, got {seq!r}")
        known = self._head[index]
        if known is None or seq > known:
            self._head[index] = known = seq
            if self._candidate[index] is None:
                self._refresh(index)
        out: list[Event] = []
        nxt = self._next[index]
        if nxt > known:
            woken = self._waiting.pop(nxt * self._count + index, None)
            if woken:
                self._wakeups += len(woken)
                self._run(woken, out)
        return out

    def forget_head(self, criterion: bytes) -> None:
        """The head noted for ``criterion`` may be out of date: count the chain as
        possibly holding more until :meth:`note_head` is called again. (A subscriber
        that cannot reach a chain's brokers calls this before it offers events that
        arrived later than the head it knew.)

        Raises :class:`~ketten.errors.UsageError` for a criterion not subscribed.
        """
        index = self._index.get(criterion)
        if index is None:
            raise UsageError(f"criterion {criterion.hex()[:16]} is not one this queue delivers")
        self._head[index] = None
        if self._candidate[index] is None:
            self._refresh(index)

    def pending(self) -> int:
        """How many events are held back."""
        return self._held_count

    def blocked(self) -> list[tuple[bytes, int]]:
        """The positions ``(criterion, seq)`` held events wait for, earliest seq first:
        each is the next undelivered event of its chain, not received yet."""
        positions = {divmod(key, self._count) for key in self._waiting}
        for index, held in enumerate(self._held):
            if held and self._candidate[index] is None:
                positions.add((self._next[index], index))
        return [(self._criteria[index], seq) for seq, index in sorted(positions)]

    def next_seq(self, criterion: bytes) -> int:
        """The seq the application receives next from ``criterion``.

        Raises :class:`~ketten.errors.UsageError` for a criterion not subscribed.
        """
        index = self._index.get(criterion)
        if index is None:
            raise UsageError(f"criterion {criterion.hex()[:16]} is not one this queue delivers")
        return self._next[index]

    def statistics(self) -> DeliveryStatistics:
        """A frozen snapshot of the counters."""
        return DeliveryStatistics(
            offered=self._offered,
            delivered=self._delivered,
            duplicates=self._duplicates,
            conflicts=self._conflicts,
            held=self._held_count,
            peak_held=self._peak_held,
            refused=self._refused,
            wakeups=self._wakeups,
            unstamped=self._unstamped,
        )

    # -- internals -------------------------------------------------------------

    def _count_duplicate(self, kept: Event, offered: Event) -> None:
        self._duplicates += 1
        if kept.hash != offered.hash:
            self._conflicts += 1

    def _hold(self, event: Event) -> None:
        """Count ``event`` as held, or raise :class:`HoldbackFull` at the bound."""
        if self._held_count >= self._max_held:
            self._refused += 1
            raise HoldbackFull(event.criterion, event.seq, self._max_held)
        self._held_count += 1
        if self._held_count > self._peak_held:
            self._peak_held = self._held_count

    def _make_candidate(self, event: Event, index: int, stored: bool) -> _Candidate:
        """Decode the stamp of the next event of criterion ``index`` and make it the candidate."""
        author = event.author
        try:
            need = self._decode(event.clock)
        except DecodeError:
            need = {}
        counter = need.get(author, 0)
        if counter:
            if counter == 1:
                del need[author]
            else:
                need[author] = counter - 1
        else:
            self._unstamped += 1
            need = {}
            counter = _ABOVE_ALL
        held = _Candidate(event, need, counter, index, stored)
        self._candidate[index] = held
        self._dep_author[index] = author
        self._dep_counter[index] = counter
        return held

    def _refresh(self, index: int) -> None:
        """Set what the scan knows about criterion ``index``, which has no candidate."""
        head = self._head[index]
        last = self._last[index]
        if head is not None and self._next[index] > head:
            self._dep_author[index] = _NOBODY
            self._dep_counter[index] = _ABOVE_ALL
        elif last is not None:
            self._dep_author[index] = last.author
            self._dep_counter[index] = last.counter
        else:
            self._dep_author[index] = _NOBODY
            self._dep_counter[index] = 0

    def _wait(self, slot: int, held: _Candidate) -> None:
        waiters = self._waiting.get(slot)
        if waiters is None:
            self._waiting[slot] = [held]
        else:
            waiters.append(held)

    def _blocker(self, held: _Candidate) -> int | None:
        """The position ``held`` (a candidate) must wait for, or ``None``."""
        need = held.need
        count_ = self._count
        if not need:
            held.cursor = count_
            return None
        authors = self._dep_author
        counters = self._dep_counter
        i = held.cursor
        while i < count_:
            # The first criterion from ``i`` on that needs a closer look.
            i = next(compress(
                count(i),
                map(le, islice(counters, i, None), map(need.get, islice(authors, i, None),
                                                       repeat(0))),
            ))
            if i == count_:
                break
            if self._candidate[i] is not None or self._may_hold_dependency(i, need):
                held.cursor = i
                return self._next[i] * count_ + i
            i += 1
        held.cursor = count_
        return None

    def _may_hold_dependency(self, index: int, need: dict[bytes, int]) -> bool:
        """Whether the undelivered, not yet received rest of criterion ``index``
        could hold an event that must precede an event needing ``need``."""
        last = self._last[index]
        if last is not None and last.counter > need.get(last.author, 0):
            return False
        head = self._head[index]
        if head is not None and self._next[index] > head:
            return False
        dense = self._dense
        if last is None:
            return any(counter > dense.get(author, 0) for author, counter in need.items())
        frontier, last_author, last_counter = last.need, last.author, last.counter
        for author, counter in need.items():
            if counter > dense.get(author, 0) and counter > (
                last_counter if author == last_author else frontier.get(author, 0)
            ):
                return True
        return False

    def _count_dense(self, author: bytes, counter: int) -> None:
        """Count the delivery of ``author``'s ``counter``, the one after its dense prefix."""
        higher = self._above.get(author)
        if higher is not None:
            while counter + 1 in higher:
                counter += 1
                higher.discard(counter)
            if not higher:
                del self._above[author]
        self._dense[author] = counter

    def _run(self, work: list[_Candidate], out: list[Event]) -> None:
        """Deliver every candidate in ``work`` that is free, and what that frees."""
        count_ = self._count
        waiting = self._waiting
        nexts = self._next
        chains = self._held
        candidates = self._candidate
        authors = self._dep_author
        counters = self._dep_counter
        lasts = self._last
        dense = self._dense
        above = self._above
        before = len(out)
        while work:
            held = work.pop()
            i = held.cursor
            if i != count_:
                # A woken candidate most often still waits for the criterion
                # it waited for: look at that one before scanning on.
                need = held.need
                if counters[i] <= need.get(authors[i], 0) and (
                    candidates[i] is not None or self._may_hold_dependency(i, need)
                ):
                    blocker: int | None = nexts[i] * count_ + i
                else:
                    held.cursor = i + 1
                    blocker = self._blocker(held)
                if blocker is not None:
                    waiters = waiting.get(blocker)
                    if waiters is None:
                        waiting[blocker] = [held]
                    else:
                        waiters.append(held)
                    continue
            event = held.event
            index = held.index
            seq = event.seq
            if held.stored:
                self._held_count -= 1
            out.append(event)
            nexts[index] = seq + 1
            counter = held.counter
            if counter != _ABOVE_ALL:
                lasts[index] = held
                author = held.author
                if counter == dense.get(author, 0) + 1:
                    self._count_dense(author, counter)
                else:
                    higher = above.get(author)
                    if higher is None:
                        above[author] = {counter}
                    else:
                        if len(higher) >= _MAX_ABOVE:
                            higher.clear()  # forgetting only makes the rule more cautious
                        higher.add(counter)
            following = chains[index].pop(seq + 1, None)
            if following is not None:
                work.append(self._make_candidate(following, index, True))
            else:
                candidates[index] = None
                self._refresh(index)
            woken = waiting.pop(seq * count_ + index, None)
            if woken:
                self._wakeups += len(woken)
                work.extend(woken)
        self._delivered += len(out) - before


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
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("delivery", "causal"):
        return None
    return PluginSpec({
        "criteria": Option("the subscribed keys (set by the node)", object),
        "start": Option("first seq per key (set by the node)", object),
        "heads": Option("the head seq known per key", object),
        "max_held": Option("events held back at most", int),
        "max_authors": Option("authors one stamp may name", int),
    }, clocks=("vector",))


@hookimpl
def ketten_make_delivery(
    name: str, options: Mapping[str, Any], node: Node
) -> CausalDelivery | None:
    if name != "causal":
        return None
    return make_causal_delivery(options)
