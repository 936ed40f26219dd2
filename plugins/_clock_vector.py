"""The vector stamp ADT: a sparse map ``author -> counter`` and its codec.

A missing author counts as 0, so vectors of different sizes compare and
merge as if padded with zeros. Zero entries are never stored or encoded.
The encoding is a canonical CBOR map from 32-byte author keys to positive
counters; :func:`decode_vector` accepts exactly that and nothing else.

:class:`VectorDecoder` accepts exactly the same stamps, faster: it remembers
the *layouts* of recent stamps (author keys and the encoded width of each
counter). A stamp of a known layout is checked by comparing every byte that
is not counter payload with the layout's bytes (one masked comparison of big
integers), reading the counters with :mod:`struct` and checking each lies in
the range its width encodes canonically; anything else goes through
:func:`decode_vector`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from operator import le
from typing import NoReturn

import attrs
from cbor2 import loads as _cbor_loads

from ketten.errors import DecodeError
from ketten.interfaces import ClockOrder
from ketten.wire import MAX_UINT, head_size
from ketten.wire import dumps_canonical as dumps

__all__ = [
    "AUTHOR_SIZE",
    "DEFAULT_MAX_AUTHORS",
    "VectorDecoder",
    "compare_vectors",
    "decode_vector",
    "encode_vector",
    "merge_into",
]

AUTHOR_SIZE = 32
DEFAULT_MAX_AUTHORS = 4096
_WHERE = "vector stamp"
_ENTRY_BASE = 2 + AUTHOR_SIZE  # key head (32 < 256 -> 2 bytes) + key bytes; 35 with a counter < 24


def encode_vector(vector: Mapping[bytes, int]) -> bytes:
    """The canonical encoding of a vector (zero entries left out)."""
    return dumps({k: v for k, v in vector.items() if v})


def decode_vector(data: bytes, *, max_authors: int = DEFAULT_MAX_AUTHORS) -> dict[bytes, int]:
    """Decode a canonical vector stamp from untrusted bytes.

    Raises :class:`~ketten.errors.DecodeError` (and nothing else) for input
    that is not bytes, is larger than ``max_authors`` entries allow, is not a
    map of 32-byte keys to counters in ``1 .. 2**63-1``, or is not in the
    canonical encoding (keys sorted, shortest integer forms, definite
    lengths, no trailing bytes).
    """
    if type(data) is not bytes:
        if not isinstance(data, bytearray | memoryview):
            raise DecodeError(f"expected bytes, got {type(data).__name__}", where=_WHERE)
        data = bytes(data)
    if len(data) > head_size(max_authors) + max_authors * (_ENTRY_BASE + 9):
        raise DecodeError(f"{len(data)} bytes exceeds the limit for {max_authors} authors",
                          where=_WHERE)
    if not data:
        raise DecodeError("empty input", where=_WHERE)
    try:
        vector = _cbor_loads(data, allow_indefinite=False)
    except Exception as exc:  # cbor2 raises many unrelated types on garbage
        raise DecodeError(f"malformed CBOR ({type(exc).__name__}: {exc})", where=_WHERE) from None
    if type(vector) is not dict:
        raise DecodeError(f"expected a map, got {type(vector).__name__}", where=_WHERE)
    if len(vector) > max_authors:
        raise DecodeError(f"{len(vector)} authors exceed the limit of {max_authors}", where=_WHERE)
    size = head_size(len(vector))
    last = b""
    for key, counter in vector.items():
        if (
            type(key) is not bytes
            or len(key) != AUTHOR_SIZE
            or key <= last
            or type(counter) is not int
            or not 0 < counter <= MAX_UINT
        ):
            _reject_entry(key, counter, last)
        last = key
        size += (
            35 if counter < 24 else 36 if counter < 0x100 else 37 if counter < 0x10000
            else 39 if counter < 0x100000000 else 43
        )
    # With definite lengths, sorted keys and the exact canonical length together
    # prove the encoding canonical (a longer form or trailing bytes change the length).
    if size != len(data):
        raise DecodeError("not a canonical encoding, or trailing bytes", where=_WHERE)
    return vector


def _reject_entry(key: object, counter: object, last: bytes) -> NoReturn:
    if type(key) is not bytes or len(key) != AUTHOR_SIZE:
        raise DecodeError("author keys must be 32-byte strings", where=_WHERE)
    if key <= last:
        raise DecodeError("author keys must be sorted and unique", where=_WHERE)
    raise DecodeError(f"counter must be in 1..2**63-1, got {counter!r:.40}", where=_WHERE)


# Per counter width: struct code of the payload, payload offset after the
# head byte, and the range of counters canonically encoded in that width.
_WIDTHS = (
    (24, "B", 0, 1, 23),
    (0x100, "xB", 1, 24, 0xFF),
    (0x10000, "xH", 1, 0x100, 0xFFFF),
    (0x100000000, "xI", 1, 0x10000, 0xFFFFFFFF),
    (MAX_UINT + 1, "xQ", 1, 0x100000000, MAX_UINT),
)
_PAYLOAD = {"B": 1, "H": 2, "I": 4, "Q": 8}


@attrs.frozen
class _Layout:
    """The shape of one canonical stamp: everything but the counter payloads."""

    keys: tuple[bytes, ...]
    mask: int
    """The stamp as a big-endian integer, with the bits of counter payloads cleared."""
    fixed: int
    """``stamp & mask`` for every stamp of this layout."""
    unpack: struct.Struct
    lows: tuple[int, ...]
    """The smallest counter each payload encodes canonically."""
    low: int | None
    """All of ``lows`` if they are equal (one ``min`` instead of a comparison per counter)."""
    highs: tuple[int, ...] | None
    """The largest, where the payload's width does not already bound it."""

    @classmethod
    def of(cls, data: bytes, vector: Mapping[bytes, int]) -> _Layout:
        """The layout of ``data``, the canonical encoding of ``vector``."""
        position = head_size(len(vector))
        fmt = [">", f"{position}x"]
        mask = bytearray(b"\xff" * len(data))
        lows: list[int] = []
        highs: list[int] = []
        for counter in vector.values():
            position += 2 + AUTHOR_SIZE
            _, code, offset, low, high = next(w for w in _WIDTHS if counter < w[0])
            size = _PAYLOAD[code[-1]]
            fmt.append(f"{2 + AUTHOR_SIZE}x{code}")
            mask[position + offset:position + offset + size] = bytes(size)
            lows.append(low)
            highs.append(high)
            position += offset + size
        mask_number = int.from_bytes(mask)
        return cls(
            keys=tuple(vector),
            mask=mask_number,
            fixed=int.from_bytes(data) & mask_number,
            unpack=struct.Struct("".join(fmt)),
            lows=tuple(lows),
            low=lows[0] if len(set(lows)) == 1 else None,
            highs=tuple(highs) if any(h in (23, MAX_UINT) for h in highs) else None,
        )


