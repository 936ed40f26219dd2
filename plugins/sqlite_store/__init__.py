"""The ``sqlite`` store: the embedded default, one SQLite database per node.

Options (``NodeConfig.options["store"]``):

``path``
    The node's store directory (created if missing); the database is
    ``<path>/ketten.sqlite3``.
``check_on_open``
    Run SQLite's ``quick_check`` of the whole file when opening (default
    ``True``): damaged pages are then found before anything is served; and
    check each chain's row against its events, repairing a row that differs
    and quarantining a chain from the first seq missing below its head
    (:mod:`ketten.plugins.sqlite_store._heads`).
``inline_limit``
    Seconds (default ``0.005``; ``0`` turns it off). A transaction of small
    writes (appends and cursors, up to 64 rows) runs them on the event loop's
    thread: they touch cached pages only, and a hand-off to a worker thread and back
    costs more CPU than they do. Its commit, where the sync happens, runs
    there too while the median of the last 16 such transactions stays
    under this limit (single ones may take longer); once it is over, commits
    go to the worker thread for 5 seconds, so a disk that syncs slowly
    stalls the event loop for at most eight commits every 5 seconds
    (:mod:`ketten.plugins.sqlite_store._inline`).

The database runs in WAL mode with ``synchronous=FULL``: a transaction is on
disk before its commit returns, so an append is durable when it returns.
Blocking calls run in worker threads (:func:`trio.to_thread.run_sync`),
except small writes (``inline_limit``). One connection writes: writes that
arrive while a transaction is running are queued and all run in the next
one, each in its own savepoint, so one thread hand-off and one sync serve
them all and each commits whole or not at all.
A few read connections serve reads in parallel, and offline tools read
through :class:`SqliteReader` (the ``ketten_open_store_reader`` hook) while
a node writes.

Heads, the last events of each chain and chains' command indexes are kept
in memory (:mod:`ketten.plugins.sqlite_store._cache`), changed only after a
commit, so ``head``, ``heads``, ``range`` near the head and most
``by_command`` calls need no thread at all; a read from disk returns only
once memory holds every commit its snapshot saw. Every event read is checked against its stored hash and position;
damaged records raise :class:`~ketten.errors.StoreCorrupted` naming the file
and offset, and :meth:`SqliteStore.quarantine` cuts a damaged chain back so
the node can fetch the range again from its peers.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from ketten import Event, Option, PluginSpec, hookimpl
from ketten.errors import ConfigError, StoreConflict, StoreError, StoreFormatError
from ketten.logs import RateLimitedLog

from .._store_records import DirLock, store_path
from ._access import (
    MAX_SEQ,
    decode_checked,
    iter_main,
    iter_main_unchecked,
    iter_orphans,
    read_main,
)
from ._cache import ChainCache
from ._heads import HeadRepair, reconcile_heads
from ._inline import InlineCommits
from ._schema import DB_NAME, check_existing, corrupted, migrate, owns_directory

_events = RateLimitedLog(logging.getLogger("ketten.store"))

if TYPE_CHECKING:
    from ketten import Node

__all__ = ["SqliteReader", "SqliteStore"]

T = TypeVar("T")

_READERS = 3
_INLINE_ROWS = 64
"""Most rows a transaction may write to run on the event loop's thread."""

_INSERT = (
    "INSERT INTO events (criterion, seq, hash, author, command, raw) VALUES (?, ?, ?, ?, ?, ?)"
)
_SET_HEAD = (
    "INSERT INTO chains (criterion, head_seq, head_hash) VALUES (?, ?, ?)"
    " ON CONFLICT(criterion) DO UPDATE SET head_seq = excluded.head_seq,"
    " head_hash = excluded.head_hash"
)


def _short(key: bytes) -> str:
    return key.hex()[:16]


def _rows(events: Sequence[Event]) -> list[tuple[bytes, int, bytes, bytes, int | None, bytes]]:
    return [(e.criterion, e.seq, e.hash, e.author, e.command, e.to_bytes()) for e in events]


def _connect(db_path: str, *, read_only: bool) -> sqlite3.Connection:
    if read_only:
        uri = "file:" + urllib.parse.quote(db_path) + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    else:
        conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 10000")
    return conn


Heads = Callable[[bytes], "tuple[int, bytes] | None"]
Changes = dict[bytes, "tuple[int, bytes] | None"]
Effect = Callable[[ChainCache], None]
Body = Callable[[sqlite3.Connection, Heads, Changes], "tuple[Any, Effect | None]"]


