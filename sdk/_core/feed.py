"""A subscription's receiving end, sans-IO: what is committed, what to fetch, what to offer.

Brokers report commit positions (with every lease renewal) and notify
committed events. :class:`FeedState` keeps, per criterion, the commit
positions each broker reported, the next seq to hand to the delivery
plugin, and whether the local copy must catch up. It decides from facts
the driver reads (the local head, the local hashes at reported positions);
it never touches the network or the store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from .event import Event
from .membership import Pos

__all__ = ["FeedState", "Placement", "Window"]


class Placement:
    STORE = "store"
    """The event extends the local chain: store it."""
    SYNC = "sync"
    """It is ahead of the local chain: catch up first."""
    KNOWN = "known"
    """The local chain already holds this position."""


@attrs.frozen
class Window:
    """What one pass hands the delivery plugin of one criterion (see
    :meth:`FeedState.window`)."""

    drop_before: int | None
    """Give up the seqs from the next one up to this one (exclusive): the buffer
    cannot hold every committed event and the subscription drops the oldest."""
    first: int
    last: int
    """Offer seqs ``first`` to ``last`` (nothing if ``last < first``)."""
    more: bool
    """Committed events beyond ``last`` wait for a later pass."""


@attrs.define(eq=False)
class FeedState:
    """Positions and reports of one subscription over ``keys``."""

    keys: tuple[bytes, ...]
    start: Mapping[bytes, int]
    patience: float = float("inf")
    """Seconds held events may wait with nothing delivered before the application hears."""
    _next: dict[bytes, int] = attrs.field(init=False)
    _reports: dict[bytes, dict[bytes, Pos]] = attrs.field(factory=dict, init=False)
    _sync: set[bytes] = attrs.field(factory=set, init=False)
    _look: set[bytes] = attrs.field(init=False)
    _since: float | None = attrs.field(default=None, init=False)
    _empty: dict[bytes, set[bytes]] = attrs.field(factory=dict, init=False)
    """Per criterion, the brokers whose latest report said nothing is committed."""
    _round: int = attrs.field(default=0, init=False)
    _reported: dict[bytes, int] = attrs.field(factory=dict, init=False)
    """Per criterion, the latest round a report came from."""
    _asked: float = attrs.field(default=float("-inf"), init=False)

    def __attrs_post_init__(self) -> None:
        self._next = {key: self.start.get(key, 0) for key in self.keys}
        self._look = set(self.keys)

    def progressed(self, now: float) -> None:
        """Events reached the application (or it was told of a stall): patience restarts."""
        self._since = now

    def give_up_at(self, now: float, holding: bool) -> float | None:
        """When to tell the application that held events wait in vain (``None``: nothing
        is held). Patience runs from the later of the last delivery and the moment
        events began to be held."""
        if not holding:
            self._since = None
            return None
        if self._since is None:
            self._since = now
        return self._since + self.patience

    def next_seq(self, key: bytes) -> int:
        return self._next[key]

    def offered(self, key: bytes, seq: int) -> None:
        """Events up to ``seq`` were handed to the delivery plugin."""
        if seq + 1 > self._next[key]:
            self._next[key] = seq + 1

    def skip_to(self, key: bytes, seq: int) -> None:
        """Events of ``key`` before ``seq`` are given up: never offered."""
        if seq > self._next[key]:
            self._next[key] = seq

    def window(self, key: bytes, confirmed: int | None, room: int, *, drop: bool,
               limit: int | None = None) -> Window:
        """Which committed events of ``key`` to offer now: those up to ``confirmed``
        (the highest seq known committed on the local chain) and ``limit``, no more
        than ``room`` (what the application's buffer still holds; it takes events at
        its own pace, so the rest waits for a later pass). With ``drop`` the oldest
        events beyond the room are given up instead of waiting."""
        first = self._next[key]
        if confirmed is None or confirmed < first:
            return Window(None, first, first - 1, False)
        drop_before = None
        if drop and 0 < room < confirmed - first + 1:
            drop_before = first = confirmed - room + 1
        last = min(confirmed, first + room - 1, confirmed if limit is None else limit)
        return Window(drop_before, first, last, last < confirmed)

    def look(self, key: bytes | None = None) -> None:
        """Look at ``key`` (default: every criterion) on the next pass."""
        if key is None:
            self._look.update(self.keys)
        else:
            self._look.add(key)

    def take_looks(self) -> list[bytes]:
        keys = [k for k in self.keys if k in self._look]
        self._look.clear()
        return keys

    def begin_round(self) -> int:
        """Number a round of reports: only reports asked for in it carry the number."""
        self._round += 1
        return self._round

    def reported_in(self, key: bytes, round_: int) -> bool:
        """Did a broker of ``key`` answer in round ``round_`` (or a later one)?"""
        return self._reported.get(key, 0) >= round_

    def note_commit(self, key: bytes, broker: bytes, pos: Pos | None, round_: int = 0) -> None:
        """``broker`` reported ``pos`` committed (``None``: nothing committed yet), when
        asked in round ``round_`` (0: not asked, a notification)."""
        if round_ > self._reported.get(key, 0):
            self._reported[key] = round_
        if pos is None:
            if broker not in self._reports.get(key, {}):
                self._empty.setdefault(key, set()).add(broker)
                self._look.add(key)
            return
        self._empty.get(key, set()).discard(broker)
        reports = self._reports.setdefault(key, {})
        known = reports.get(broker)
        if known is None or pos[0] >= known[0]:
            reports[broker] = pos
        self._look.add(key)

    def ask_round(self, now: float, *, behind: bool, holding: bool,
                  every: float = 1.0) -> bool:
        """Should a causal delivery ask the brokers for a round of reports now? When
        committed events wait to be offered (``behind``), and at most every ``every``
        seconds while the delivery plugin holds events back."""
        if not behind and not (holding and now - self._asked >= every):
            return False
        self._asked = now
        return True

    def head_known(self, key: bytes, round_: int | None, confirmed: int | None) -> bool:
        """May a causal delivery take ``confirmed`` (``None``: nothing confirmed) as
        ``key``'s head? Only when a broker reported in round ``round_`` and either a
        commit is confirmed here or the chain is known to be empty."""
        return (round_ is not None and self.reported_in(key, round_)
                and (confirmed is not None or self.known_empty(key)))

    def known_empty(self, key: bytes) -> bool:
        """Did a broker say the chain has nothing committed, and none that it has?
        (No report at all tells nothing: the chain may hold events nobody could
        report, and a causal delivery must not take it for empty.)"""
        return bool(self._empty.get(key)) and not self._reports.get(key)

    def place(self, event: Event, head: Pos | None) -> str:
        """Where a notified (committed) event stands against the local head."""
        if head is None:
            return Placement.STORE if event.seq == 0 else Placement.SYNC
        if event.seq <= head[0]:
            return Placement.KNOWN
        if event.seq == head[0] + 1 and event.prev == head[1]:
            return Placement.STORE
        return Placement.SYNC

    def need_sync(self, key: bytes) -> None:
        self._sync.add(key)
        self._look.add(key)

    def take_sync(self, key: bytes) -> bool:
        if key in self._sync:
            self._sync.discard(key)
            return True
        return False

    def wanted(self, key: bytes) -> list[int]:
        """The seqs whose local hashes :meth:`confirmed` needs."""
        return sorted({pos[0] for pos in self._reports.get(key, {}).values()})

    def confirmed(self, key: bytes, head: Pos | None, hashes: Mapping[int, bytes],
                  own: Pos | None = None) -> tuple[int | None, bool]:
        """The highest seq known committed *on the local chain*, and whether some
        broker reported a commit the local chain does not hold yet (catch up).

        ``hashes`` are the local hashes at :meth:`wanted`; ``own`` a commit
        this node knows itself (it is a broker of the chain).
        """
        best: int | None = None
        behind = False
        head_seq = -1 if head is None else head[0]
        candidates: list[Pos] = list(self._reports.get(key, {}).values())
        if own is not None:
            candidates.append(own)
        for seq, value in candidates:
            if seq > head_seq:
                behind = True
                continue
            if hashes.get(seq) == value and (best is None or seq > best):
                best = seq
        return best, behind

    def reports(self, key: bytes) -> Sequence[tuple[bytes, Pos]]:
        return sorted(self._reports.get(key, {}).items(), key=lambda item: -item[1][0])