@attrs.define(eq=False)
class VectorDecoder:
    """:func:`decode_vector` with a bounded cache of recent stamp layouts.

    Accepts and rejects exactly what :func:`decode_vector` does (raising only
    :class:`~ketten.errors.DecodeError`); returns a new dict on every call.
    """

    _max_authors: int = attrs.field(default=DEFAULT_MAX_AUTHORS, alias="max_authors")
    _max_layouts: int = attrs.field(default=64, alias="max_layouts", kw_only=True)
    _layouts: dict[int, list[_Layout]] = attrs.field(factory=dict, init=False)
    """Known layouts by encoded length."""
    _known: int = attrs.field(default=0, init=False)

    def __call__(self, data: bytes) -> dict[bytes, int]:
        """Decode a canonical vector stamp from untrusted bytes (see :func:`decode_vector`).

        Raises :class:`~ketten.errors.DecodeError`.
        """
        if type(data) is bytes:
            layouts = self._layouts.get(len(data))
            if layouts is not None:
                number = int.from_bytes(data)
                for layout in layouts:
                    if number & layout.mask == layout.fixed:
                        counters = layout.unpack.unpack(data)
                        low = layout.low
                        highs = layout.highs
                        if (
                            min(counters) >= low if low is not None
                            else all(map(le, layout.lows, counters))
                        ) and (highs is None or all(map(le, counters, highs))):
                            return dict(zip(layout.keys, counters))
                        break
        vector = decode_vector(data, max_authors=self._max_authors)
        if vector:
            self._learn(bytes(data), vector)
        return vector

    def _learn(self, data: bytes, vector: dict[bytes, int]) -> None:
        if self._known >= self._max_layouts:
            self._layouts.clear()
            self._known = 0
        self._layouts.setdefault(len(data), []).append(_Layout.of(data, vector))
        self._known += 1


def merge_into(target: dict[bytes, int], other: Mapping[bytes, int]) -> None:
    """Entry-wise maximum, in place; authors missing on either side count as 0."""
    for key, counter in other.items():
        if counter > target.get(key, 0):
            target[key] = counter


def compare_vectors(a: Mapping[bytes, int], b: Mapping[bytes, int]) -> ClockOrder:
    """How ``a`` relates to ``b`` entry-wise (missing entries are 0).

    ``BEFORE``: ``a <= b`` everywhere and ``a != b``; ``AFTER`` the mirror;
    ``EQUAL``: identical; ``CONCURRENT``: each is larger somewhere.
    """
    less = greater = False
    for key, x in a.items():
        y = b.get(key, 0)
        if x < y:
            less = True
        elif x > y:
            greater = True
    for key, y in b.items():
        if key not in a and y > 0:
            less = True
    if less and greater:
        return ClockOrder.CONCURRENT
    if less:
        return ClockOrder.BEFORE
    if greater:
        return ClockOrder.AFTER
    return ClockOrder.EQUAL
