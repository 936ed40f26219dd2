"""Reading planned slices from store directories into Arrow record batches.

A slice of a chain is read in runs of stored encodings, each decoded and
checked as a unit (:mod:`._chunk`: column-wise, or event by event with
:func:`ketten.scan_encoded_chain`; no :class:`~ketten.Event` objects). With
``verify`` other than ``none`` an event is only emitted once its successor
has been seen to link to it (or, for the head, once its hash matches the head
the store records), so a damaged event never reaches a DataFrame, not even
as the last row before the damage. Since that proves every stored record,
the store is read with ``check=False`` (each hash is computed once); when a
damage is found, a checked read of the unconfirmed events names the damaged
record as the store sees it. ``verify=none`` checks structure only: no
links and no record hashes (what a store checks while reading anyway, such
as the file store's frame checksums, still applies).
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterator
from itertools import islice
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

from ketten._core.chain import Verify, WriterPolicy
from ketten._core.event import decode_fields, signed_part
from ketten._core.identity import verify_signature
from ketten.errors import DecodeError, InvalidEvent, InvalidSignature, KettenError, StoreCorrupted
from ketten.interfaces import StoreReader

from ._arrow import build_batch
from ._chunk import Chunk, verify_chunk
from ._options import ReadOptions
from ._plan import Slice
from ._stores import open_reader

__all__ = ["DamagedChain", "read_slices"]

log = logging.getLogger("ketten.spark")

_MAX_STORED_EVENT = 1 << 30
_MAX_BATCH_BYTES = 64 << 20
_FIRST_BATCH_ROWS = 256
_GC_THRESHOLD = 100_000
_RAW = itemgetter(1)


class DamagedChain(StoreCorrupted):
    """A stored chain failed verification at ``seq``.

    ``criterion`` is the chain's key, ``path`` the store directory read.
    """

    def __init__(self, criterion: bytes, seq: int | None, path: str, reason: str) -> None:
        self.reason = reason
        at = f"seq {seq}" if seq is not None else "orphans"
        super().__init__(f"criterion {criterion.hex()} {at}: {reason}", path=path,
                         criterion=criterion, seq=seq)
        self.criterion: bytes = criterion

    def __reduce__(self) -> tuple[Any, ...]:
        return (DamagedChain, (self.criterion, self.seq, self.path, self.reason))


def _report(damage: DamagedChain, options: ReadOptions) -> None:
    log.warning("skipping the rest of a damaged chain: %s", damage)
    if options.damaged_path is None:
        return
    os.makedirs(options.damaged_path, exist_ok=True)
    record = {
        "criterion": damage.criterion.hex(),
        "seq": damage.seq,
        "path": damage.path,
        "error": damage.reason,
    }
    name = f"{damage.criterion.hex()}-{uuid.uuid4().hex}.json"
    final = os.path.join(options.damaged_path, name)
    temporary = os.path.join(options.damaged_path, f".{name}.tmp")
    with open(temporary, "w", encoding="utf-8") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")
    os.replace(temporary, final)


def _damage(criterion: bytes, seq: int | None, path: str, exc: KettenError) -> DamagedChain:
    if isinstance(exc, DamagedChain):
        return exc
    if isinstance(exc, StoreCorrupted) and exc.seq is not None and exc.criterion == criterion:
        seq = exc.seq
    return DamagedChain(criterion, seq, path, f"{type(exc).__name__}: {exc}")


class _Follower:
    """Another replica of the chain, read in step to count agreement."""

    def __init__(self, path: str, events: Iterator[tuple[int, bytes]]) -> None:
        self._path = path
        self._events = events
        self._current: tuple[int, bytes] | None = None
        self._done = False

    def at(self, seq: int) -> bytes | None:
        while not self._done and (self._current is None or self._current[0] < seq):
            try:
                self._current = next(self._events)
            except StopIteration:
                self._done = True
            except KettenError as exc:
                log.warning("replica %s unreadable from seq %d: %s", self._path, seq, exc)
                self._done = True
        if self._current is not None and self._current[0] == seq:
            return self._current[1]
        return None

    def agreement(self, seqs: list[int], raws: list[bytes]) -> np.ndarray[Any, Any]:
        return np.fromiter(
            (self.at(seq) == raw for seq, raw in zip(seqs, raws)), dtype=np.int32, count=len(raws)
        )


def _one(reader: StoreReader, criterion: bytes, seq: int) -> bytes | None:
    for _, raw in reader.read_encoded(criterion, seq, seq + 1):
        return raw
    return None


class _SliceReader:
    """Reads one slice; holds the readers of the partition it belongs to."""

    def __init__(self, options: ReadOptions, readers: dict[str, StoreReader]) -> None:
        self._options = options
        self._readers = readers
        self._orphan_column: bool | None = False if options.include_orphans else None
        # Rows per read, adapted to the payload sizes seen; chains of one
        # partition tend to look alike, so the next slice starts where this one ended.
        self._size = min(_FIRST_BATCH_ROWS, options.batch_rows)

    def reader(self, path: str) -> StoreReader:
        reader = self._readers.get(path)
        if reader is None:
            reader = self._readers[path] = open_reader(path)
        return reader

    # -- main chain --------------------------------------------------------

    def main(self, piece: Slice) -> Iterator[pa.RecordBatch]:
        assert piece.stop is not None
        stop: int = piece.stop
        options = self._options
        criterion = piece.criterion
        criterion_hex = criterion.hex()
        verify = options.verify
        hold = 0 if verify is Verify.NONE else 1
        # With verification, the scan below proves every record, so the
        # store need not prove them again; a damage found is then located
        # by a checked read (see _located). ``none`` checks structure only,
        # so the store's record checks are skipped as well.
        orphan = False if self._orphan_column is not None else None
        source = self.reader(piece.source)
        followers = [
            _Follower(p, self.reader(p).read_encoded(criterion, piece.start, stop))
            for p in piece.others
        ]
        failure: list[KettenError] = []
        last_emitted = piece.start - 1

        def emit(chunk: Chunk, raws: list[bytes], count: int) -> pa.RecordBatch:
            nonlocal last_emitted
            agreement: np.ndarray[Any, Any] | int = 1
            if followers:
                seqs = chunk.seqs()[:count]
                agreement = np.ones(count, dtype=np.int32)
                for follower in followers:
                    agreement += follower.agreement(seqs, raws[:count])
            last_emitted = chunk.seq(count - 1)
            return chunk.batch(criterion_hex, 0, count, agreement, orphan)

        chunk: Chunk | None = None
        raws: list[bytes] = []
        error: KettenError | None = None
        first_seq = piece.start
        try:
            link, policy = self._entry(piece, source)
        except (DecodeError, InvalidEvent, StoreCorrupted) as exc:
            failure.append(exc)
            entry_failed = True
        else:
            entry_failed = False
            encoded = source.read_encoded(criterion, piece.start, stop + hold, check=False)
            size = self._size
            carry: list[bytes] = []
            while True:
                read: list[tuple[int, bytes]] = []
                try:
                    # On failure, ``read`` keeps what came before (list.extend
                    # appends as it goes).
                    read.extend(islice(encoded, size))
                except StoreCorrupted as exc:
                    failure.append(exc)
                new = list(map(_RAW, read))
                raws = carry + new
                if not raws:
                    chunk = None
                    break
                chunk, error = verify_chunk(
                    raws, verify=verify, criterion=criterion, link=link, first_seq=first_seq,
                    policy=policy, max_size=_MAX_STORED_EVENT,
                )
                if verify is Verify.FULL and first_seq == 0 and len(chunk):
                    writers = chunk.genesis_writers()
                    policy = WriterPolicy(frozenset(writers) if writers is not None else None)
                if error is not None or failure or len(new) < size:
                    break
                ready = len(chunk) - hold
                if ready > 0:
                    batch = emit(chunk, raws, ready)
                    yield batch
                    link = chunk.digest(ready - 1)
                    first_seq = chunk.seq(ready - 1) + 1
                    carry = raws[ready:]
                    payload_bytes = batch.column(8).nbytes
                    if payload_bytes > _MAX_BATCH_BYTES:
                        size = max(size // 2, 1)
                    elif 2 * payload_bytes <= _MAX_BATCH_BYTES:
                        size = min(size * 2, options.batch_rows)
                    self._size = size
                else:
                    carry = raws
        if error is not None:
            failure.insert(0, error)
        count = len(chunk) if chunk is not None else 0

        def judge(count: int, cause: KettenError | None) -> DamagedChain | None:
            confirmed = hold == 0
            if count and chunk is not None and chunk.seq(count - 1) >= stop:
                confirmed = True
                count -= 1
            last_seq = chunk.seq(count - 1) if count and chunk is not None else last_emitted
            if cause is not None:
                return _damage(criterion, last_seq + 1, piece.source, cause)
            if last_seq < stop - 1:
                return DamagedChain(
                    criterion, last_seq + 1, piece.source,
                    f"the store lists the chain up to seq {stop - 1} at least, "
                    f"but returned it only up to seq {last_seq}",
                )
            if not confirmed and piece.head_hash is None:
                return DamagedChain(criterion, stop, piece.source,
                                    "the event after this range is missing")
            if not confirmed and count and chunk is not None and (
                chunk.digest(count - 1) != piece.head_hash
            ):
                return DamagedChain(criterion, last_seq, piece.source,
                                    "the event's hash differs from the head the store records")
            return None

        cause = failure[0] if failure else None
        damage = judge(count, cause)
        if damage is not None and not entry_failed:
            located = self._located(source, criterion, last_emitted + 1, damage)
            if located is not None:
                cause, at = located
                count = sum(1 for seq in (chunk.seqs() if chunk else []) if seq < at)
                damage = judge(count, cause)
        if count and chunk is not None and chunk.seq(count - 1) >= stop:
            count -= 1
        if damage is not None:
            if not options.skip_damaged:
                raise damage from cause
            _report(damage, options)
            if chunk is not None and count > hold:
                yield emit(chunk, raws, count - hold)
            return
        if chunk is not None and count:
            yield emit(chunk, raws, count)

    @staticmethod
    def _located(
        source: StoreReader, criterion: bytes, start: int, damage: DamagedChain
    ) -> tuple[StoreCorrupted, int] | None:
        """What a checked read of ``[start, damage.seq]`` finds, and at which seq, if anything.

        The scan sees a damaged record only where the next link breaks; the
        store's own checks name the record and where it lies on disk.
        """
        if damage.seq is None or damage.seq < start:
            return None
        try:
            for _ in source.read_encoded(criterion, start, damage.seq + 1):
                pass
        except StoreCorrupted as exc:
            if exc.seq is not None and start <= exc.seq <= damage.seq:
                return exc, exc.seq
        return None

    def _entry(self, piece: Slice, source: StoreReader) -> tuple[bytes | None, WriterPolicy | None]:
        """The hash a slice's first event must link to, and the chain's writer policy."""
        verify = self._options.verify
        if piece.start == 0 or verify is Verify.NONE:
            return None, None
        before = _one(source, piece.criterion, piece.start - 1)
        if before is None:
            raise DamagedChain(piece.criterion, piece.start - 1, piece.source, "event missing")
        policy = None
        if verify is Verify.FULL:
            genesis = _one(source, piece.criterion, 0)
            if genesis is None:
                raise DamagedChain(piece.criterion, 0, piece.source, "genesis missing")
            writers = decode_fields(genesis)[0][9]
            policy = WriterPolicy(frozenset(writers) if writers is not None else None)
        return hashlib.sha256(before).digest(), policy

    # -- orphans -----------------------------------------------------------

    def orphans(self, piece: Slice) -> Iterator[pa.RecordBatch]:
        """Events off the read branch: stored orphans and diverged replicas' chains."""
        criterion = piece.criterion
        found: dict[bytes, tuple[bytes, set[str]]] = {}

        def add(path: str, raw: bytes) -> None:
            digest = hashlib.sha256(raw).digest()
            entry = found.setdefault(digest, (raw, set()))
            entry[1].add(path)

        try:
            for path in (piece.source, *piece.others):
                for raw in self.reader(path).orphans_encoded(criterion):
                    add(path, raw)
            for path in piece.diverged:
                for raw in self._diverged(piece, path):
                    add(path, raw)
        except StoreCorrupted as exc:
            damage = _damage(criterion, None, piece.source, exc)
            if not self._options.skip_damaged:
                raise damage from exc
            _report(damage, self._options)
            return
        rows: list[list[Any]] = []
        digests: list[bytes] = []
        counts: list[int] = []
        source = self.reader(piece.source)
        for digest, (raw, holders) in found.items():
            try:
                fields = self._check_orphan(criterion, raw)
            except (DecodeError, InvalidEvent) as exc:
                damage = _damage(criterion, None, piece.source, exc)
                if not self._options.skip_damaged:
                    raise damage from exc
                _report(damage, self._options)
                continue
            seq = fields[2]
            if seq < piece.start or (piece.stop is not None and seq >= piece.stop):
                continue
            if _one(source, criterion, seq) == raw:
                continue
            rows.append(fields)
            digests.append(digest)
            counts.append(len(holders))
        order = sorted(range(len(rows)), key=lambda i: (rows[i][2], digests[i]))
        for begin in range(0, len(order), self._options.batch_rows):
            chosen = order[begin: begin + self._options.batch_rows]
            yield build_batch(
                criterion.hex(),
                [rows[i] for i in chosen],
                [digests[i] for i in chosen],
                np.array([counts[i] for i in chosen], dtype=np.int32),
                orphan=True,
            )

    def _check_orphan(self, criterion: bytes, raw: bytes) -> list[Any]:
        fields, _ = decode_fields(raw)
        if fields[1] != criterion:
            raise DecodeError(f"orphan seq {fields[2]} belongs to another criterion", where="orphan")
        if self._options.verify is Verify.FULL and not verify_signature(
            fields[4], fields[10], signed_part(raw)
        ):
            raise InvalidSignature(f"orphan seq {fields[2]}: signature does not verify")
        return fields

    def _diverged(self, piece: Slice, path: str) -> Iterator[bytes]:
        """The events of replica ``path``'s chain that are not on the source's chain."""
        ours = self.reader(piece.source).read_encoded(piece.criterion, 0)
        mine = _Follower(piece.source, ours)
        for seq, raw in self.reader(path).read_encoded(piece.criterion, 0):
            if mine.at(seq) != raw:
                yield raw


def read_slices(
    slices: tuple[Slice, ...], options: ReadOptions
) -> Iterator[pa.RecordBatch]:
    """The record batches of a partition's slices, in order.

    Raises :class:`DamagedChain` naming the criterion and seq of the first
    event that fails verification (unless ``skip_damaged``), and
    :class:`~ketten.errors.UsageError` for store directories that cannot be opened.
    """
    readers: dict[str, StoreReader] = {}
    scanner = _SliceReader(options, readers)
    # Decoded events are short-lived containers; frequent young-generation
    # collections over the buffered ones cost about a fifth of the read.
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], _GC_THRESHOLD), *thresholds[1:])
    try:
        for piece in slices:
            if piece.orphans:
                yield from scanner.orphans(piece)
            else:
                yield from scanner.main(piece)
    finally:
        gc.set_threshold(*thresholds)
        for reader in readers.values():
            reader.close()

