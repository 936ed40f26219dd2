"""Writing the base segment of a ``file`` store compaction.

A base segment holds every event the index still needs (main-chain events
and orphans) and the quarantined ranges, nothing else: the frames of dropped
chains, cut records and control frames stay behind in the segments it
replaces. Main-chain events are copied in log order, which keeps each
chain's in sequence order, orphans in the order they lost their forks, and
each record is checked against its hash on the way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from hashlib import sha256

from ketten.errors import StoreCorrupted, StoreError

from . import _format as fmt
from ._index import Loc
from ._read import SegmentFiles

__all__ = ["write_base"]

_BATCH_FRAMES = 1024
_SPAN_BYTES = 4 << 20
_WRITE_BYTES = 4 << 20


def write_base(
    files: SegmentFiles,
    path: str,
    number: int,
    records: Sequence[tuple[int, Loc, bytes]],
    marks: Sequence[tuple[bytes, int, int]],
) -> tuple[dict[Loc, Loc], int]:
    """Write base segment ``number`` to ``path`` (a temporary file) durably.

    ``records`` are ``(EVENT or ORPHAN, location, hash)``, each chain's orphans
    in their order; returns where each location went and the file's size. Raises
    :class:`~ketten.errors.StoreCorrupted` (a record does not match its
    hash: nothing is written) or :class:`~ketten.errors.StoreError` (I/O).
    """
    # Main-chain events in log order (which is each chain's seq order); orphans
    # as listed, which is the order they lost their forks in.
    ordered = sorted((r for r in records if r[0] == fmt.EVENT), key=lambda r: r[1])
    ordered += [r for r in records if r[0] != fmt.EVENT]
    moved: dict[Loc, Loc] = {}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise StoreError(f"{path}: cannot write a compacted segment: {exc}") from exc
    try:
        out = _Writer(fd)
        out.frames([fmt.frame(fmt.BASE, fmt.BASE_BODY.pack(number))])
        batch: list[bytes] = []
        pos = out.size
        for (kind, loc, digest), body in zip(ordered, _bodies(files, ordered)):
            # The hash proves the body; the frame around it is written anew.
            if sha256(body).digest() != digest:
                raise StoreCorrupted("the record does not match its hash (found while "
                                     "compacting)", path=files.path_of(loc[0]), offset=loc[1])
            framed = fmt.frame(kind, body)
            moved[loc] = (number, pos, pos + len(framed))
            pos += len(framed)
            batch.append(framed)
            if len(batch) == _BATCH_FRAMES:
                out.frames(batch)
                batch, pos = [], out.size
        if batch:
            out.frames(batch)
        if marks:
            out.frames([fmt.frame(fmt.MARK, fmt.MARK_BODY.pack(*m)) for m in marks])
        out.flush()
        os.fsync(fd)
        return moved, out.size
    except OSError as exc:
        raise StoreError(f"{path}: cannot write a compacted segment: {exc}") from exc
    finally:
        os.close(fd)


def _bodies(files: SegmentFiles, records: Sequence[tuple[int, Loc, bytes]]) -> Iterator[bytes]:
    """The frame body at each record's location, read a span at a time (a span of
    records in one segment, in order, may hold frames no record needs)."""
    i = 0
    while i < len(records):
        seg, start, end = records[i][1]
        j = i + 1
        while j < len(records):
            nseg, noff, nend = records[j][1]
            if nseg != seg or noff < end or nend - start > _SPAN_BYTES:
                break
            end = nend
            j += 1
        chunk = files.read(seg, start, end - start)
        if len(chunk) != end - start:
            raise StoreCorrupted("the segment ends before a record it holds",
                                 path=files.path_of(seg), offset=len(chunk) + start)
        for _, (_, off, frame_end), _ in records[i:j]:
            yield chunk[off - start + fmt.HEADER_SIZE : frame_end - start]
        i = j


class _Writer:
    """Batches closed by COMMIT frames, written in large chunks."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.size = 0

    def frames(self, frames: list[bytes]) -> None:
        data = b"".join(frames) + fmt.frame(fmt.COMMIT, fmt.COMMIT_BODY.pack(len(frames)))
        self._pending.append(data)
        self._pending_bytes += len(data)
        self.size += len(data)
        if self._pending_bytes >= _WRITE_BYTES:
            self.flush()

    def flush(self) -> None:
        view = memoryview(b"".join(self._pending))
        while view:
            view = view[os.write(self._fd, view):]
        self._pending, self._pending_bytes = [], 0