@attrs.define(eq=False)
class _WriteOp:
    """One write waiting for, or done in, a shared transaction."""

    body: Body
    done: trio.Event = attrs.field(factory=trio.Event)
    result: Any = None
    error: BaseException | None = None
    effect: Effect | None = None
    lead: bool = False
    rows: int = 0
    """Rows ``body`` adds or replaces, for a plain append of events or a cursor (0: any
    other write, never run inline)."""

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


@attrs.define(eq=False)
class SqliteStore:
    """A :class:`~ketten.interfaces.Store` in one SQLite database (see the module doc)."""

    _path: str = attrs.field(alias="path")
    _check_on_open: bool = attrs.field(default=True, alias="check_on_open")
    _repairs: list[HeadRepair] = attrs.field(factory=list, init=False)
    _inline_limit: float = attrs.field(default=0.005, alias="inline_limit")
    _inline: InlineCommits = attrs.field(init=False)
    _inline_runs: int = attrs.field(default=0, init=False)
    _db_path: str = attrs.field(init=False)
    _writer: sqlite3.Connection | None = attrs.field(default=None, init=False)
    _idle_readers: list[sqlite3.Connection] = attrs.field(factory=list, init=False)
    _read_slots: trio.Semaphore = attrs.field(factory=lambda: trio.Semaphore(_READERS),
                                              init=False)
    _dir_lock: DirLock | None = attrs.field(default=None, init=False)
    _queue: list[_WriteOp] = attrs.field(factory=list, init=False)
    _writing: bool = attrs.field(default=False, init=False)
    _cache: ChainCache = attrs.field(factory=ChainCache, init=False)
    # Transactions that reached COMMIT, and those whose effect is in the cache.
    # A read from disk returns only once the cache holds every commit its
    # snapshot may contain, so memory never lags behind what was read.
    _committing: int = attrs.field(default=0, init=False)
    _applied: int = attrs.field(default=0, init=False)
    _applied_now: trio.Event = attrs.field(factory=trio.Event, init=False)
    _page_size: int = attrs.field(default=4096, init=False)

    def __attrs_post_init__(self) -> None:
        self._db_path = os.path.join(self._path, DB_NAME)
        self._inline = InlineCommits(self._inline_limit)

    @property
    def path(self) -> str:
        """The store directory."""
        return self._path

    # -- lifecycle ---------------------------------------------------------

    async def open(self) -> None:
        """Open or create the store.

        Raises :class:`~ketten.errors.StoreFormatError` (another format, a
        newer schema, garbage: nothing on disk is changed),
        :class:`~ketten.errors.StoreCorrupted` (damaged database) or
        :class:`~ketten.errors.StoreError` (already open elsewhere).
        """
        if self._writer is not None:
            raise StoreError(f"{self._path}: the store is already open")
        await trio.to_thread.run_sync(self._open_sync)

    def _open_sync(self) -> None:
        check_existing(self._path)
        os.makedirs(self._path, exist_ok=True)
        writer = _connect(self._db_path, read_only=False)
        lock = DirLock(self._db_path)
        readers: list[sqlite3.Connection] = []
        try:
            lock.acquire()
            self._prepare(writer)
            heads = {
                criterion: (seq, digest)
                for criterion, seq, digest in writer.execute(
                    "SELECT criterion, head_seq, head_hash FROM chains"
                )
            }
            for _ in range(_READERS):
                readers.append(_connect(self._db_path, read_only=True))
        except BaseException as exc:
            for reader in readers:
                reader.close()
            writer.close()
            lock.release()
            if isinstance(exc, sqlite3.DatabaseError):
                raise corrupted(self._db_path, exc, self._page_size) from None
            raise
        self._writer, self._idle_readers, self._dir_lock = writer, readers, lock
        self._cache.clear(heads)

    def _prepare(self, writer: sqlite3.Connection) -> None:
        mode = writer.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"{self._db_path}: cannot switch to WAL mode (got {mode})")
        writer.execute("PRAGMA synchronous = FULL")
        writer.execute("PRAGMA temp_store = MEMORY")  # statement journals of savepoints
        migrate(writer, self._db_path)
        # Put the schema version into the main file's header, where readers
        # and the next open recognise the store without touching anything.
        writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._page_size = writer.execute("PRAGMA page_size").fetchone()[0]
        if self._check_on_open:
            problems = [row[0] for row in writer.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise corrupted(
                    self._db_path, sqlite3.DatabaseError("; ".join(problems[:3])),
                    self._page_size,
                )
            for repair in reconcile_heads(writer):
                self._repairs.append(repair)
                _events.warning(
                    "store_repaired", "%s: chain %s had head %s in its row but %s in its "
                    "events%s; the row now says %s", self._db_path, repair.criterion.hex()[:16],
                    _position(repair.row), _position(repair.head),
                    "" if repair.hole is None else
                    f" (seq {repair.hole} missing: quarantined from there, to be fetched again "
                    "from peers)", _position(repair.head),
                    key=f"heads:{repair.criterion.hex()}", path=self._db_path,
                    criterion=repair.criterion.hex(), hole=repair.hole)

    async def aclose(self) -> None:
        """Close the connections once running reads and writes are done (the store can be
        opened again)."""
        if self._writer is None:
            await trio.lowlevel.checkpoint()
            return
        with trio.CancelScope(shield=True):
            await self._write(lambda conn, heads, changes: (None, None))
            for _ in range(_READERS):
                await self._read_slots.acquire()
            try:
                writer, readers, lock = self._writer, self._idle_readers, self._dir_lock
                self._writer, self._idle_readers, self._dir_lock = None, [], None
                self._cache.clear()

                def close() -> None:
                    for reader in readers:
                        reader.close()
                    if writer is not None:
                        writer.close()
                    if lock is not None:
                        lock.release()

                await trio.to_thread.run_sync(close)
            finally:
                for _ in range(_READERS):
                    self._read_slots.release()

    # -- plumbing ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._writer is None:
            raise StoreError(f"{self._path}: the sqlite store is not open")

    def _mapped(self, exc: BaseException) -> BaseException:
        if isinstance(exc, sqlite3.IntegrityError):
            return StoreConflict(f"{self._path}: {exc}")
        if isinstance(exc, sqlite3.DatabaseError):
            return corrupted(self._db_path, exc, self._page_size)
        return exc

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        self._check_open()
        async with self._read_slots:
            self._check_open()
            conn = self._idle_readers.pop()
            try:
                def guarded() -> tuple[T, int]:
                    try:
                        return fn(conn), self._committing
                    except sqlite3.DatabaseError as exc:
                        raise self._mapped(exc) from None

                result, seen = await trio.to_thread.run_sync(guarded)
            finally:
                self._idle_readers.append(conn)
        while self._applied < seen:
            await self._applied_now.wait()
        return result

    @property
    def inline_transactions(self) -> int:
        """How many transactions ran on the event loop's thread (see ``inline_limit``)."""
        return self._inline_runs

    async def _write(self, body: Body, *, rows: int = 0) -> Any:
        """Run ``body`` in the next shared transaction: one thread hand-off and one sync
        serve every write queued meanwhile, each in its own savepoint, so each write
        commits whole or not at all whatever the others do.

        A caller cancelled while its write waits in the queue takes it out (nothing is
        written); once the write is in a running transaction the caller waits for the
        commit, whose effect on the cache is applied either way, and is then cancelled.
        """
        self._check_open()
        op = _WriteOp(body, rows=rows)
        self._queue.append(op)
        if self._writing:
            try:
                await op.done.wait()
            except trio.Cancelled:
                if op in self._queue:
                    self._queue.remove(op)
                    if op.lead:
                        self._hand_over()
                    raise
                with trio.CancelScope(shield=True):
                    await op.done.wait()
                raise
            if not op.lead:
                return op.outcome()
        with trio.CancelScope(shield=True):
            await self._lead()
        return op.outcome()

    async def _lead(self) -> None:
        self._writing = True
        batch: list[_WriteOp] = []
        try:
            batch, self._queue = self._queue, []
            for op in batch:
                op.lead = False
            writer = self._writer
            if not self._small_writes(batch):
                await trio.to_thread.run_sync(self._run_batch, writer, batch)
            elif self._inline.allowed(time.monotonic()):
                started = time.monotonic()
                self._run_batch(writer, batch)
                finished = time.monotonic()
                self._inline_runs += 1
                self._inline.observe(finished - started, finished)
                await trio.lowlevel.checkpoint()
            elif self._apply(writer, batch):
                # The inserts touch only cached pages; the sync is what may take long.
                assert writer is not None
                await trio.to_thread.run_sync(self._commit, writer, batch)
            else:
                await trio.lowlevel.checkpoint()
            for op in batch:
                if op.error is None and op.effect is not None:
                    op.effect(self._cache)
        except BaseException as exc:
            for op in batch:
                if op.error is None:
                    op.error, op.effect = exc, None
            raise
        finally:
            self._applied = self._committing
            self._applied_now.set()
            self._applied_now = trio.Event()
            for op in batch:
                op.done.set()
            self._hand_over()

    @staticmethod
    def _small_writes(batch: list[_WriteOp]) -> bool:
        total = 0
        for op in batch:
            if op.rows <= 0:
                return False
            total += op.rows
        return total <= _INLINE_ROWS

    def _hand_over(self) -> None:
        if self._queue:
            successor = self._queue[0]
            successor.lead = True
            successor.done.set()
        else:
            self._writing = False

    def _run_batch(self, conn: sqlite3.Connection | None, batch: list[_WriteOp]) -> None:
        if self._apply(conn, batch):
            assert conn is not None
            self._commit(conn, batch)

    def _apply(self, conn: sqlite3.Connection | None, batch: list[_WriteOp]) -> bool:
        """Begin a transaction and run every write of ``batch`` in it (each in a
        savepoint); ``False`` if the transaction failed as a whole (the errors are set)."""
        if conn is None:
            closed = StoreError(f"{self._path}: the sqlite store is not open")
            for op in batch:
                op.error = closed
            return False
        overlay: Changes = {}
        position = self._cache.head_position

        def heads(criterion: bytes) -> tuple[int, bytes] | None:
            return overlay[criterion] if criterion in overlay else position(criterion)

        try:
            conn.execute("BEGIN IMMEDIATE")
            fresh = True  # nothing written yet: a failure rolls back the transaction
            for op in batch:
                changes: Changes = {}
                if not fresh:
                    # Savepoints cost a statement journal of the pages they
                    # touch; the first write of a transaction does without.
                    conn.execute("SAVEPOINT op")
                try:
                    op.result, op.effect = op.body(conn, heads, changes)
                except Exception as exc:
                    if fresh:
                        conn.execute("ROLLBACK")
                        conn.execute("BEGIN IMMEDIATE")
                    else:
                        conn.execute("ROLLBACK TO op")
                        conn.execute("RELEASE op")
                    op.error = self._mapped(exc)
                    continue
                if not fresh:
                    conn.execute("RELEASE op")
                fresh = False
                overlay.update(changes)
        except BaseException as exc:
            self._abort(conn, batch, exc)
            return False
        return True

    def _commit(self, conn: sqlite3.Connection, batch: list[_WriteOp]) -> None:
        try:
            self._committing += 1
            conn.execute("COMMIT")
        except BaseException as exc:
            self._abort(conn, batch, exc)

    def _abort(self, conn: sqlite3.Connection, batch: list[_WriteOp], exc: BaseException) -> None:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        failed = self._mapped(exc)
        for op in batch:
            if op.error is None:
                op.error, op.effect = failed, None

    # -- writes ------------------------------------------------------------

    async def append(self, events: Sequence[Event]) -> None:
        """Append events, each extending its criterion's head, all or none; durable on return.

        Raises :class:`~ketten.errors.StoreConflict` (position taken, broken
        link, command id reused), :class:`~ketten.errors.StoreError` (not open),
        :class:`~ketten.errors.StoreCorrupted`.
        """
        self._check_open()
        if not events:
            await trio.lowlevel.checkpoint()
            return
        batch = list(events)
        rows = _rows(batch)

        def body(conn: sqlite3.Connection, heads: Heads,
                 changes: Changes) -> tuple[None, Effect]:
            commands: set[tuple[bytes, bytes, int]] = set()
            for event in batch:
                criterion = event.criterion
                known = changes[criterion] if criterion in changes else heads(criterion)
                next_seq, head_hash = (known[0] + 1, known[1]) if known else (0, None)
                if event.seq != next_seq or event.prev != head_hash:
                    raise StoreConflict(
                        f"criterion {_short(criterion)}: seq {event.seq} does not extend "
                        f"the head (next seq {next_seq})"
                    )
                if event.command is not None:
                    key = (criterion, event.author, event.command)
                    if key in commands:
                        raise StoreConflict(
                            f"criterion {_short(criterion)}: command {event.command} of "
                            f"author {_short(event.author)} is already in the chain"
                        )
                    commands.add(key)
                changes[criterion] = (event.seq, event.hash)
            try:
                conn.executemany(_INSERT, rows)
            except sqlite3.IntegrityError:
                raise StoreConflict(
                    f"{self._path}: a command id (author, command) of this batch is "
                    "already in its chain"
                ) from None
            conn.executemany(_SET_HEAD, [(c, pos[0], pos[1]) for c, pos in changes.items()
                                         if pos is not None])
            return None, lambda cache: cache.committed(batch)

        await self._write(body, rows=len(batch))

    async def replace_from(self, criterion: bytes, seq: int, events: Sequence[Event]) -> list[Event]:
        """Orphan the main chain from ``seq`` on and append ``events`` in its place, atomically.

        Returns the orphaned events. Raises :class:`~ketten.errors.StoreConflict`
        (``seq`` beyond the head, replacement not linking, command id reused),
        :class:`~ketten.errors.StoreError`, :class:`~ketten.errors.StoreCorrupted`.
        """
        self._check_open()
        batch = list(events)

        def body(conn: sqlite3.Connection, heads: Heads,
                 changes: Changes) -> tuple[list[Event], Effect]:
            known = heads(criterion)
            height = known[0] + 1 if known else 0
            if not 0 <= seq <= height:
                raise StoreConflict(
                    f"cannot replace from seq {seq} of a chain of height {height}"
                )
            expected_prev: bytes | None = None
            if seq > 0:
                row = conn.execute(
                    "SELECT hash FROM events WHERE criterion = ? AND orphan IS NULL"
                    " AND seq = ?", (criterion, seq - 1),
                ).fetchone()
                if row is None:
                    raise StoreConflict(f"seq {seq - 1} of the chain is missing")
                expected_prev = row[0]
            base_prev = expected_prev
            commands: set[tuple[bytes, int]] = set()
            for offset, event in enumerate(batch):
                if (event.criterion != criterion or event.seq != seq + offset
                        or event.prev != expected_prev):
                    raise StoreConflict(
                        f"replacement event seq {event.seq} does not extend "
                        f"seq {seq + offset - 1}"
                    )
                if event.command is not None:
                    if (event.author, event.command) in commands:
                        raise StoreConflict(f"replacement reuses command {event.command}")
                    commands.add((event.author, event.command))
                expected_prev = event.hash
            removed = [
                decode_checked(self._db_path, criterion, s, digest, raw)
                for s, digest, raw in iter_main(conn, self._db_path, criterion, seq, None)
            ]
            number = conn.execute(
                "SELECT COALESCE(MAX(orphan), 0) + 1 FROM events"
                " WHERE criterion = ? AND orphan IS NOT NULL", (criterion,),
            ).fetchone()[0]
            conn.execute(
                "UPDATE events SET orphan = ? WHERE criterion = ? AND orphan IS NULL"
                " AND seq >= ?", (number, criterion, seq),
            )
            try:
                conn.executemany(_INSERT, _rows(batch))
            except sqlite3.IntegrityError:
                raise StoreConflict("replacement reuses a command id of the chain") from None
            head: tuple[int, bytes] | None
            if batch:
                head = (batch[-1].seq, batch[-1].hash)
            elif seq > 0:
                assert base_prev is not None
                head = (seq - 1, base_prev)
            else:
                head = None
            _store_head(conn, criterion, head)
            changes[criterion] = head
            return removed, lambda cache: cache.reset(criterion, head, batch)

        removed: list[Event] = await self._write(body)
        return removed

    async def drop(self, criterion: bytes) -> int:
        """Remove the chain of ``criterion`` (main chain, orphans, quarantine record)
        in one transaction; return how many events went. Freed pages are reused by
        later writes (the file does not shrink). Raises :class:`~ketten.errors.StoreError`.
        """

        def body(conn: sqlite3.Connection, heads: Heads,
                 changes: Changes) -> tuple[int, Effect]:
            removed = conn.execute("DELETE FROM events WHERE criterion = ?",
                                   (criterion,)).rowcount
            conn.execute("DELETE FROM quarantine WHERE criterion = ?", (criterion,))
            _store_head(conn, criterion, None)
            changes[criterion] = None
            return int(removed), lambda cache: cache.reset(criterion, None)

        removed: int = await self._write(body)
        return removed

    async def put_cursor(self, name: str, value: bytes) -> None:
        """Store a cursor atomically and durably. Raises :class:`~ketten.errors.StoreError`."""
        data = bytes(value)

        def body(conn: sqlite3.Connection, heads: Heads, changes: Changes) -> tuple[None, None]:
            conn.execute("INSERT OR REPLACE INTO cursors (name, value) VALUES (?, ?)",
                         (name, data))
            return None, None

        await self._write(body, rows=1)

    async def quarantine(self, criterion: bytes, from_seq: int) -> int:
        """Give up the chain of ``criterion`` from ``from_seq`` on, to repair it from peers.

        The main chain is cut back to ``from_seq`` events (damaged or not),
        damaged orphans of the chain are dropped, and the range is recorded
        (see :meth:`quarantined`). Afterwards the head is ``from_seq - 1``, so
        the normal sync fetches the rest again. Returns how many main-chain
        events were removed. Raises :class:`~ketten.errors.StoreError`.
        """
        from_seq = max(from_seq, 0)

        def body(conn: sqlite3.Connection, heads: Heads,
                 changes: Changes) -> tuple[int, Effect]:
            known = heads(criterion)
            height = known[0] + 1 if known else 0
            removed = conn.execute(
                "DELETE FROM events WHERE criterion = ? AND orphan IS NULL AND seq >= ?",
                (criterion, from_seq),
            ).rowcount
            bad = []
            for row_id, seq, digest, raw in conn.execute(
                "SELECT id, seq, hash, raw FROM events WHERE criterion = ?"
                " AND orphan IS NOT NULL", (criterion,),
            ).fetchall():
                try:
                    decode_checked(self._db_path, criterion, seq, digest, raw)
                except StoreError:
                    bad.append((row_id,))
            conn.executemany("DELETE FROM events WHERE id = ?", bad)
            head: tuple[int, bytes] | None = None
            if from_seq > 0:
                row = conn.execute(
                    "SELECT seq, hash FROM events WHERE criterion = ? AND orphan IS NULL"
                    " AND seq = ?", (criterion, from_seq - 1),
                ).fetchone()
                head = (row[0], row[1]) if row else known
            _store_head(conn, criterion, head)
            changes[criterion] = head
            if removed:
                conn.execute(
                    "INSERT INTO quarantine (criterion, from_seq, old_height)"
                    " VALUES (?, ?, ?) ON CONFLICT(criterion) DO UPDATE SET"
                    " from_seq = min(from_seq, excluded.from_seq),"
                    " old_height = max(old_height, excluded.old_height)",
                    (criterion, from_seq, height),
                )
            return int(removed), lambda cache: cache.reset(criterion, head)

        removed: int = await self._write(body)
        if removed:
            _events.warning("store_repaired", "%s: chain %s quarantined from seq %d (%d events "
                            "given up) to be fetched again from peers", self._db_path,
                            criterion.hex()[:16], from_seq, removed,
                            key=f"quarantine:{criterion.hex()}", path=self._db_path,
                            criterion=criterion.hex(), from_seq=from_seq, removed=removed)
        return removed

    def head_repairs(self) -> list[HeadRepair]:
        """The chains whose row (head seq and hash) did not match their events when
        the store was opened, and how each was repaired (``check_on_open`` only)."""
        return list(self._repairs)

    async def quarantined(self) -> dict[bytes, tuple[int, int]]:
        """``{criterion: (from_seq, old_height)}`` of quarantined ranges not yet refilled.

        A range counts as refilled once the chain is as high as before.
        Raises :class:`~ketten.errors.StoreError`.
        """
        rows = await self._read(
            lambda conn: conn.execute(
                "SELECT criterion, from_seq, old_height FROM quarantine"
            ).fetchall()
        )
        out = {}
        for criterion, from_seq, old_height in rows:
            known = self._cache.head_position(criterion)
            if (known[0] + 1 if known else 0) < old_height:
                out[criterion] = (from_seq, old_height)
        return out

    # -- reads -------------------------------------------------------------

    async def get(self, event_hash: bytes) -> Event | None:
        """The event with this hash (main chain or orphan), or ``None``.

        Raises :class:`~ketten.errors.StoreCorrupted`, :class:`~ketten.errors.StoreError`.
        """

        def get(conn: sqlite3.Connection) -> Event | None:
            row = conn.execute(
                "SELECT criterion, seq, raw FROM events WHERE hash = ? LIMIT 1", (event_hash,)
            ).fetchone()
            if row is None:
                return None
            return decode_checked(self._db_path, row[0], row[1], event_hash, row[2])

        return await self._read(get)

    async def head(self, criterion: bytes) -> Event | None:
        """The head of the chain, or ``None`` (from memory once known).

        Raises :class:`~ketten.errors.StoreCorrupted`, :class:`~ketten.errors.StoreError`.
        """
        self._check_open()
        cache = self._cache
        cached = cache.head_event(criterion)
        if cached is not None or cache.head_position(criterion) is None:
            await trio.lowlevel.checkpoint()
            return cached
        generation = cache.generation(criterion)

        def head(conn: sqlite3.Connection) -> Event | None:
            row = conn.execute(
                "SELECT e.seq, e.hash, e.raw FROM chains c JOIN events e"
                " ON e.criterion = c.criterion AND e.seq = c.head_seq AND e.orphan IS NULL"
                " WHERE c.criterion = ?", (criterion,),
            ).fetchone()
            if row is None:
                return None
            return decode_checked(self._db_path, criterion, row[0], row[1], row[2])

        event = await self._read(head)
        cache.read_head(criterion, generation, event)
        return event

    async def heads(self) -> Mapping[bytes, tuple[int, bytes]]:
        """``{criterion: (head seq, head hash)}`` (from memory). Raises
        :class:`~ketten.errors.StoreError`."""
        self._check_open()
        await trio.lowlevel.checkpoint()
        return self._cache.heads()

    async def range(self, criterion: bytes, start: int = 0, stop: int | None = None) -> list[Event]:
        """Main-chain events with ``start <= seq < stop``, in order.

        Raises :class:`~ketten.errors.StoreCorrupted` (the range holds a damaged
        record: nothing is returned), :class:`~ketten.errors.StoreError`.
        """
        self._check_open()
        cached = self._cache.range(criterion, start, stop)
        if cached is not None:
            await trio.lowlevel.checkpoint()
            return cached
        return await self._read(
            lambda conn: read_main(conn, self._db_path, criterion, start, stop)
        )

    async def by_command(self, criterion: bytes, author: bytes, command: int) -> Event | None:
        """The main-chain event with this command id, or ``None``.

        Raises :class:`~ketten.errors.StoreCorrupted`, :class:`~ketten.errors.StoreError`.
        """
        self._check_open()
        if not 0 <= command <= MAX_SEQ:
            await trio.lowlevel.checkpoint()
            return None
        cache = self._cache
        known = cache.by_command(criterion, author, command)
        if known is None or isinstance(known, Event):
            await trio.lowlevel.checkpoint()
            return known
        if known < 0:
            generation = cache.generation(criterion)
            index = await self._read(
                lambda conn: {
                    (a, c): s for a, c, s in conn.execute(
                        "SELECT author, command, seq FROM events WHERE criterion = ?"
                        " AND orphan IS NULL AND command IS NOT NULL", (criterion,),
                    )
                }
            )
            cache.read_commands(criterion, generation, index)
            seq = index.get((author, command))
            if seq is None:
                return None
        else:
            seq = known

        def lookup(conn: sqlite3.Connection) -> Event | None:
            row = conn.execute(
                "SELECT seq, hash, raw FROM events WHERE criterion = ? AND author = ?"
                " AND command = ? AND orphan IS NULL", (criterion, author, command),
            ).fetchone()
            if row is None:
                return None
            return decode_checked(self._db_path, criterion, row[0], row[1], row[2])

        return await self._read(lookup)

    async def orphans(self, criterion: bytes) -> list[Event]:
        """Events that lost a fork, oldest first. Raises :class:`~ketten.errors.StoreCorrupted`."""
        return await self._read(
            lambda conn: [
                decode_checked(self._db_path, criterion, seq, digest, raw)
                for seq, digest, raw in iter_orphans(conn, self._db_path, criterion)
            ]
        )

    async def get_cursor(self, name: str) -> bytes | None:
        """A stored cursor, or ``None``. Raises :class:`~ketten.errors.StoreError`."""

        def get(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute("SELECT value FROM cursors WHERE name = ?", (name,)).fetchone()
            return None if row is None else bytes(row[0])

        return await self._read(get)


    async def cursors(self, prefix: str) -> dict[str, bytes]:
        """Every cursor whose name starts with ``prefix``. Raises :class:`~ketten.errors.StoreError`."""

        def scan(conn: sqlite3.Connection) -> dict[str, bytes]:
            rows = conn.execute(
                "SELECT name, value FROM cursors WHERE substr(name, 1, ?) = ?",
                (len(prefix), prefix)).fetchall()
            return {name: bytes(value) for name, value in rows}

        return await self._read(scan)


def _position(head: tuple[int, bytes] | None) -> str:
    return "none" if head is None else f"seq {head[0]} ({head[1].hex()[:16]})"


def _store_head(conn: sqlite3.Connection, criterion: bytes, head: tuple[int, bytes] | None) -> None:
    if head is None:
        conn.execute("DELETE FROM chains WHERE criterion = ?", (criterion,))
    else:
        conn.execute(_SET_HEAD, (criterion, head[0], head[1]))


_READER_MMAP = 0x7FFF0000
"""Bytes of a store a :class:`SqliteReader` maps (sqlite's own upper limit)."""


class SqliteReader:
    """Read-only access to a sqlite store directory (a :class:`~ketten.interfaces.StoreReader`).

    Each call reads one consistent WAL snapshot, also while a node writes.
    Raises :class:`~ketten.errors.StoreFormatError` when opened on a
    directory that is not a readable sqlite store.
    """

    def __init__(self, path: str) -> None:
        self._path = os.path.abspath(path)
        self._db_path = os.path.join(self._path, DB_NAME)
        if not check_existing(self._path):
            raise StoreFormatError(f"{self._path}: no sqlite store here")
        try:
            self._conn: sqlite3.Connection | None = _connect(self._db_path, read_only=True)
            # Scans read the file through a memory map: about a fifth less time
            # than through read() calls. Only here, not in a node: a disk that fails
            # under a map ends the process (SIGBUS) rather than one read, which
            # a Spark task survives by being retried, and a node must not.
            self._conn.execute(f"PRAGMA mmap_size = {_READER_MMAP}")
        except sqlite3.DatabaseError as exc:
            raise corrupted(self._db_path, exc) from None

    def _c(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self._path}: the reader is closed")
        return self._conn

    def _guard(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except sqlite3.DatabaseError as exc:
            raise corrupted(self._db_path, exc) from None

    def criteria(self) -> list[bytes]:
        """Keys of every stored chain, sorted."""
        return self._guard(lambda: [
            row[0] for row in self._c().execute("SELECT criterion FROM chains ORDER BY criterion")
        ])

    def heads(self) -> Mapping[bytes, tuple[int, bytes]]:
        """``{criterion: (head seq, head hash)}``."""
        return self._guard(lambda: {
            c: (s, h) for c, s, h in self._c().execute(
                "SELECT criterion, head_seq, head_hash FROM chains ORDER BY criterion"
            )
        })

    def read_encoded(
        self, criterion: bytes, start: int = 0, stop: int | None = None, *, check: bool = True
    ) -> Iterator[tuple[int, bytes]]:
        """``(seq, canonical bytes)`` of the main chain, ``start <= seq < stop``.

        With ``check``, every row is proven against its stored hash and chain
        position; without, rows are returned as stored (the caller proves the
        hash links). Either way one consistent snapshot is read. Raises
        :class:`~ketten.errors.StoreCorrupted`.
        """
        if check:
            return self._read_checked(criterion, start, stop)
        return chain.from_iterable(self._read_unchecked(criterion, start, stop))

    def _read_checked(
        self, criterion: bytes, start: int, stop: int | None
    ) -> Iterator[tuple[int, bytes]]:
        rows = iter_main(self._c(), self._db_path, criterion, start, stop)
        while True:
            try:
                seq, _, raw = next(rows)
            except StopIteration:
                return
            except sqlite3.DatabaseError as exc:
                raise corrupted(self._db_path, exc) from None
            yield seq, raw

    def _read_unchecked(
        self, criterion: bytes, start: int, stop: int | None
    ) -> Iterator[list[tuple[int, bytes]]]:
        """The rows in batches (flattened by the caller in C, not row by row here)."""
        rows = self._guard(lambda: iter_main_unchecked(self._c(), criterion, start, stop))
        try:
            while batch := rows.fetchmany():
                yield batch
        except sqlite3.DatabaseError as exc:
            raise corrupted(self._db_path, exc) from None
        finally:
            rows.close()  # ends the statement's read snapshot

    def orphans_encoded(self, criterion: bytes) -> Iterator[bytes]:
        """Canonical bytes of the orphans of a chain, oldest first, checked."""
        rows = self._guard(lambda: list(iter_orphans(self._c(), self._db_path, criterion)))
        for _, _, raw in rows:
            yield raw

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"store": ["sqlite"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("store", "sqlite"):
        return None
    return PluginSpec({
        "path": Option("the store directory", (str, os.PathLike)),
        "check_on_open": Option("quick_check the database when opening", bool),
        "inline_limit": Option("seconds a commit may take on the event loop's thread", float),
    })


@hookimpl
def ketten_make_store(name: str, options: Mapping[str, Any], node: Node) -> SqliteStore | None:
    if name != "sqlite":
        return None
    check = options.get("check_on_open", True)
    if not isinstance(check, bool):
        raise ConfigError(f"store option 'check_on_open' must be a bool, got {check!r}")
    limit = options.get("inline_limit", 0.005)
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not 0 <= limit <= 1:
        raise ConfigError(
            f"store option 'inline_limit' must be a number of seconds in [0, 1], got {limit!r}")
    return SqliteStore(path=store_path(options, "sqlite"), check_on_open=check,
                       inline_limit=float(limit))


@hookimpl
def ketten_open_store_reader(path: str) -> SqliteReader | None:
    if not owns_directory(path):
        return None
    return SqliteReader(path)
