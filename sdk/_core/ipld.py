"""Events as IPLD blocks: dag-cbor maps addressed by CIDv1 (sha2-256), linked by ``prev``.

A chain is a DAG that any IPLD tool walks from its head block back to the
genesis through the ``prev`` links. Each block is the dag-cbor encoding of
a map with exactly these keys (dag-cbor orders them by length, then bytes):

=============  ================================  ==================================
key            value                             ketten event field
=============  ================================  ==================================
``version``    integer, ``1``                    encoding version
``criterion``  bytes (32)                        ``criterion``
``seq``        integer                           ``seq``
``prev``       CID link (tag 42), null: genesis  the predecessor's *block*
``prevHash``   bytes (32), null: genesis         ``prev`` (the predecessor's hash)
``author``     bytes (32)                        ``author``
``command``    integer or null                   ``command``
``clock``      bytes                             ``clock``
``time``       integer                           ``time``
``payload``    bytes                             ``payload``
``writers``    array of bytes (32) or null       ``writers``
``sig``        bytes (64)                        ``sig``
=============  ================================  ==================================

The signed ketten event is the canonical CBOR array ``[version, criterion,
seq, prevHash, author, command, clock, time, payload, writers, sig]``; it is
rebuilt from one block alone, byte for byte, so its signature and its hash
(``sha256`` of those bytes) verify without the predecessor's block. The
ketten hash of an event differs from the digest in its block's CID: the
CID hashes the block, the ketten hash the event.

Rules a block must meet to be accepted (:func:`decode_block`): its CID is
CIDv1, codec ``dag-cbor`` (0x71), multihash ``sha2-256``, and its digest is
the SHA-256 of the block; the block is exactly the encoding
:func:`event_block` gives for the event it holds and its ``prev`` link, so
there is one block per (event, predecessor block) and no other.
"""

from __future__ import annotations

from hashlib import sha256
from typing import Any

import attrs
import dag_cbor
from multiformats import CID, multihash

from ..errors import DecodeError, UsageError
from . import codec as _codec
from .event import DEFAULT_MAX_EVENT_SIZE, ENCODING_VERSION, Event

__all__ = [
    "BLOCK_OVERHEAD",
    "DAG_CBOR",
    "SHA2_256",
    "EventBlock",
    "block_cid",
    "cid_text",
    "decode_block",
    "event_block",
]

DAG_CBOR = 0x71
"""The multicodec code of dag-cbor."""
SHA2_256 = 0x12
"""The multihash code of sha2-256."""
BLOCK_OVERHEAD = 256
"""A block is at most this many bytes larger than the event it holds."""

_PREFIX = bytes([1, DAG_CBOR, SHA2_256, 32])
"""The binary form of every event block's CID before its digest: v1, dag-cbor, sha2-256/256."""
_KEYS = frozenset({"version", "criterion", "seq", "prev", "prevHash", "author", "command",
                   "clock", "time", "payload", "writers", "sig"})


def block_cid(data: bytes) -> CID:
    """The CIDv1 (dag-cbor, sha2-256) of a block's bytes."""
    return CID("base32", 1, DAG_CBOR, multihash.wrap(sha256(data).digest(), SHA2_256))


def cid_text(cid: CID) -> str:
    """A CID as text, in base32 (the form IPFS tools print for CIDv1)."""
    return cid.encode("base32")


def _is_event_cid(cid: CID) -> bool:
    binary = bytes(cid)
    return len(binary) == 36 and binary.startswith(_PREFIX)


@attrs.frozen
class EventBlock:
    """One event as an IPLD block: its CID, its bytes, the event and the link it holds.

    ``prev`` is the CID of the predecessor's block (``None`` for a genesis).
    Build one with :func:`event_block` or :func:`decode_block`.
    """

    cid: CID
    data: bytes
    event: Event
    prev: CID | None


def _block_map(event: Event, prev: CID | None) -> dict[str, Any]:
    return {
        "version": ENCODING_VERSION,
        "criterion": event.criterion,
        "seq": event.seq,
        "prev": prev,
        "prevHash": event.prev,
        "author": event.author,
        "command": event.command,
        "clock": event.clock,
        "time": event.time,
        "payload": event.payload,
        "writers": list(event.writers) if event.writers is not None else None,
        "sig": event.sig,
    }


def event_block(event: Event, prev: CID | None) -> EventBlock:
    """The block of ``event`` whose ``prev`` links the predecessor's block ``prev``.

    Raises :class:`~ketten.errors.UsageError` if ``prev`` is given for a
    genesis, missing otherwise, or not a CIDv1 dag-cbor sha2-256 CID.
    """
    if (prev is None) != event.is_genesis:
        raise UsageError("a genesis links no block; every other event links its predecessor's")
    if prev is not None and not _is_event_cid(prev):
        raise UsageError(f"prev must be a CIDv1 dag-cbor sha2-256 CID, got {prev}")
    data = dag_cbor.encode(_block_map(event, prev))
    return EventBlock(block_cid(data), data, event, prev)


def decode_block(cid: CID, data: bytes, *,
                 max_size: int = DEFAULT_MAX_EVENT_SIZE + BLOCK_OVERHEAD) -> EventBlock:
    """Check a block against its CID and the layout above; return it with its event.

    The signature is not verified here (chain checks do that). Raises
    :class:`~ketten.errors.DecodeError` naming the block for a CID of another
    kind, content that does not hash to the CID, malformed dag-cbor, a map
    with other keys or values, or any encoding but the canonical one.
    """
    where = f"block {cid_text(cid)}" if isinstance(cid, CID) else f"block {cid!r}"
    if not isinstance(cid, CID) or not _is_event_cid(cid):
        raise DecodeError("not a CIDv1 dag-cbor sha2-256 CID", where=where)
    data = bytes(data)
    if len(data) > max_size:
        raise DecodeError(f"{len(data)} bytes exceeds the limit of {max_size}", where=where)
    if sha256(data).digest() != bytes(cid)[4:]:
        raise DecodeError(f"content does not match the CID (it hashes to "
                          f"{cid_text(block_cid(data))})", where=where)
    try:
        value = dag_cbor.decode(data)
    except Exception as exc:  # dag_cbor raises several types on garbage
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DecodeError(f"malformed dag-cbor ({first})", where=where) from None
    if not isinstance(value, dict) or set(value) != _KEYS:
        keys = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise DecodeError(f"not a ketten event block (keys {keys})", where=where)
    prev = value["prev"]
    if prev is not None and not (isinstance(prev, CID) and _is_event_cid(prev)):
        raise DecodeError("prev must be null or a CIDv1 dag-cbor sha2-256 link", where=where)
    if (prev is None) != (value["prevHash"] is None):
        raise DecodeError("prev and prevHash must both be null (genesis) or both set",
                          where=where)
    fields = [value[k] for k in ("version", "criterion", "seq", "prevHash", "author", "command",
                                 "clock", "time", "payload", "writers", "sig")]
    try:
        encoded = _codec.dumps(fields)
    except Exception:  # a link or another non-ketten value in an event field
        raise DecodeError("an event field holds a value of the wrong type",
                          where=where) from None
    try:
        event = Event.from_bytes(encoded, max_size=max_size)
    except DecodeError as exc:
        raise DecodeError(str(exc), where=where) from None
    if dag_cbor.encode(_block_map(event, prev)) != data:
        raise DecodeError("not the canonical block of the event it holds", where=where)
    return EventBlock(cid, data, event, prev)
