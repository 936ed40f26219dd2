"""Strict CBOR decoding of untrusted bytes.

``cbor2`` raises many exception types on malformed input; everything here
turns them into :class:`~ketten.errors.DecodeError` and nothing else.
"""

from __future__ import annotations

import io
from typing import Any

import cbor2

from ..errors import DecodeError

__all__ = ["MAX_UINT", "dumps", "dumps_wire", "head_size", "loads", "loads_prefix"]

MAX_UINT = 2**63 - 1
_MAX_DEPTH = 32

# No format of ours uses CBOR tags. cbor2 would decode some of them into
# objects (big integers, shared and cyclic references, regular expressions,
# decimals, sets); every one is refused instead. These are the tags cbor2
# decodes itself; any other tag reaches the tag hook, which refuses it too.
_BUILTIN_TAGS = (0, 1, 2, 3, 4, 5, 25, 28, 29, 30, 35, 36, 37, 52, 54, 100, 256, 258, 260, 261,
                 1004, 43000, 55799)


def _refuse_semantic(decoder: Any) -> Any:
    raise cbor2.CBORDecodeError("CBOR tags are not allowed")


def _refuse_tag(decoder: Any, tag: Any) -> Any:
    raise cbor2.CBORDecodeError(f"CBOR tag {tag.tag} is not allowed")


_NO_TAGS = dict.fromkeys(_BUILTIN_TAGS, _refuse_semantic)


def dumps(value: Any) -> bytes:
    """Canonical CBOR (RFC 8949 core deterministic encoding)."""
    return cbor2.dumps(value, canonical=True)


def dumps_wire(value: Any) -> bytes:
    """CBOR without the canonical map order (half the cost): for message envelopes
    and frames, which are neither hashed nor signed. Events inside them are
    byte strings in their canonical encoding."""
    return cbor2.dumps(value)


def loads(data: bytes, *, max_size: int, where: str) -> Any:
    """Decode one CBOR item from ``data``, rejecting anything malformed.

    Oversized input, trailing bytes, indefinite-length items, tags (big
    integers, shared references and the rest), map keys other than strings,
    nesting deeper than 32 and any decoder failure raise :class:`~ketten.errors.DecodeError` naming ``where``.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"expected bytes, got {type(data).__name__}", where=where)
    if len(data) > max_size:
        raise DecodeError(f"{len(data)} bytes exceeds the limit of {max_size}", where=where)
    if not data:
        raise DecodeError("empty input", where=where)
    stream = io.BytesIO(data)
    try:
        value = cbor2.CBORDecoder(
            stream,
            allow_indefinite=False,
            allow_duplicate_keys=False,
            strict_hashable_types=True,
            max_depth=_MAX_DEPTH,
            semantic_decoders=_NO_TAGS,
            tag_hook=_refuse_tag,
        ).decode()
    except Exception as exc:  # cbor2 raises many unrelated types on garbage
        raise DecodeError(f"malformed CBOR ({type(exc).__name__}: {exc})", where=where) from None
    if stream.tell() != len(data):
        raise DecodeError(f"{len(data) - stream.tell()} trailing bytes", where=where)
    return value


def loads_prefix(data: bytes, *, where: str) -> Any:
    """Decode the CBOR item at the start of ``data``; trailing bytes are ignored.

    Only for callers that check the exact encoded length themselves (the event
    decoder does, which also proves the encoding canonical).
    """
    try:
        return cbor2.loads(
            data, allow_indefinite=False, allow_duplicate_keys=False, max_depth=_MAX_DEPTH,
            strict_hashable_types=True, semantic_decoders=_NO_TAGS, tag_hook=_refuse_tag,
        )
    except Exception as exc:  # cbor2 raises many unrelated types on garbage
        raise DecodeError(f"malformed CBOR ({type(exc).__name__}: {exc})", where=where) from None


def head_size(n: int) -> int:
    """Size in bytes of a canonical CBOR head carrying the argument ``n``."""
    if n < 24:
        return 1
    if n < 0x100:
        return 2
    if n < 0x10000:
        return 3
    if n < 0x100000000:
        return 5
    return 9
