"""Checked reads of events from the segments of a ``file`` store.

Shared by the store and its offline reader. Consecutive frames are fetched
with one ``pread``; every frame's checksum and every event's hash and chain
position are checked before its bytes are returned.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator, Sequence
from hashlib import sha256

import attrs

from ketten.errors import StoreCorrupted, StoreError

from .._store_records import event_prefix, uint_bytes
from . import _format as fmt
from ._index import ChainIndex, Index, Loc, Segment, replay

__all__ = [
    "MainSlice", "SegmentFiles", "load_index", "read_main", "read_main_unchecked", "read_one",
    "read_orphans", "snapshot",
]

_CHUNK = 4 << 20
_HEAD = b"\x8b\x01\x58\x20"


class SegmentFiles:
    """Read-only file descriptors of the segments of one store directory."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fds: dict[int, int] = {}

    def path_of(self, number: int) -> str:
        return os.path.join(self._path, fmt.segment_name(number))

    def adopt(self, number: int, fd: int) -> None:
        """Use an already open descriptor for a segment."""
        old = self._fds.pop(number, None)
        if old is not None:
            os.close(old)
        self._fds[number] = fd

    def _fd(self, number: int) -> int:
        fd = self._fds.get(number)
        if fd is None:
            fd = self._fds[number] = os.open(self.path_of(number), os.O_RDONLY)
        return fd

    def bodies(self, locs: Sequence[Loc]) -> Iterator[tuple[Loc, bytes]]:
        """The checksum-verified body of the frame at each location, in order."""
        i = 0
        while i < len(locs):
            seg, start, end = locs[i]
            j = i + 1
            while (j < len(locs) and locs[j][0] == seg and locs[j][1] == locs[j - 1][2]
                   and locs[j][2] - start <= _CHUNK):
                end = locs[j][2]
                j += 1
            try:
                chunk = os.pread(self._fd(seg), end - start, start)
            except OSError as exc:
                raise StoreError(f"{self.path_of(seg)}: cannot read: {exc}") from exc
            size = len(chunk)
            for seg_, off, frame_end in locs[i:j]:
                found = fmt.parse_frame(chunk, off - start, size)
                if found is None or found[2] != frame_end - start or found[0] not in fmt.RECORDS:
                    raise StoreCorrupted(
                        "frame checksum mismatch or truncated frame",
                        path=self.path_of(seg_), offset=off,
                    )
                yield (seg_, off, frame_end), chunk[found[1] : found[2]]
            i = j

    def read(self, number: int, offset: int, size: int) -> bytes:
        """Bytes of a segment, unchecked. Raises :class:`~ketten.errors.StoreError`."""
        try:
            return os.pread(self._fd(number), size, offset)
        except OSError as exc:
            raise StoreError(f"{self.path_of(number)}: cannot read: {exc}") from exc

    def keep_open(self, numbers: Sequence[int]) -> None:
        """Open the segments now, so that reads go on after their files are unlinked."""
        for number in numbers:
            self._fd(number)

    def forget(self, numbers: Sequence[int]) -> None:
        """Close segments that are gone."""
        for number in numbers:
            fd = self._fds.pop(number, None)
            if fd is not None:
                os.close(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}


def snapshot(chain: ChainIndex, start: int, stop: int | None) -> MainSlice:
    """The locations and hashes of ``[start, stop)``, taken where the index is mutated."""
    start = max(start, 0)
    stop = chain.height if stop is None else min(stop, chain.height)
    if stop <= start:
        return MainSlice(start, [], [], None)
    prev = chain.hashes[start - 1] if start > 0 else None
    return MainSlice(start, chain.locs[start:stop], chain.hashes[start:stop], prev)


@attrs.frozen
class MainSlice:
    start: int
    locs: list[Loc]
    hashes: list[bytes | None]
    prev: bytes | None


def _main_bodies(files: SegmentFiles, criterion: bytes,
                 part: MainSlice) -> Iterator[tuple[Loc, bytes]]:
    """The frame bodies of a main-chain slice; a damaged frame is reported with its
    chain position, so that the node can quarantine the chain from there."""
    seq = part.start
    try:
        for found in files.bodies(part.locs):
            yield found
            seq += 1
    except StoreCorrupted as exc:
        if exc.criterion is not None or seq - part.start >= len(part.locs):
            raise
        raise _damaged(files, criterion, seq, part.locs[seq - part.start],
                       "frame checksum mismatch or truncated frame") from None


