"""Decoded event fields to Arrow record batches, column by column."""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

from ._decode import Run
from ._schema import arrow_schema

__all__ = ["MAX_TIME_MS", "build_batch", "run_batch"]

MAX_TIME_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z, the last instant a Spark timestamp holds."""
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_ZERO_KEY = bytes(32)
_USED = frozenset({2, 3, 4, 5, 6, 7, 8})
_SCHEMAS = {False: arrow_schema(orphans=False), True: arrow_schema(orphans=True)}


def _hex_column(values: Sequence[bytes], width: int = 32) -> pa.Array:
    """Lowercase hex of equally long byte strings, built without a Python loop."""
    n = len(values)
    data = binascii.hexlify(b"".join(values))
    step = 2 * width
    if len(data) != step * n:
        return pa.array([v.hex() for v in values], type=pa.string())
    offsets = np.arange(0, step * (n + 1), step, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def _repeated(text: str, n: int) -> pa.Array:
    width = len(text)
    offsets = np.arange(0, width * (n + 1), width, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer((text * n).encode()))


def _prev_column(values: Sequence[bytes | None], missing: np.ndarray[Any, Any]) -> pa.Array:
    """Hex of ``prev``; decoding guarantees it is ``None`` exactly where seq is 0."""
    if not missing.any():
        return _hex_column(values)  # type: ignore[arg-type]
    filled = [_ZERO_KEY if v is None else v for v in values]
    column = _hex_column(filled)
    validity = pa.array(~missing).buffers()[1]
    return pa.StringArray.from_buffers(
        len(values), column.buffers()[1], column.buffers()[2], validity, int(missing.sum())
    )


def _hex_matrix(rows: np.ndarray[Any, Any]) -> pa.Array:
    """Lowercase hex of each row of an ``(n, width)`` byte matrix."""
    n, width = rows.shape
    step = 2 * width
    offsets = np.arange(0, step * (n + 1), step, dtype=np.int32)
    data = binascii.hexlify(rows.tobytes())
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def _time_column(values: Sequence[int] | np.ndarray[Any, Any]) -> pa.Array:
    millis = np.asarray(values, dtype=np.uint64)
    late = millis > MAX_TIME_MS
    micros = (np.where(late, 0, millis) * 1000).astype(np.int64)
    return pa.array(micros, type=_TIMESTAMP, mask=late if late.any() else None)


def build_batch(
    criterion_hex: str,
    rows: Sequence[list[Any]],
    digests: Sequence[bytes],
    replicas: np.ndarray[Any, Any] | int,
    *,
    orphan: bool | None = None,
) -> pa.RecordBatch:
    """One record batch from decoded events (``decode_fields`` lists) of one chain.

    ``replicas`` is a per-row agreement count or one count for every row;
    ``orphan`` is ``None`` when the schema has no ``orphan`` column. A time
    beyond what Spark can hold reads as null.
    """
    n = len(rows)
    columns = [list(map(itemgetter(i), rows)) if i in _USED else [] for i in range(11)]
    if isinstance(replicas, int):
        agreement = pa.array(np.full(n, replicas, dtype=np.int32))
    else:
        agreement = pa.array(replicas.astype(np.int32, copy=False))
    seqs = np.array(columns[2], dtype=np.int64)
    arrays = [
        _repeated(criterion_hex, n),
        pa.array(seqs),
        _hex_column(digests),
        _prev_column(columns[3], seqs == 0),
        _hex_column(columns[4]),
        pa.array(columns[5], type=pa.int64()),
        pa.array(columns[6], type=pa.binary()),
        _time_column(columns[7]),
        pa.array(columns[8], type=pa.binary()),
        agreement,
    ]
    if orphan is not None:
        arrays.append(pa.array(np.full(n, orphan, dtype=bool)))
    return pa.RecordBatch.from_arrays(arrays, schema=_SCHEMAS[orphan is not None])


def _agreement(replicas: np.ndarray[Any, Any] | int, n: int) -> pa.Array:
    if isinstance(replicas, int):
        return pa.array(np.full(n, replicas, dtype=np.int32))
    return pa.array(replicas.astype(np.int32, copy=False))


def run_batch(
    criterion_hex: str,
    run: Run,
    replicas: np.ndarray[Any, Any] | int,
    *,
    orphan: bool | None = None,
) -> pa.RecordBatch:
    """One record batch from a decoded run of one chain (see :func:`build_batch`)."""
    n = len(run)
    prev = _hex_matrix(run.prev)
    if run.prev_null.any():
        validity = pa.array(~run.prev_null).buffers()[1]
        prev = pa.StringArray.from_buffers(
            n, prev.buffers()[1], prev.buffers()[2], validity, int(run.prev_null.sum())
        )
    step = 64
    hashes = pa.StringArray.from_buffers(
        n, pa.py_buffer(np.arange(0, step * (n + 1), step, dtype=np.int32)),
        pa.py_buffer(run.hex_digests()),
    )
    arrays = [
        _repeated(criterion_hex, n),
        pa.array(run.seqs),
        hashes,
        prev,
        _hex_matrix(run.author),
        pa.array(run.command, mask=run.command_null if run.command_null.any() else None),
        run.clock,
        _time_column(run.time),
        run.payload,
        _agreement(replicas, n),
    ]
    if orphan is not None:
        arrays.append(pa.array(np.full(n, orphan, dtype=bool)))
    return pa.RecordBatch.from_arrays(arrays, schema=_SCHEMAS[orphan is not None])
