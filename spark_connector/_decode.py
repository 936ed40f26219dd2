"""Decoding and link-checking a run of event encodings column-wise, without Python objects.

Only the common canonical shape is taken here (every head in its shortest
form, no writer list, byte strings under 4 GiB); :func:`decode_run` returns
``None`` for anything else, and for any run that fails a check, so that the
caller decodes it event by event with :func:`ketten.scan_encoded_chain`,
which names the exact error. What is accepted here is therefore exactly
what ``decode_fields`` accepts, with the same values.

Where the compiled decoder (``_cdecode.c``, built at install when a C
compiler is there) imports, it does the per-event work (heads, copies and
SHA-256) in one pass; the numpy decoder below is its reference and the
fallback. Both accept the same encodings and produce the same columns.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from hashlib import sha256
from typing import Any

import attrs
import numpy as np
import pyarrow as pa

_compiled_decode: Callable[[list[bytes], bytes | None, int], tuple[bytes, ...] | None] | None
try:
    from ._cdecode import decode as _compiled_decode
except ImportError:  # no compiler at install, or no libcrypto: numpy does it
    _compiled_decode = None

__all__ = ["COMPILED", "Run", "decode_run"]

COMPILED = _compiled_decode is not None
"""Whether the compiled decoder is in use."""

_PAD = bytes(80)
"""Reads run at most 48 bytes past the last encoding (clipped positions + a key)."""
_OFFSETS_MAX = (1 << 31) - 1
_U8 = np.dtype(">u8")
_KEY = np.dtype("V32")
_HEAD = np.dtype("V12")
_TWELVE = np.arange(12)
_TOP_BIT = np.uint64(1 << 63)

Array = np.ndarray[Any, Any]


@attrs.frozen(eq=False)
class Run:
    """Decoded events: numpy columns over the joined encodings."""

    seqs: Array
    digests: bytes
    """The events' hashes, joined."""
    prev: Array
    """``(n, 32)`` bytes; zero where ``prev_null``."""
    prev_null: Array
    author: Array
    command: Array
    command_null: Array
    time: Array
    """Unsigned 64-bit milliseconds."""
    clock: pa.Array
    payload: pa.Array

    def __len__(self) -> int:
        return len(self.seqs)

    def digest(self, i: int) -> bytes:
        return self.digests[32 * i: 32 * i + 32]

    def hex_digests(self) -> bytes:
        return binascii.hexlify(self.digests)


@attrs.frozen(eq=False)
class _Views:
    """Byte-granular views of the joined encodings (padded, so reads past the end are safe)."""

    byte: Array
    word: Array
    """Big-endian 64-bit words starting at each byte."""
    key: Array
    """32-byte strings starting at each byte."""
    head: Array
    """12-byte strings starting at each byte."""

    @classmethod
    def of(cls, data: bytes) -> _Views:
        size = len(data) - 31  # every view element lies within ``data``
        return cls(
            np.frombuffer(data, dtype=np.uint8),
            np.ndarray((size,), dtype=_U8, buffer=data, strides=(1,)),
            np.ndarray((size,), dtype=_KEY, buffer=data, strides=(1,)),
            np.ndarray((size,), dtype=_HEAD, buffer=data, strides=(1,)),
        )


def _head(views: _Views, pos: Array, major: int) -> tuple[Array, Array, Array]:
    """``(argument, next position, shortest-form ok)`` of CBOR heads of ``major`` at ``pos``."""
    info = views.byte[pos].astype(np.int64) - (major << 5)
    wide = views.word[pos + 1].astype(np.uint64)
    value = np.select(
        [info < 24, info == 24, info == 25, info == 26, info == 27],
        [info.astype(np.uint64), wide >> np.uint64(56), wide >> np.uint64(48),
         wide >> np.uint64(32), wide],
        np.uint64(0),
    )
    ok = ((info >= 0) & (info < 24)) | (
        ((info == 24) & (value >= 24)) | ((info == 25) & (value >= 0x100))
        | ((info == 26) & (value >= 0x10000))
    )
    if major == 0:
        ok |= (info == 27) & (value >= 0x100000000) & (value < _TOP_BIT)
    width = np.select([info < 24, info == 24, info == 25, info == 26], [1, 2, 3, 5], 9)
    return value, pos + width, ok


def _take(views: _Views, at: Array) -> Array:
    """The 32 bytes at each position, as an ``(n, 32)`` array."""
    return views.key[at].view(np.uint8).reshape(len(at), 32)


def _binary(views: _Views, data: bytes, at: Array, lengths: Array) -> pa.Array:
    """The byte strings at ``at`` (each ``lengths`` long) as one Arrow binary array.

    Built as an Arrow binary-view array over ``data`` (one 16-byte view per
    value) and copied into a plain binary array by Arrow's cast.
    """
    n = len(at)
    head = views.head[at].view(np.uint8).reshape(n, 12)
    inline = lengths <= 12
    tail = np.empty((n, 12), dtype=np.uint8)
    tail[:, :4] = head[:, :4]
    tail[:, 4:8] = 0
    tail[:, 8:] = at.astype("<i4").view(np.uint8).reshape(n, 4)
    if inline.any():
        short = head * (lengths[:, None] > _TWELVE)
        tail = np.where(inline[:, None], short, tail)
    packed = np.empty((n, 16), dtype=np.uint8)
    packed[:, :4] = lengths.astype("<i4").view(np.uint8).reshape(n, 4)
    packed[:, 4:] = tail
    array = pa.Array.from_buffers(
        pa.binary_view(), n, [None, pa.py_buffer(packed), pa.py_buffer(data)]
    )
    return array.cast(pa.binary())


