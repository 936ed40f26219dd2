"""A run of a chain's stored events, decoded and verified as a unit.

Runs in the common shape are decoded column-wise (:mod:`._decode`); the
others, and every run that fails a check, go event by event through
:func:`ketten.scan_encoded_chain`, which yields the events before the
failure and names the failing seq exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ketten._core.chain import ScannedEvent, Verify, WriterPolicy, scan_encoded_chain
from ketten.errors import DecodeError, InvalidEvent, KettenError

from ._arrow import build_batch, run_batch
from ._decode import Run, decode_run

__all__ = ["Chunk", "verify_chunk"]


class Chunk:
    """The verified prefix of a run of encoded events (maybe all of them)."""

    def __init__(self, run: Run | None, scanned: list[ScannedEvent]) -> None:
        self._run = run
        self._scanned = scanned
        self._batch: pa.RecordBatch | None = None

    def __len__(self) -> int:
        return len(self._run) if self._run is not None else len(self._scanned)

    def seq(self, i: int) -> int:
        if self._run is not None:
            return int(self._run.seqs[i])
        return self._scanned[i][0]

    def digest(self, i: int) -> bytes:
        if self._run is not None:
            return self._run.digest(i)
        return self._scanned[i][1]

    def seqs(self) -> list[int]:
        if self._run is not None:
            seqs: list[int] = self._run.seqs.tolist()
            return seqs
        return [event[0] for event in self._scanned]

    def genesis_writers(self) -> Any:
        """The writer list of the chunk's first event (a genesis)."""
        return self._scanned[0][2][9]

    def batch(
        self,
        criterion_hex: str,
        lo: int,
        hi: int,
        replicas: np.ndarray[Any, Any] | int,
        orphan: bool | None,
    ) -> pa.RecordBatch:
        """Rows ``lo`` to ``hi`` (exclusive); ``replicas`` counts agreement for those rows."""
        if self._run is not None:
            whole = np.ones(len(self), dtype=np.int32)
            whole[lo:hi] = replicas
            return run_batch(criterion_hex, self._run, whole, orphan=orphan).slice(lo, hi - lo)
        part = self._scanned[lo:hi]
        return build_batch(criterion_hex, [e[2] for e in part],
                           [e[1] for e in part], replicas, orphan=orphan)


def verify_chunk(
    raws: list[bytes],
    *,
    verify: Verify,
    criterion: bytes,
    link: bytes | None,
    first_seq: int,
    policy: WriterPolicy | None,
    max_size: int,
) -> tuple[Chunk, KettenError | None]:
    """Decode and check ``raws`` as the events from ``first_seq`` on (after hash ``link``).

    Returns the verified prefix and the error at the first event that fails
    (``None`` if all pass), as :func:`ketten.scan_encoded_chain` judges them.
    """
    if verify is not Verify.FULL:
        run = decode_run(raws, max_size=max_size, check_links=verify is Verify.LINKS,
                         criterion=criterion, link=link, first_seq=first_seq)
        if run is not None:
            return Chunk(run, []), None
    scanned: list[ScannedEvent] = []
    try:
        for event in scan_encoded_chain(
            raws, verify=verify, criterion=criterion, prev_hash=link, first_seq=first_seq,
            policy=policy, max_size=max_size,
        ):
            scanned.append(event)
    except (DecodeError, InvalidEvent) as exc:
        return Chunk(None, scanned), exc
    return Chunk(None, scanned), None
