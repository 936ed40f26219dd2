"""The vector stamp ADT: a sparse map ``author -> counter`` and its codec.

A missing author counts as 0, so vectors of different sizes compare and
merge as if padded with zeros. Zero entries are never stored or encoded.
The encoding is a canonical CBOR map from 32-byte author keys to positive
counters; :func:`decode_vector` accepts exactly that and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

from cbor2 import loads as _cbor_loads
from ketten._codec import MAX_UINT, dumps, head_size
from ketten.errors import DecodeError
from ketten.interfaces import ClockOrder

__all__ = [
    "AUTHOR_SIZE",
    "DEFAULT_MAX_AUTHORS",
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
    canonical encoding (keys sorted, shortest integer forms, no trailing bytes).
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
        vector = _cbor_loads(data)
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
    # Sorted keys and the exact canonical length together prove the encoding
    # canonical (a longer integer form or trailing bytes change the length).
    if size != len(data):
        raise DecodeError("not a canonical encoding, or trailing bytes", where=_WHERE)
    return vector


def _reject_entry(key: object, counter: object, last: bytes) -> NoReturn:
    if type(key) is not bytes or len(key) != AUTHOR_SIZE:
        raise DecodeError("author keys must be 32-byte strings", where=_WHERE)
    if key <= last:
        raise DecodeError("author keys must be sorted and unique", where=_WHERE)
    raise DecodeError(f"counter must be in 1..2**63-1, got {counter!r:.40}", where=_WHERE)


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
