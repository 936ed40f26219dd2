"""``LocalChains``: this node's chains over its store.

One lock per chain (every change of a chain happens under it), caches of
heads and writer policies, appends that arrive while the store is writing
sharing its next transaction (group commit), verification of received
runs of events, cutting a chain back (the cut events become orphans),
dropping a copy that is not needed, and
the durable replication state of each chain (a store cursor
``ketten/chain/<key>``). Observers hear of appended and orphaned events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial

import attrs
import trio

from .._core.chain import Verify, WriterPolicy, check_run
from .._core.event import Event, is_verified
from .._core.membership import ChainState, Pos
from .._core.messages import MAX_EVENTS
from .._core.verified import VerifiedSignatures
from ..errors import (
    DecodeError,
    InvalidEvent,
    KettenError,
    StoreConflict,
    StoreCorrupted,
    StoreError,
)
from ..interfaces import Store

__all__ = ["STATE_PREFIX", "GroupCommit", "LocalChains"]

STATE_PREFIX = "ketten/chain/"
_MAX_CACHED = 1 << 16
_PAGE = 256
_THREADED_RUN = 64
"""Runs at least this long have their signatures checked on worker threads (when the
node has any): below it, handing the work over costs more than it saves."""

Appended = Callable[[Sequence[Event]], None]
Orphaned = Callable[[bytes, Sequence[Event], Event | None], None]


def _mark_verified(events: Sequence[Event]) -> None:
    """Check each signature (on a worker thread); a bad one is left for ``check_run``."""
    for event in events:
        try:
            event.verify()
        except InvalidEvent:
            pass


@attrs.define(eq=False)
class _Slot:
    done: trio.Event = attrs.field(factory=trio.Event)
    error: BaseException | None = None
    lead: bool = False


@attrs.define(eq=False, repr=False)
class GroupCommit:
    """Runs of events that arrive while the store is writing share its next transaction.

    A durable store pays one sync per transaction; with many chains written
    at once, one transaction per run would cap throughput at the disk's sync
    rate. Callers hold their chain's lock, so a batch never holds two runs of
    one chain; if the batch is refused, its runs are retried one by one so
    that each caller gets its own answer. ``committed`` hears of every run
    written, whether or not its caller still waits. A caller cancelled while
    its run waits takes it out; once a transaction holds it, it is written.
    """

    store: Store
    committed: Callable[[list[Event]], None]
    _queue: list[tuple[list[Event], _Slot]] = attrs.field(factory=list, init=False)
    _busy: bool = attrs.field(default=False, init=False)

    async def append(self, events: list[Event]) -> None:
        """Append ``events`` (one chain) durably. Raises what :meth:`Store.append` raises."""
        slot = _Slot()
        entry = (events, slot)
        self._queue.append(entry)
        if self._busy:
            try:
                await slot.done.wait()
            except trio.Cancelled:
                if entry in self._queue:
                    self._queue.remove(entry)
                    if slot.lead:
                        self._hand_over()
                raise
            if not slot.lead:
                if slot.error is not None:
                    raise slot.error
                return
        self._busy = True
        try:
            batch, self._queue = self._queue, []
            with trio.CancelScope(shield=True):
                await self._write(batch)
        finally:
            self._hand_over()
        if slot.error is not None:
            raise slot.error

    def _hand_over(self) -> None:
        if self._queue:
            successor = self._queue[0][1]
            successor.lead = True
            successor.done.set()
        else:
            self._busy = False

    async def _write(self, batch: list[tuple[list[Event], _Slot]]) -> None:
        for _, slot in batch:
            slot.lead = False
        try:
            try:
                await self.store.append([e for run, _ in batch for e in run])
            except StoreError as exc:
                if len(batch) == 1:
                    batch[0][1].error = exc
                else:
                    for run, slot in batch:
                        try:
                            await self.store.append(run)
                        except StoreError as single:
                            slot.error = single
            written = [e for run, slot in batch if slot.error is None for e in run]
            if written:
                self.committed(written)
        except BaseException as exc:
            for _, slot in batch:
                if slot.error is None:
                    slot.error = exc
            raise
        finally:
            for _, slot in batch:
                slot.done.set()


@attrs.define(eq=False)
class _Lock:
    lock: trio.Lock = attrs.field(factory=trio.Lock)
    users: int = 0


@attrs.define(eq=False)
class _Held:
    """``async with`` one chain's lock (a class, not a generator: it is taken for every
    append and ack)."""

    locks: dict[bytes, _Lock]
    criterion: bytes
    entry: _Lock | None = None

    async def __aenter__(self) -> None:
        entry = self.locks.get(self.criterion)
        if entry is None:
            entry = self.locks[self.criterion] = _Lock()
        entry.users += 1
        try:
            entry.lock.acquire_nowait()  # the usual case: no scheduler round trip
        except trio.WouldBlock:
            try:
                await entry.lock.acquire()
            except BaseException:
                self._leave(entry)
                raise
        self.entry = entry

    async def __aexit__(self, *exc: object) -> None:
        entry = self.entry
        assert entry is not None
        self.entry = None
        entry.lock.release()
        self._leave(entry)

    def _leave(self, entry: _Lock) -> None:
        entry.users -= 1
        if entry.users == 0 and self.locks.get(self.criterion) is entry:
            del self.locks[self.criterion]


@attrs.frozen
class LocalStatistics:
    events_appended: int
    events_orphaned: int
    events_dropped: int
    invalid_events: int
    state_writes: int
    signatures_recalled: int
    """Events received again whose signature had verified here lately (not checked twice)."""


@attrs.define(eq=False, repr=False)
class LocalChains:
    """The chains of one node's store, with the rules every change goes through."""

    store: Store
    max_event_size: int
    replicated: Callable[[bytes], bool] = lambda criterion: False
    """Is this chain replicated here? Then only its leader's appends change it."""
    verify_threads: int = 0
    """Worker threads that check the signatures of long runs (0: on the event loop).
    Ed25519 checks release the GIL, so they use the other cores."""
    _locks: dict[bytes, _Lock] = attrs.field(factory=dict, init=False)
    _heads: dict[bytes, Event | None] = attrs.field(factory=dict, init=False)
    _policies: dict[bytes, WriterPolicy] = attrs.field(factory=dict, init=False)
    _group: GroupCommit = attrs.field(init=False)
    _appended: list[Appended] = attrs.field(factory=list, init=False)
    _orphaned: list[Orphaned] = attrs.field(factory=list, init=False)
    _dropped: list[Callable[[bytes], None]] = attrs.field(factory=list, init=False)
    _verified: VerifiedSignatures = attrs.field(factory=VerifiedSignatures, init=False)
    _counts: dict[str, int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._group = GroupCommit(self.store, self._written)
        self._counts = dict.fromkeys(attrs.fields_dict(LocalStatistics), 0)

    def statistics(self) -> LocalStatistics:
        return LocalStatistics(**self._counts)

    def on_appended(self, observer: Appended) -> None:
        """Call ``observer(events)`` after events were durably appended (any chains)."""
        self._appended.append(observer)

    def on_orphaned(self, observer: Orphaned) -> None:
        """Call ``observer(criterion, orphans, new head)`` after a chain was cut back."""
        self._orphaned.append(observer)

    def on_dropped(self, observer: Callable[[bytes], None]) -> None:
        """Call ``observer(criterion)`` after a whole copy was dropped (:meth:`drop`)."""
        self._dropped.append(observer)

    def count_invalid(self, count: int = 1) -> None:
        self._counts["invalid_events"] += count

    # -- locking -------------------------------------------------------------------

    def lock(self, criterion: bytes) -> _Held:
        """Hold the chain's lock: every change of the chain happens under it."""
        return _Held(self._locks, criterion)

    # -- reading -------------------------------------------------------------------

    async def head(self, criterion: bytes) -> Event | None:
        if criterion in self._heads:
            return self._heads[criterion]
        head = await self.store.head(criterion)
        if len(self._heads) >= _MAX_CACHED:
            self._heads.clear()
        self._heads[criterion] = head
        return head

    async def head_pos(self, criterion: bytes) -> Pos | None:
        head = await self.head(criterion)
        return None if head is None else (head.seq, head.hash)

    def forget(self, criterion: bytes) -> None:
        """Drop cached facts of a chain (after a failed write)."""
        self._heads.pop(criterion, None)
        self._policies.pop(criterion, None)

    async def event_at(self, criterion: bytes, seq: int) -> Event | None:
        if seq < 0:
            return None
        head = await self.head(criterion)
        if head is not None and head.seq == seq:
            return head
        found = await self.store.range(criterion, seq, seq + 1)
        return found[0] if found else None

    async def hash_at(self, criterion: bytes, seq: int) -> bytes | None:
        event = await self.event_at(criterion, seq)
        return None if event is None else event.hash

    async def hashes(self, criterion: bytes, seqs: Iterable[int]) -> dict[int, bytes]:
        """Our hashes at ``seqs`` (those we hold)."""
        wanted = sorted({s for s in seqs if s >= 0})
        if not wanted:
            return {}
        head = await self.head(criterion)
        if head is None:
            return {}
        out: dict[int, bytes] = {}
        if wanted == [head.seq]:
            return {head.seq: head.hash}
        low, high = wanted[0], min(wanted[-1], head.seq)
        if high - low < 1024:
            for event in await self.store.range(criterion, low, high + 1):
                out[event.seq] = event.hash
            return {s: out[s] for s in wanted if s in out}
        for seq in wanted:
            value = await self.hash_at(criterion, seq)
            if value is not None:
                out[seq] = value
        return out

    async def range(self, criterion: bytes, start: int, stop: int | None = None) -> list[Event]:
        return await self.store.range(criterion, max(start, 0), stop)

    async def read_batch(self, criterion: bytes, start: int, budget: int,
                         stop: int | None = None) -> tuple[list[bytes], bool]:
        """Encoded events from ``start`` (to ``stop``, exclusive), at most ``budget`` bytes
        and :data:`~ketten._core.messages.MAX_EVENTS` events (what one message may
        carry) but at least one event; and whether more follow."""
        out: list[bytes] = []
        used = 0
        seq = max(start, 0)
        while stop is None or seq < stop:
            end = seq + _PAGE if stop is None else min(seq + _PAGE, stop)
            page = await self.store.range(criterion, seq, end)
            for event in page:
                raw = event.to_bytes()
                if out and (used + len(raw) > budget or len(out) >= MAX_EVENTS):
                    return out, True
                out.append(raw)
                used += len(raw)
            if len(page) < end - seq:
                return out, False
            seq = end
        return out, False

    async def policy(self, criterion: bytes) -> WriterPolicy | None:
        """The writer policy of a stored chain, or ``None`` if it has no genesis."""
        policy = self._policies.get(criterion)
        if policy is None:
            first = await self.store.range(criterion, 0, 1)
            if not first:
                return None
            if len(self._policies) >= _MAX_CACHED:
                self._policies.clear()
            policy = self._policies[criterion] = WriterPolicy.of(first[0])
        return policy

    def decode(self, raw: bytes, criterion: bytes, *, where: str) -> Event:
        """An event from a peer, structure-checked and of the right chain."""
        try:
            event = Event.from_bytes(raw, max_size=self.max_event_size)
        except DecodeError as exc:
            raise DecodeError(str(exc), where=where) from None
        if event.criterion != criterion:
            raise DecodeError("an event of another chain", where=where)
        return event

    async def verify_run(self, criterion: bytes, prev: Pos | Event | None,
                         events: Sequence[Event], *, signatures: bool = True) -> None:
        """Check that ``events`` follow ``prev`` and each other, are signed by allowed writers.

        Raises :class:`~ketten.errors.InvalidEvent` naming the seq.
        """
        if not events:
            return
        # The policy is read only when the run does not start with the genesis.
        policy = None if events[0].seq == 0 else await self.policy(criterion) or WriterPolicy()
        threaded = self._recall_signatures(events) if signatures else []
        if threaded:
            await self._check_signatures(threaded)
        try:
            check_run(criterion, prev, events, policy=policy,
                      verify=Verify.FULL if signatures else Verify.LINKS)
        except InvalidEvent:
            self._counts["invalid_events"] += 1
            raise
        self._verified.remember(events)

    def _recall_signatures(self, events: Sequence[Event]) -> list[Event]:
        """Mark the events whose signatures verified here lately; return the rest if
        they are worth checking on worker threads (else none: ``check_run`` does)."""
        known = self._verified.recall(events)
        self._counts["signatures_recalled"] += known
        if self.verify_threads == 0 or len(events) - known < _THREADED_RUN:
            return []
        return [e for e in events if not is_verified(e)]

    async def _check_signatures(self, events: Sequence[Event]) -> None:
        """Check the signatures of ``events`` on worker threads, marking those that
        verify; ``check_run`` then checks the rest of the rules in order and reports the
        first bad event exactly as without threads."""
        parts = min(self.verify_threads, len(events) // (_THREADED_RUN // 2))
        size = -(-len(events) // parts)
        async with trio.open_nursery() as nursery:
            for start in range(0, len(events), size):
                nursery.start_soon(partial(trio.to_thread.run_sync, _mark_verified,
                                           events[start:start + size]))

    # -- writing -------------------------------------------------------------------

    def _written(self, events: list[Event]) -> None:
        self._counts["events_appended"] += len(events)
        heads = self._heads
        for event in events:
            if len(heads) >= _MAX_CACHED:
                heads.clear()
            heads[event.criterion] = event
        for observer in self._appended:
            observer(events)

    async def append(self, events: Sequence[Event]) -> None:
        """Append a verified run of one chain (the caller holds its lock).

        Raises :class:`~ketten.errors.StoreConflict` if it does not extend the head.
        """
        if not events:
            return
        try:
            await self._group.append(list(events))
        except StoreError:
            self.forget(events[0].criterion)
            raise

    async def cut(self, criterion: bytes, seq: int, events: Sequence[Event] = (), *,
                  force: bool = False) -> list[Event]:
        """Cut the chain from ``seq`` on and append ``events`` in its place (atomic).

        The cut events become orphans; observers hear of them. The caller
        holds the chain's lock and has verified ``events``. (``force`` is
        only documentation at the call site: the one case that gives up
        committed events, a criterion started twice.)
        """
        with trio.CancelScope(shield=True):
            try:
                orphans = await self.store.replace_from(criterion, seq, list(events))
            except StoreError:
                self.forget(criterion)
                raise
        self._heads.pop(criterion, None)
        if seq == 0:
            self._policies.pop(criterion, None)
        self._counts["events_orphaned"] += len(orphans)
        if events:
            self._written(list(events))
        head = events[-1] if events else await self.head(criterion)
        if orphans:
            for observer in self._orphaned:
                observer(criterion, orphans, head)
        return orphans

    async def drop(self, criterion: bytes) -> int:
        """Remove the whole copy of ``criterion`` from the store (the caller holds the
        chain's lock and knows the copy is not needed); return how many events went.
        Observers (:meth:`on_dropped`) hear of it. Raises
        :class:`~ketten.errors.StoreError`."""
        try:
            removed = await self.store.drop(criterion)
        finally:
            self.forget(criterion)
        self._counts["events_dropped"] += removed
        for observer in self._dropped:
            observer(criterion)
        return removed

    async def accept_committed(self, criterion: bytes, events: Sequence[Event]) -> int:
        """Append committed events received from a peer where they extend our head.

        Verifies them first. Returns how many were added (0 when they do not
        extend the head, someone else wrote meanwhile, or the chain is
        replicated here: then its leader alone changes it). Raises
        :class:`~ketten.errors.InvalidEvent`.
        """
        if not events or self.replicated(criterion):
            return 0
        async with self.lock(criterion):
            if self.replicated(criterion):
                return 0
            head = await self.head(criterion)
            fresh = [e for e in events if head is None or e.seq > head.seq]
            if not fresh:
                return 0
            start = fresh[0]
            if (head is None and start.seq != 0) or (
                    head is not None and (start.seq != head.seq + 1 or start.prev != head.hash)):
                return 0
            await self.verify_run(criterion, head, fresh)
            try:
                await self.append(fresh)
            except StoreConflict:
                return 0
            return len(fresh)

    # -- replication state ---------------------------------------------------------

    async def state(self, criterion: bytes) -> ChainState | None:
        """The chain's durable replication state, or ``None`` if it has none.

        Raises :class:`~ketten.errors.StoreCorrupted` if it is damaged.
        """
        raw = await self.store.get_cursor(STATE_PREFIX + criterion.hex())
        if raw is None:
            return None
        try:
            return ChainState.decode(raw, where=f"state of chain {criterion.hex()[:16]}")
        except DecodeError as exc:
            raise StoreCorrupted(str(exc), criterion=criterion) from None

    async def save_state(self, criterion: bytes, state: ChainState) -> None:
        """Store the chain's replication state durably (before anything depends on it)."""
        with trio.CancelScope(shield=True):
            await self.store.put_cursor(STATE_PREFIX + criterion.hex(), state.encode())
        self._counts["state_writes"] += 1

    async def states(self) -> dict[bytes, ChainState]:
        """Every chain with replication state here (damaged entries are skipped)."""
        out: dict[bytes, ChainState] = {}
        found: Mapping[str, bytes] = await self.store.cursors(STATE_PREFIX)
        for name, raw in found.items():
            try:
                key = bytes.fromhex(name[len(STATE_PREFIX):])
                if len(key) != 32:
                    continue
                out[key] = ChainState.decode(raw)
            except (ValueError, KettenError):
                continue
        return out
