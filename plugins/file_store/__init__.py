"""The ``file`` store: append-only segment files, no database.

Options (``NodeConfig.options["store"]``):

``path``
    The node's store directory (created if missing). It holds the format
    marker ``KETTEN-FILE-STORE``, segments ``seg-NNNNNNNN.log``, a
    ``cursors`` directory and, after a quarantine, a ``quarantine`` file.
``segment_bytes``
    Size after which a new segment is started (default 64 MiB).

Every append, fork resolution, quarantine and drop is one batch of checksummed
frames closed by a COMMIT frame, written with one ``write`` and made durable
with ``fdatasync`` before the call returns. Opening replays the segments to
rebuild the index in memory (checking every frame); a torn write at the end
(a batch without its COMMIT) is cut off. Cursors are small files replaced
atomically (write, fsync, rename, fsync of the directory).

A drop only writes a DROP frame; once the bytes no event needs any more
reach both ``segment_bytes`` and the bytes still needed, the store compacts
(:meth:`FileStore.compact`): it copies every needed record into a new *base
segment* and unlinks the segments before it, while appends and reads go on.
A crash at any point leaves either the old segments or the base in force.

Reads check each frame's checksum and each event's hash and chain position:
damaged records raise :class:`~ketten.errors.StoreCorrupted` (a
``StoreCorrupted`` naming file, offset, criterion and seq) and are never
served; :meth:`FileStore.quarantine` gives up the damaged range so that the
node can fetch it again from its peers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from ketten import Event, Option, PluginSpec, hookimpl
from ketten.errors import (
    ConfigError,
    DecodeError,
    StoreConflict,
    StoreCorrupted,
    StoreError,
    StoreFormatError,
)
from ketten.logs import RateLimitedLog

from .._store_records import TMP_SUFFIX, DirLock, atomic_write, fsync_dir, store_path
from . import _format as fmt
from ._compact import write_base
from ._index import Index, Loc, layout
from ._read import (
    SegmentFiles,
    load_index,
    read_main,
    read_main_unchecked,
    read_one,
    read_orphans,
    snapshot,
)

if TYPE_CHECKING:
    from ketten import Node

__all__ = ["FileReader", "FileStore"]

T = TypeVar("T")
_DEFAULT_SEGMENT_BYTES = 64 << 20
_QUARANTINE_FILE = "quarantine"
_events = RateLimitedLog(logging.getLogger("ketten.store"))
_CURSORS = "cursors"
_CURSOR_NAME = re.compile(r"\A[0-9a-f]{40}\Z")
_RELOCATE_PART = 5_000
"""Index entries pointed at a new base per hold of the write lock."""


def _short(key: bytes) -> str:
    return key.hex()[:16]


def _decode(raw: bytes, path: str, loc: Loc) -> Event:
    try:
        return Event.from_bytes(raw)
    except DecodeError as exc:
        raise StoreCorrupted(f"undecodable event ({exc})", path=path, offset=loc[1]) from None


def _remove_leftovers(path: str) -> None:
    """Remove temporary files a crash left in the middle of a write (the store is
    locked: no write of ours is in progress)."""
    for folder in (path, os.path.join(path, _CURSORS)):
        for entry in os.listdir(folder):
            if entry.endswith(TMP_SUFFIX):
                try:
                    os.unlink(os.path.join(folder, entry))
                except FileNotFoundError:
                    pass


def _load_spans(path: str) -> dict[tuple[int, int], int]:
    spans_path = os.path.join(path, _QUARANTINE_FILE)
    try:
        with open(spans_path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    return fmt.decode_spans(spans_path, data)


@attrs.define(eq=False)
class FileStore:
    """A :class:`~ketten.interfaces.Store` in append-only segment files (see the module doc)."""

    _path: str = attrs.field(alias="path")
    _segment_bytes: int = attrs.field(default=_DEFAULT_SEGMENT_BYTES, alias="segment_bytes")
    _index: Index | None = attrs.field(default=None, init=False)
    _files: SegmentFiles | None = attrs.field(default=None, init=False)
    _dir_lock: DirLock | None = attrs.field(default=None, init=False)
    _write_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _wfd: int | None = attrs.field(default=None, init=False)
    _wseg: int = attrs.field(default=0, init=False)
    _wsize: int = attrs.field(default=0, init=False)
    _spans: dict[tuple[int, int], int] = attrs.field(factory=dict, init=False)
    _failed: str | None = attrs.field(default=None, init=False)
    _sizes: dict[int, int] = attrs.field(factory=dict, init=False)
    _compacting: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _reading: int = attrs.field(default=0, init=False)
    _retired: list[int] = attrs.field(factory=list, init=False)
    _damage_waits: bool = attrs.field(default=False, init=False)
    """A compaction found a damaged record; no other starts by itself until a quarantine."""

    @property
    def path(self) -> str:
        """The store directory."""
        return self._path

    # -- lifecycle ---------------------------------------------------------

    async def open(self) -> None:
        """Open or create the store, replaying the log and cutting off a torn write.

        Raises :class:`~ketten.errors.StoreFormatError` (another format, a
        newer version, garbage: nothing on disk is changed),
        :class:`~ketten.errors.StoreCorrupted` (damage that cannot be tied to
        a chain position) or :class:`~ketten.errors.StoreError` (already open).
        """
        if self._index is not None:
            raise StoreError(f"{self._path}: the store is already open")
        await trio.to_thread.run_sync(self._open_sync)

    def _open_sync(self) -> None:
        path = self._path
        if fmt.check_directory(path) is None:
            os.makedirs(path, exist_ok=True)
            os.makedirs(os.path.join(path, _CURSORS), exist_ok=True)
            # Format 1 until the first compaction, so that older versions open it.
            atomic_write(os.path.join(path, fmt.MARKER), fmt.marker_bytes(1))
            fsync_dir(os.path.dirname(path))
        lock = DirLock(os.path.join(path, fmt.MARKER))
        lock.acquire()
        files = SegmentFiles(path)
        wfd: int | None = None
        try:
            os.makedirs(os.path.join(path, _CURSORS), exist_ok=True)
            _remove_leftovers(path)
            spans = _load_spans(path)
            index, (last, valid_end), sizes, stale = load_index(path, spans, files)
            for number in stale:  # a crash came between a compaction's base and its cleanup
                os.unlink(files.path_of(number))
            seg_path = files.path_of(last)
            wfd = os.open(seg_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            if not sizes or stale:
                fsync_dir(path)
            sizes[last] = valid_end
            size = os.fstat(wfd).st_size
            if size > valid_end:
                os.ftruncate(wfd, valid_end)
                os.fsync(wfd)
                _events.warning("store_repaired", "%s: cut %d bytes of a torn write (a batch "
                                "without its COMMIT) off the end of %s", path,
                                size - valid_end, seg_path, key=f"torn:{path}", path=path,
                                segment=seg_path, bytes_cut=size - valid_end)
        except BaseException:
            if wfd is not None:
                os.close(wfd)
            files.close()
            lock.release()
            raise
        self._index, self._files, self._dir_lock, self._spans = index, files, lock, spans
        self._wfd, self._wseg, self._wsize, self._failed = wfd, last, valid_end, None
        self._sizes, self._retired = sizes, []

    async def aclose(self) -> None:
        """Close the files (the store can be opened again)."""
        async with self._compacting, self._write_lock:
            wfd, files, lock = self._wfd, self._files, self._dir_lock
            self._index = self._files = self._dir_lock = self._wfd = None
            if wfd is not None:
                os.close(wfd)
            if files is not None:
                files.close()
            if lock is not None:
                lock.release()
            await trio.lowlevel.checkpoint()

    # -- plumbing ----------------------------------------------------------

    def _idx(self) -> Index:
        if self._index is None:
            raise StoreError(f"{self._path}: the file store is not open")
        return self._index

    def _fls(self) -> SegmentFiles:
        if self._files is None:
            raise StoreError(f"{self._path}: the file store is not open")
        return self._files

    async def _thread(self, fn: Callable[[], T]) -> T:
        return await trio.to_thread.run_sync(fn)

    async def _read(self, fn: Callable[[], T]) -> T:
        """Run a read whose locations were taken just before (no checkpoint between):
        segments a compaction retired stay open until no such read is running."""
        self._reading += 1
        try:
            return await trio.to_thread.run_sync(fn)
        finally:
            self._reading -= 1
            if not self._reading and self._retired and self._files is not None:
                self._files.forget(self._retired)
                self._retired = []

    def _write_batch(self, frames: list[bytes]) -> tuple[int, int]:
        """Write frames and their COMMIT durably; return ``(segment, offset)`` of the first.

        Runs in a worker thread while the write lock is held.
        """
        self._check_writable()
        if self._wsize >= self._segment_bytes:
            self._roll()
        assert self._wfd is not None
        data = b"".join(frames) + fmt.frame(fmt.COMMIT, fmt.COMMIT_BODY.pack(len(frames)))
        start = self._wsize
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._wfd, view):]
            os.fdatasync(self._wfd)
        except OSError as exc:
            try:
                os.ftruncate(self._wfd, start)
                os.fsync(self._wfd)
            except OSError:
                self._failed = str(exc)
            raise StoreError(f"{self._fls().path_of(self._wseg)}: write failed: {exc}") from exc
        self._wsize = self._sizes[self._wseg] = start + len(data)
        return self._wseg, start

    def _check_writable(self) -> None:
        if self._failed is not None:
            raise StoreError(f"{self._path}: the store refuses writes after an I/O error "
                             f"({self._failed}); reopen it")

    def _roll(self) -> None:
        number = self._wseg + 1
        path = self._fls().path_of(number)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            fsync_dir(self._path)
        except OSError as exc:
            raise StoreError(f"{path}: cannot start a segment: {exc}") from exc
        if self._wfd is not None:
            os.close(self._wfd)
        self._wfd, self._wseg, self._wsize = fd, number, 0
        self._sizes[number] = 0

    @staticmethod
    def _locs(segment: int, start: int, frames: list[bytes]) -> list[Loc]:
        locs = []
        for frame in frames:
            locs.append((segment, start, start + len(frame)))
            start += len(frame)
        return locs

    # -- writes ------------------------------------------------------------

    async def append(self, events: Sequence[Event]) -> None:
        """Append events, each extending its criterion's head, all or none; durable on return.

        Raises :class:`~ketten.errors.StoreConflict` (position taken, broken
        link, command id reused), :class:`~ketten.errors.StoreError` (not open,
        I/O error).
        """
        self._idx()
        if not events:
            await trio.lowlevel.checkpoint()
            return
        async with self._write_lock:
            index = self._idx()
            pending: dict[bytes, tuple[int, bytes]] = {}
            commands: set[tuple[bytes, bytes, int]] = set()
            for event in events:
                criterion = event.criterion
                chain = index.chains.get(criterion)
                head_hash: bytes | None = None
                next_seq = 0
                if criterion in pending:
                    next_seq, head_hash = pending[criterion][0] + 1, pending[criterion][1]
                elif chain is not None and chain.height:
                    next_seq, head_hash = chain.height, chain.hashes[-1]
                if event.seq != next_seq or event.prev != head_hash:
                    raise StoreConflict(
                        f"criterion {_short(criterion)}: seq {event.seq} does not extend "
                        f"the head (next seq {next_seq})"
                    )
                if event.command is not None:
                    key = (criterion, event.author, event.command)
                    taken = chain is not None and (event.author, event.command) in chain.commands
                    if taken or key in commands:
                        raise StoreConflict(
                            f"criterion {_short(criterion)}: command {event.command} of "
                            f"author {_short(event.author)} is already in the chain"
                        )
                    commands.add(key)
                pending[criterion] = (event.seq, event.hash)
            frames = [fmt.frame(fmt.EVENT, e.to_bytes()) for e in events]
            segment, start = await self._thread(lambda: self._write_batch(frames))
            for event, loc in zip(events, self._locs(segment, start, frames)):
                index.add_event(loc, event.criterion, event.seq, event.prev, event.author,
                                event.command, event.hash)

    async def replace_from(self, criterion: bytes, seq: int, events: Sequence[Event]) -> list[Event]:
        """Orphan the main chain from ``seq`` on and append ``events`` in its place, atomically.

        Returns the orphaned events. Raises :class:`~ketten.errors.StoreConflict`
        (``seq`` beyond the head, replacement not linking, command id reused),
        :class:`~ketten.errors.StoreCorrupted` (an event to orphan is damaged),
        :class:`~ketten.errors.StoreError`.
        """
        self._idx()
        async with self._write_lock:
            index, files = self._idx(), self._fls()
            chain = index.chains.get(criterion)
            height = chain.height if chain is not None else 0
            if not 0 <= seq <= height:
                raise StoreConflict(f"cannot replace from seq {seq} of a chain of height {height}")
            expected_prev = chain.hashes[seq - 1] if chain is not None and seq > 0 else None
            commands = {k for k, v in chain.commands.items() if v < seq} if chain else set()
            for offset, event in enumerate(events):
                if (event.criterion != criterion or event.seq != seq + offset
                        or event.prev != expected_prev):
                    raise StoreConflict(
                        f"replacement event seq {event.seq} does not extend seq {seq + offset - 1}"
                    )
                if event.command is not None:
                    if (event.author, event.command) in commands:
                        raise StoreConflict(f"replacement reuses command {event.command}")
                    commands.add((event.author, event.command))
                expected_prev = event.hash
            part = snapshot(chain, seq, None) if chain is not None else None
            frames = [fmt.frame(fmt.REPLACE, fmt.REPLACE_BODY.pack(criterion, seq))]
            frames += [fmt.frame(fmt.EVENT, e.to_bytes()) for e in events]

            def write() -> tuple[list[Event], tuple[int, int]]:
                removed = [
                    _decode(raw, files.path_of(loc[0]), loc)
                    for _, _, raw, loc in read_main(files, criterion, part)
                ] if part is not None else []
                return removed, self._write_batch(frames)

            removed, (segment, start) = await self._thread(write)
            index.replace(criterion, seq)
            for event, loc in zip(events, self._locs(segment, start, frames)[1:]):
                index.add_event(loc, criterion, event.seq, event.prev, event.author,
                                event.command, event.hash)
            return removed

    async def quarantine(self, criterion: bytes, from_seq: int) -> int:
        """Give up the chain of ``criterion`` from ``from_seq`` on, to repair it from peers.

        The main chain is cut back to ``from_seq`` events (damaged or not),
        damaged orphans of the chain are dropped, the damaged frames are
        listed in the ``quarantine`` file (so replays skip them) and the range
        is recorded (see :meth:`quarantined`). Afterwards the head is
        ``from_seq - 1``, so the normal sync fetches the rest again. Returns
        how many main-chain events were removed. Raises
        :class:`~ketten.errors.StoreError`.
        """
        self._idx()
        from_seq = max(from_seq, 0)
        async with self._write_lock:
            index, files = self._idx(), self._fls()
            chain = index.chains.get(criterion)
            if chain is None:
                await trio.lowlevel.checkpoint()
                return 0
            height = chain.height
            suspects = [
                (chain.locs[s], chain.hashes[s]) for s in range(min(from_seq, height), height)
            ] + [(loc, digest) for loc, _, digest in chain.orphans]

            def write() -> set[Loc]:
                bad: set[Loc] = set()
                for loc, digest in suspects:
                    try:
                        if digest is None:
                            raise StoreCorrupted("damaged")
                        read_one(files, loc, digest)
                    except StoreCorrupted:
                        bad.add(loc)
                if bad:
                    spans = dict(self._spans)
                    spans.update({(seg, off): end - off for seg, off, end in bad})
                    atomic_write(os.path.join(self._path, _QUARANTINE_FILE),
                                 fmt.encode_spans(spans))
                    self._spans = spans
                body = fmt.QUARANTINE_BODY.pack(criterion, from_seq, height)
                self._write_batch([fmt.frame(fmt.QUARANTINE, body)])
                return bad

            bad = await self._thread(write)
            self._damage_waits = False
            chain.orphans = [(loc, s, None if loc in bad else d) for loc, s, d in chain.orphans]
            removed = index.quarantine(criterion, from_seq, height)
            _events.warning("store_repaired", "%s: chain %s quarantined from seq %d (%d events "
                            "given up, %d damaged frames) to be fetched again from peers",
                            self._path, criterion.hex()[:16], from_seq, removed, len(bad),
                            key=f"quarantine:{criterion.hex()}", path=self._path,
                            criterion=criterion.hex(), from_seq=from_seq, removed=removed)
            return removed

    async def drop(self, criterion: bytes) -> int:
        """Forget the chain of ``criterion`` (main chain, orphans, quarantined range)
        with one durable DROP frame; return how many events went. The disk space
        comes back at the next compaction (see :meth:`compact`). Raises
        :class:`~ketten.errors.StoreError`.
        """
        self._idx()
        async with self._write_lock:
            index = self._idx()
            if criterion not in index.chains:
                await trio.lowlevel.checkpoint()
                return 0
            frames = [fmt.frame(fmt.DROP, fmt.DROP_BODY.pack(criterion))]
            await self._thread(lambda: self._write_batch(frames))
            dropped = index.drop(criterion)
        if self._worth_compacting():
            try:
                await self.compact()
            except StoreError as exc:  # the drop stands; the space is given back later
                _events.warning("store_compaction_failed", "%s: compaction failed: %s",
                                self._path, exc, key=f"compact:{self._path}", path=self._path,
                                error=str(exc))
        return dropped

    @property
    def log_bytes(self) -> int:
        """Bytes of the segment files."""
        return sum(self._sizes.values())

    @property
    def live_bytes(self) -> int:
        """Bytes of the frames that hold events the store still serves."""
        return self._idx().live

    def _worth_compacting(self) -> bool:
        if self._index is None or self._compacting.locked() or self._damage_waits:
            return False
        dead = self.log_bytes - self._index.live
        return dead >= self._segment_bytes and dead >= self._index.live

    async def compact(self) -> int:
        """Give back the space of dropped chains and cut records; return the bytes freed.

        Copies every record the store still serves into a new base segment
        (checking each against its hash), then unlinks the segments before it.
        Appends and reads go on meanwhile; appends wait only while the store
        switches to the base and while it points a part of its index there.
        :meth:`drop` calls this when the unneeded bytes reach both
        ``segment_bytes`` and the needed ones. Does nothing (returns 0) while a
        damaged record waits to be quarantined. Raises
        :class:`~ketten.errors.StoreCorrupted` (a record does not match its
        hash; nothing is changed) or :class:`~ketten.errors.StoreError`.
        """
        self._idx()
        async with self._compacting:
            async with self._write_lock:
                index, files = self._idx(), self._fls()
                frozen = index.freeze()
                await self._thread(self._roll_for_base)
                number = self._wseg - 1
            planned = await self._thread(lambda: layout(frozen))
            self._damage_waits = planned is None
            if planned is None:
                return 0
            records, marks = planned
            tmp = f"{files.path_of(number)}.compact{TMP_SUFFIX}"
            try:
                moved, size = await self._thread(
                    lambda: write_base(files, tmp, number, records, marks))
                async with self._write_lock:
                    self._idx()
                    old = [n for n in self._sizes if n < number]
                    freed = sum(self._sizes[n] for n in old) - size
                    await self._thread(lambda: self._switch(tmp, number, old))
                    self._sizes[number] = size
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            # The base is in force. The old segments stay until no location in the
            # index names them; the index is pointed at the base a part at a time,
            # so that appends wait for one part only.
            await self._relocate(moved, number)
            async with self._write_lock:
                await self._thread(lambda: self._clean_up(number, old))
                self._retire(old)
        _events.info("store_compacted", "%s: compacted %d segments into %s, %d bytes freed",
                     self._path, len(old), fmt.segment_name(number), freed,
                     key=f"compacted:{self._path}", path=self._path, freed=freed)
        return freed

    async def _relocate(self, moved: dict[Loc, Loc], below: int) -> None:
        index = self._idx()
        for part in index.relocation_parts(below, _RELOCATE_PART):
            async with self._write_lock:
                index.relocate(part, moved, below)

    def _roll_for_base(self) -> None:
        """Start an empty segment for the base (a compaction that does not finish
        leaves it empty, which a replay passes over) and a new one to write to."""
        self._check_writable()
        self._roll()
        self._roll()

    def _switch(self, tmp: str, number: int, old: list[int]) -> None:
        """Put the base in force: from then on a replay starts there, and the old
        segments are garbage (removed at the next open if not before)."""
        files = self._fls()
        try:
            if fmt.check_directory(self._path) != fmt.FORMAT_VERSION:
                atomic_write(os.path.join(self._path, fmt.MARKER), fmt.marker_bytes())
            files.keep_open(old)  # reads that took their locations before go on
            files.forget([number])
            os.replace(tmp, files.path_of(number))
            fsync_dir(self._path)
        except OSError as exc:
            raise StoreError(f"{self._path}: cannot put a compacted segment in force: {exc}") from exc

    def _clean_up(self, number: int, old: list[int]) -> None:
        """Unlink the segments a base replaced (nothing in the index names them now)."""
        files = self._fls()
        self._sizes = {n: v for n, v in self._sizes.items() if n >= number}
        try:
            spans = {k: v for k, v in self._spans.items() if k[0] > number}
            if spans != self._spans:
                atomic_write(os.path.join(self._path, _QUARANTINE_FILE), fmt.encode_spans(spans))
                self._spans = spans
            for n in old:
                os.unlink(files.path_of(n))
            fsync_dir(self._path)
        except OSError as exc:
            _events.warning("store_compaction_cleanup", "%s: the segments before %s stay until "
                            "the next open: %s", self._path, fmt.segment_name(number), exc,
                            key=f"cleanup:{self._path}", path=self._path, error=str(exc))

    def _retire(self, numbers: list[int]) -> None:
        files = self._fls()
        if self._reading:
            self._retired.extend(numbers)
        else:
            files.forget(numbers)

    async def quarantined(self) -> dict[bytes, tuple[int, int]]:
        """``{criterion: (from_seq, old_height)}`` of quarantined ranges not yet refilled.

        Raises :class:`~ketten.errors.StoreError`.
        """
        index = self._idx()
        await trio.lowlevel.checkpoint()
        return {
            c: (low, high) for c, (low, high) in index.quarantined.items()
            if (index.chains[c].height if c in index.chains else 0) < high
        }

    def _cursor_path(self, name: str) -> str:
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:40]
        return os.path.join(self._path, _CURSORS, digest)

    async def put_cursor(self, name: str, value: bytes) -> None:
        """Store a cursor atomically and durably. Raises :class:`~ketten.errors.StoreError`."""
        self._idx()
        data = fmt.encode_cursor(name, bytes(value))
        path = self._cursor_path(name)
        async with self._write_lock:
            self._idx()
            await self._thread(lambda: atomic_write(path, data))

    async def get_cursor(self, name: str) -> bytes | None:
        """A stored cursor, or ``None``. Raises :class:`~ketten.errors.StoreCorrupted`."""
        self._idx()
        path = self._cursor_path(name)

        def read() -> bytes | None:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                return None
            stored, value = fmt.decode_cursor(path, data)
            return value if stored == name else None

        return await self._thread(read)

    async def cursors(self, prefix: str) -> dict[str, bytes]:
        """Every cursor whose name starts with ``prefix``. Raises :class:`~ketten.errors.StoreCorrupted`."""
        self._idx()
        folder = os.path.join(self._path, _CURSORS)

        def scan() -> dict[str, bytes]:
            out: dict[str, bytes] = {}
            try:
                names = sorted(os.listdir(folder))
            except FileNotFoundError:
                return out
            for entry in names:
                if not _CURSOR_NAME.match(entry):
                    continue  # a write in progress (or left by a crash), or not ours
                path = os.path.join(folder, entry)
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except FileNotFoundError:
                    continue
                stored, value = fmt.decode_cursor(path, data)
                if stored.startswith(prefix) and self._cursor_path(stored) == path:
                    out[stored] = value
            return out

        return await self._thread(scan)

    # -- reads -------------------------------------------------------------

    async def get(self, event_hash: bytes) -> Event | None:
        """The event with this hash (main chain or orphan), or ``None``.

        Raises :class:`~ketten.errors.StoreCorrupted`, :class:`~ketten.errors.StoreError`.
        """
        index, files = self._idx(), self._fls()
        loc = index.by_hash.get(event_hash)
        if loc is None:
            await trio.lowlevel.checkpoint()
            return None
        raw = await self._read(lambda: read_one(files, loc, event_hash))
        return _decode(raw, files.path_of(loc[0]), loc)

    async def head(self, criterion: bytes) -> Event | None:
        """The head of the chain, or ``None``. Raises :class:`~ketten.errors.StoreCorrupted`."""
        index = self._idx()
        chain = index.chains.get(criterion)
        if chain is None or not chain.height:
            await trio.lowlevel.checkpoint()
            return None
        events = await self.range(criterion, chain.height - 1, chain.height)
        return events[0]

    async def heads(self) -> Mapping[bytes, tuple[int, bytes]]:
        """``{criterion: (head seq, head hash)}``.

        Raises :class:`~ketten.errors.StoreCorrupted` if a head is damaged.
        """
        index, files = self._idx(), self._fls()
        await trio.lowlevel.checkpoint()
        out: dict[bytes, tuple[int, bytes]] = {}
        for criterion, (seq, digest) in index.heads().items():
            if digest is None:
                loc = index.chains[criterion].locs[seq]
                raise StoreCorrupted(
                    f"the head (seq {seq}) of criterion {_short(criterion)} is damaged",
                    path=files.path_of(loc[0]), offset=loc[1], criterion=criterion, seq=seq,
                )
            out[criterion] = (seq, digest)
        return out

    async def range(self, criterion: bytes, start: int = 0, stop: int | None = None) -> list[Event]:
        """Main-chain events with ``start <= seq < stop``, in order.

        Raises :class:`~ketten.errors.StoreCorrupted` (the range holds a damaged
        record: nothing is returned), :class:`~ketten.errors.StoreError`.
        """
        index, files = self._idx(), self._fls()
        chain = index.chains.get(criterion)
        if chain is None:
            await trio.lowlevel.checkpoint()
            return []
        part = snapshot(chain, start, stop)
        if not part.locs:
            await trio.lowlevel.checkpoint()
            return []

        def read() -> list[Event]:
            return [
                _decode(raw, files.path_of(loc[0]), loc)
                for _, _, raw, loc in read_main(files, criterion, part)
            ]

        return await self._read(read)

    async def by_command(self, criterion: bytes, author: bytes, command: int) -> Event | None:
        """The main-chain event with this command id, or ``None``.

        Raises :class:`~ketten.errors.StoreCorrupted`, :class:`~ketten.errors.StoreError`.
        """
        index = self._idx()
        chain = index.chains.get(criterion)
        seq = chain.commands.get((author, command)) if chain is not None else None
        if seq is None:
            await trio.lowlevel.checkpoint()
            return None
        events = await self.range(criterion, seq, seq + 1)
        return events[0] if events else None

    async def orphans(self, criterion: bytes) -> list[Event]:
        """Events that lost a fork, oldest first. Raises :class:`~ketten.errors.StoreCorrupted`."""
        index, files = self._idx(), self._fls()
        chain = index.chains.get(criterion)
        if chain is None or not chain.orphans:
            await trio.lowlevel.checkpoint()
            return []
        entries = list(chain.orphans)

        def read() -> list[Event]:
            return [
                _decode(raw, files.path_of(loc[0]), loc)
                for _, _, raw, loc in read_orphans(files, criterion, entries)
            ]

        return await self._read(read)


class FileReader:
    """Read-only access to a file store directory (a :class:`~ketten.interfaces.StoreReader`).

    Opening replays the log up to its last committed batch (also while a node
    appends: a batch in progress is not seen) and reads that snapshot; the
    segments stay open, so a compaction by the node does not disturb it.
    Raises :class:`~ketten.errors.StoreFormatError` or
    :class:`~ketten.errors.StoreCorrupted` when opened.
    """

    def __init__(self, path: str) -> None:
        self._path = os.path.abspath(path)
        if fmt.check_directory(self._path) is None:
            raise StoreFormatError(f"{self._path}: no file store here")
        files = SegmentFiles(self._path)
        for attempt in range(5):
            try:
                self._index, _, _, _ = load_index(self._path, _load_spans(self._path), files)
                break
            except FileNotFoundError:
                # A compaction of the running node removed a segment under us; its
                # base is in place now.
                files.close()
                if attempt == 4:
                    raise StoreError(f"{self._path}: segments kept changing while being "
                                     "opened (a compaction in progress); try again") from None
            except BaseException:
                files.close()
                raise
        self._files: SegmentFiles | None = files

    def _fls(self) -> SegmentFiles:
        if self._files is None:
            raise StoreError(f"{self._path}: the reader is closed")
        return self._files

    def criteria(self) -> list[bytes]:
        """Keys of every stored chain, sorted."""
        return sorted(c for c, chain in self._index.chains.items() if chain.height)

    def heads(self) -> Mapping[bytes, tuple[int, bytes]]:
        """``{criterion: (head seq, head hash)}``. Raises :class:`StoreCorrupted` for a damaged head."""
        out = {}
        for criterion, (seq, digest) in sorted(self._index.heads().items()):
            if digest is None:
                loc = self._index.chains[criterion].locs[seq]
                raise StoreCorrupted(
                    f"the head (seq {seq}) of criterion {_short(criterion)} is damaged",
                    path=self._fls().path_of(loc[0]), offset=loc[1], criterion=criterion, seq=seq,
                )
            out[criterion] = (seq, digest)
        return out

    def read_encoded(
        self, criterion: bytes, start: int = 0, stop: int | None = None, *, check: bool = True
    ) -> Iterator[tuple[int, bytes]]:
        """``(seq, canonical bytes)`` of the main chain, ``start <= seq < stop``.

        With ``check``, every record is proven against its indexed hash and
        chain position; without, only frame checksums are checked (the caller
        proves the hash links). Raises :class:`~ketten.errors.StoreCorrupted`.
        """
        chain = self._index.chains.get(criterion)
        if chain is None:
            return
        part = snapshot(chain, start, stop)
        if not check:
            yield from read_main_unchecked(self._fls(), criterion, part)
            return
        for seq, _, raw, _ in read_main(self._fls(), criterion, part):
            yield seq, raw

    def orphans_encoded(self, criterion: bytes) -> Iterator[bytes]:
        """Canonical bytes of the orphans of a chain, oldest first, checked."""
        chain = self._index.chains.get(criterion)
        if chain is None:
            return
        for _, _, raw, _ in read_orphans(self._fls(), criterion, list(chain.orphans)):
            yield raw

    def close(self) -> None:
        """Close the segment files."""
        if self._files is not None:
            self._files.close()
            self._files = None


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"store": ["file"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("store", "file"):
        return None
    return PluginSpec({
        "path": Option("the store directory", (str, os.PathLike)),
        "segment_bytes": Option("size after which a new segment file is started", int),
    })


@hookimpl
def ketten_make_store(name: str, options: Mapping[str, Any], node: Node) -> FileStore | None:
    if name != "file":
        return None
    segment_bytes = options.get("segment_bytes", _DEFAULT_SEGMENT_BYTES)
    if type(segment_bytes) is not int or segment_bytes < 1:
        raise ConfigError(f"store option 'segment_bytes' must be a positive int, got "
                          f"{segment_bytes!r}")
    return FileStore(path=store_path(options, "file"), segment_bytes=segment_bytes)


@hookimpl
def ketten_open_store_reader(path: str) -> FileReader | None:
    if not os.path.isfile(os.path.join(path, fmt.MARKER)):
        return None
    return FileReader(path)