def read_main(
    files: SegmentFiles, criterion: bytes, part: MainSlice
) -> Iterator[tuple[int, bytes, bytes, Loc]]:
    """``(seq, hash, raw, location)`` of a slice of the main chain, each checked."""
    prev = part.prev
    seq = part.start
    for (loc, raw), digest in zip(_main_bodies(files, criterion, part), part.hashes):
        if digest is None:
            raise _damaged(files, criterion, seq, loc, "the record is damaged")
        if seq > 0 and prev is None:
            ok = raw.startswith(_HEAD + criterion + uint_bytes(seq))
        else:
            ok = raw.startswith(event_prefix(criterion, seq, prev))
        if not ok or _sha(raw) != digest:
            raise _damaged(files, criterion, seq, loc, "the record does not match its index entry")
        yield seq, digest, raw, loc
        prev = digest
        seq += 1


def read_main_unchecked(
    files: SegmentFiles, criterion: bytes, part: MainSlice
) -> Iterator[tuple[int, bytes]]:
    """``(seq, raw)`` of a slice of the main chain without the per-record hash and
    position checks (the caller proves the hash links); frame checksums are still checked."""
    seq = part.start
    for (loc, raw), digest in zip(_main_bodies(files, criterion, part), part.hashes):
        if digest is None:
            raise _damaged(files, criterion, seq, loc, "the record is damaged")
        yield seq, raw
        seq += 1


def read_orphans(
    files: SegmentFiles, criterion: bytes, entries: list[tuple[Loc, int, bytes | None]]
) -> Iterator[tuple[int, bytes, bytes, Loc]]:
    """``(seq, hash, raw, location)`` of orphans (a copy of the list), oldest first, checked."""
    for (loc, raw), (_, seq, digest) in zip(files.bodies([e[0] for e in entries]), entries):
        if digest is None or not raw.startswith(_HEAD + criterion + uint_bytes(seq)) or (
            _sha(raw) != digest
        ):
            raise _damaged(files, criterion, seq, loc, "the orphaned record is damaged")
        yield seq, digest, raw, loc


def read_one(files: SegmentFiles, loc: Loc, digest: bytes) -> bytes:
    """The checked bytes of the event with hash ``digest`` at ``loc``."""
    for _, raw in files.bodies([loc]):
        if _sha(raw) == digest:
            return raw
    raise StoreCorrupted("the record does not match its hash", path=files.path_of(loc[0]),
                        offset=loc[1])


def _sha(raw: bytes) -> bytes:
    return sha256(raw).digest()


def _damaged(files: SegmentFiles, criterion: bytes, seq: int, loc: Loc, why: str) -> StoreCorrupted:
    return StoreCorrupted(
        f"event seq {seq} of criterion {criterion.hex()[:16]}: {why}; the range is refused "
        "(quarantine it and repair it from peers)",
        path=files.path_of(loc[0]), offset=loc[1], criterion=criterion, seq=seq,
    )


def load_index(
    path: str, spans: dict[tuple[int, int], int], files: SegmentFiles
) -> tuple[Index, tuple[int, int], dict[int, int], list[int]]:
    """Replay the segments of ``path`` read-only, from the last base segment on.

    Returns the index, where valid data ends, the sizes of the segments
    replayed and the numbers of those before the last base (garbage a
    compaction left). The replayed segments are kept open in ``files``, so
    that a compaction that removes them later does not disturb reads. Raises
    :class:`~ketten.errors.StoreCorrupted`, and :class:`FileNotFoundError` if
    a compaction removed a segment while it was being opened (try again).
    """
    numbers = fmt.segment_numbers(os.listdir(path))
    segments: list[Segment] = []
    maps: list[mmap.mmap] = []
    try:
        for number in numbers:
            seg_path = os.path.join(path, fmt.segment_name(number))
            with open(seg_path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                data: bytes | mmap.mmap = b""
                if size:
                    data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
                    maps.append(data)
                files.adopt(number, os.dup(f.fileno()))
            segments.append(Segment(number, seg_path, data, size))
        first = max((i for i, seg in enumerate(segments) if fmt.is_base(seg.data, seg.size)),
                    default=0)
        stale, segments = [s.number for s in segments[:first]], segments[first:]
        replayed = [s.number for s in segments]
        if replayed:
            gaps = sorted(set(range(replayed[0], replayed[-1] + 1)) - set(replayed))
            if replayed[0] != 0 and not fmt.is_base(segments[0].data, segments[0].size):
                gaps.insert(0, replayed[0] - 1)
            if gaps:
                raise StoreCorrupted(f"segment {fmt.segment_name(gaps[0])} is missing", path=path)
        files.forget(stale)
        index = Index()
        end = replay(index, segments, spans)
        index.finish()
    finally:
        for m in maps:
            m.close()
    return index, end, {s.number: s.size for s in segments}, stale
