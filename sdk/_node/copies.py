"""``Copies``: the trio driver of :class:`~ketten._core.copies.CopyBudget`.

It hears of every append, learns which chains are reader copies (not
replicated here), and when they hold more than the budget allows it drops
the least recently used ones from the store, each under its chain's lock and
only after checking again that the copy is not needed. Pins
(:meth:`pin`) are kept durably in store cursors (``ketten/pin/<key>``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import attrs
import trio

from .._core.copies import CopyBudget
from .._core.event import Event
from ..errors import StoreError
from ..logs import RateLimitedLog
from .local_chains import LocalChains

__all__ = ["PIN_PREFIX", "Copies", "CopyStatistics"]

PIN_PREFIX = "ketten/pin/"
_PINNED, _UNPINNED = b"\x01", b""
_log = RateLimitedLog(logging.getLogger("ketten.store"))


@attrs.frozen
class CopyStatistics:
    """Reader copies of this node (chains it holds but does not replicate)."""

    copies: int
    """Reader copies held."""
    copy_events: int
    """Events in them."""
    copies_dropped: int
    """Copies given up to stay within ``copies_events``."""
    copy_events_dropped: int
    pinned: int


@attrs.define(eq=False, repr=False)
class Copies:
    """Keeps this node's reader copies within their budget."""

    chains: LocalChains
    budget: CopyBudget
    needed: Callable[[bytes], bool]
    """Is the chain needed here for another reason (replicated, being created,
    subscribed)?"""
    _pins: set[bytes] = attrs.field(factory=set, init=False)
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _counts: dict[str, int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._counts = {"copies_dropped": 0, "copy_events_dropped": 0}
        self.chains.on_appended(self._appended)
        self.chains.on_orphaned(self._orphaned)

    def statistics(self) -> CopyStatistics:
        return CopyStatistics(copies=len(self.budget), copy_events=self.budget.total,
                              pinned=len(self._pins), **self._counts)

    def _appended(self, events: Sequence[Event]) -> None:
        last: dict[bytes, Event] = {}
        for event in events:
            last[event.criterion] = event
        for criterion, event in last.items():
            self.note(criterion, event.seq + 1)

    def _orphaned(self, criterion: bytes, orphans: Sequence[Event], head: Event | None) -> None:
        self.note(criterion, 0 if head is None else head.seq + 1)

    def note(self, criterion: bytes, events: int) -> None:
        """``criterion`` holds ``events`` events here; count it if it is a reader's copy
        (also one that became so without an append: this node stopped replicating it)."""
        if events == 0 or self.chains.replicated(criterion):
            self.budget.forget(criterion)
        elif self.budget.note(criterion, events):
            self._wake.set()

    def _keep(self, criterion: bytes) -> bool:
        return criterion in self._pins or self.needed(criterion)

    @contextmanager
    def using(self, criterion: bytes) -> Iterator[None]:
        """Keep the copy of ``criterion`` while the block runs (a read of it)."""
        self.budget.use(criterion)
        try:
            yield
        finally:
            self.budget.done(criterion)
            if self.budget.over():
                self._wake.set()  # it may have been passed over while in use

    async def load(self) -> None:
        """Learn the copies and pins in the store (at start)."""
        self._pins = pins_of(await self.chains.store.cursors(PIN_PREFIX))
        for criterion, (seq, _) in sorted((await self.chains.store.heads()).items()):
            self.note(criterion, seq + 1)

    async def pin(self, criterion: bytes, pinned: bool = True) -> None:
        """Keep (or stop keeping) the copy of ``criterion`` whatever the budget says."""
        await self.chains.store.put_cursor(PIN_PREFIX + criterion.hex(),
                                           _PINNED if pinned else _UNPINNED)
        if pinned:
            self._pins.add(criterion)
        else:
            self._pins.discard(criterion)
            self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Learn the copies in the store, then drop surplus ones whenever the budget is
        exceeded, until cancelled (start it once the replication state is loaded)."""
        await self.load()
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await self.collect()

    async def collect(self) -> int:
        """Drop copies until the rest fit the budget; return how many went."""
        dropped = 0
        for criterion in self.budget.surplus(self._keep):
            async with self.chains.lock(criterion):  # checked again: it may be needed now
                if not self.budget.droppable(criterion, self._keep):
                    continue
                try:
                    removed = await self.chains.drop(criterion)
                except StoreError as exc:
                    _log.warning("copy_drop_failed", "dropping the copy of %s failed: %s",
                                 criterion.hex()[:16], exc, key="copy_drop_failed")
                    continue
                except Exception as exc:  # a store plugin's bug: the copy stays, the node runs
                    _log.warning("copy_drop_failed", "dropping the copy of %s failed (a bug "
                                 "of the store): %s: %s", criterion.hex()[:16],
                                 type(exc).__name__, exc, key="copy_drop_bug", exc_info=True)
                    continue
                self.budget.forget(criterion)
                self._counts["copies_dropped"] += 1
                self._counts["copy_events_dropped"] += removed
                dropped += 1
        return dropped


def pins_of(cursors: Mapping[str, bytes]) -> set[bytes]:
    """The pinned chains among the store cursors under :data:`PIN_PREFIX`."""
    pins = set()
    for name, value in cursors.items():
        try:
            key = bytes.fromhex(name[len(PIN_PREFIX):])
        except ValueError:
            continue
        if len(key) == 32 and value == _PINNED:
            pins.add(key)
    return pins