def decode_run(
    raws: list[bytes],
    *,
    max_size: int,
    check_links: bool,
    criterion: bytes,
    link: bytes | None,
    first_seq: int,
    compiled: bool = True,
) -> Run | None:
    """Decode ``raws`` (events in seq order) if all are well formed and, with
    ``check_links``, form the chain run ``scan_encoded_chain`` would accept
    from ``first_seq`` after ``link`` under ``criterion``; else ``None``.

    ``compiled=False`` uses the numpy decoder even where the compiled one imports.
    """
    expected = criterion if check_links else None
    if compiled and _compiled_decode is not None:
        try:
            run = _decode_compiled(raws, max_size=max_size, criterion=expected)
        except TypeError:  # a bytes-like other than bytes, which numpy takes
            run = _decode_numpy(raws, max_size=max_size, criterion=expected)
    else:
        run = _decode_numpy(raws, max_size=max_size, criterion=expected)
    if run is None or not check_links or _links_hold(run, first_seq, link):
        return run
    return None


def _links_hold(run: Run, first_seq: int, link: bytes | None) -> bool:
    """Whether ``run`` holds seqs ``first_seq, first_seq + 1, ...``, each linking its predecessor."""
    n = len(run)
    if not (run.seqs == np.arange(first_seq, first_seq + n, dtype=np.int64)).all():
        return False
    hashes = np.frombuffer(run.digests, dtype=np.uint8).reshape(n, 32)
    if n > 1 and not (run.prev[1:] == hashes[:-1]).all():
        return False
    if first_seq != 0:
        return link is not None and bool((run.prev[0] == np.frombuffer(link, dtype=np.uint8)).all())
    return True


def _binary_column(offsets: bytes, data: bytes, n: int) -> pa.Array:
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _decode_compiled(raws: list[bytes], *, max_size: int, criterion: bytes | None) -> Run | None:
    assert _compiled_decode is not None
    columns = _compiled_decode(raws, criterion, max_size)
    if columns is None:
        return None
    (seqs, prev, prev_null, author, command, command_null, time,
     clock_offsets, clock, payload_offsets, payload, digests) = columns
    n = len(raws)
    return Run(
        seqs=np.frombuffer(seqs, dtype=np.int64),
        digests=digests,
        prev=np.frombuffer(prev, dtype=np.uint8).reshape(n, 32),
        prev_null=np.frombuffer(prev_null, dtype=np.bool_),
        author=np.frombuffer(author, dtype=np.uint8).reshape(n, 32),
        command=np.frombuffer(command, dtype=np.int64),
        command_null=np.frombuffer(command_null, dtype=np.bool_),
        time=np.frombuffer(time, dtype=np.uint64),
        clock=_binary_column(clock_offsets, clock, n),
        payload=_binary_column(payload_offsets, payload, n),
    )


def _decode_numpy(raws: list[bytes], *, max_size: int, criterion: bytes | None) -> Run | None:
    """The reference decoder; checks ``criterion`` where one is given."""
    n = len(raws)
    if n == 0:
        return None
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    if int(lengths.max()) > max_size:
        return None
    joined = b"".join(raws)
    limit = len(joined)
    if limit > _OFFSETS_MAX:
        return None
    data = joined + _PAD
    views = _Views.of(data)
    buf = views.byte
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    ends = starts + lengths

    def clip(pos: Array) -> Array:
        # Damaged heads can carry any length, wrapping to negative positions.
        return np.clip(pos, 0, limit)

    ok = (lengths >= 40) & (buf[starts] == 0x8B) & (buf[starts + 1] == 0x01)
    ok &= (buf[starts + 2] == 0x58) & (buf[starts + 3] == 0x20)
    seqs, pos, good = _head(views, clip(starts + 36), 0)
    ok &= good
    pos = clip(pos)
    prev_null = buf[pos] == 0xF6
    ok &= prev_null | ((buf[pos] == 0x58) & (buf[pos + 1] == 0x20))
    ok &= prev_null == (seqs == 0)
    prev_at = pos + 2
    pos = clip(np.where(prev_null, pos + 1, pos + 34))
    ok &= (buf[pos] == 0x58) & (buf[pos + 1] == 0x20)
    author_at = pos + 2
    pos = clip(pos + 34)
    command_null = buf[pos] == 0xF6
    command, after, good = _head(views, pos, 0)
    ok &= command_null | good
    pos = clip(np.where(command_null, pos + 1, after))
    clock_len, clock_at, good = _head(views, pos, 2)
    ok &= good
    pos = clip(clock_at + clock_len.astype(np.int64))
    time, pos, good = _head(views, pos, 0)
    ok &= good
    pos = clip(pos)
    payload_len, payload_at, good = _head(views, pos, 2)
    ok &= good
    pos = clip(payload_at + payload_len.astype(np.int64))
    ok &= buf[pos] == 0xF6
    pos = clip(pos + 1)
    ok &= (buf[pos] == 0x58) & (buf[pos + 1] == 0x40)
    ok &= pos + 66 == ends
    if not ok.all():
        return None
    seqs = seqs.astype(np.int64)
    clock_len = clock_len.astype(np.int64)
    payload_len = payload_len.astype(np.int64)
    if criterion is not None and not (
        _take(views, starts + 4) == np.frombuffer(criterion, dtype=np.uint8)
    ).all():
        return None
    digests = b"".join([sha256(raw).digest() for raw in raws])
    prev = _take(views, clip(prev_at))
    if prev_null.any():
        prev[prev_null] = 0
    return Run(
        seqs=seqs,
        digests=digests,
        prev=prev,
        prev_null=prev_null,
        author=_take(views, author_at),
        command=command.astype(np.int64),
        command_null=command_null,
        time=time,
        clock=_binary(views, data, clock_at, clock_len),
        payload=_binary(views, data, payload_at, payload_len),
    )
