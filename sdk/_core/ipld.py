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

Blocks and CIDs are built and checked here directly (the block layout is
fixed, so its canonical encoding is a concatenation; a CID is 36 bytes);
``multiformats`` gives the :class:`~multiformats.CID` objects of the public
API and reads any CID that is not an event block's, ``dag_cbor`` the CAR
header.
"""

from __future__ import annotations

from base64 import b32encode
from collections.abc import Callable
from hashlib import sha256
from typing import Any

import attrs
import cbor2
from multiformats import CID, multibase, multicodec, multihash

from ..errors import DecodeError, UsageError
from . import codec as _codec
from .event import DEFAULT_MAX_EVENT_SIZE, ENCODING_VERSION, Event

__all__ = [
    "BLOCK_OVERHEAD",
    "DAG_CBOR",
    "SHA2_256",
    "EventBlock",
    "block_cid",
    "cid_bytes",
    "cid_from_bytes",
    "cid_text",
    "decode_block",
    "event_block",
    "varint",
]

DAG_CBOR = 0x71
"""The multicodec code of dag-cbor."""
SHA2_256 = 0x12
"""The multihash code of sha2-256."""
BLOCK_OVERHEAD = 256
"""A block is at most this many bytes larger than the event it holds."""

_PREFIX = bytes([1, DAG_CBOR, SHA2_256, 32])
"""The binary form of every event block's CID before its digest: v1, dag-cbor, sha2-256/256."""
_CID_SIZE = len(_PREFIX) + 32
_KEYS = frozenset({"version", "criterion", "seq", "prev", "prevHash", "author", "command",
                   "clock", "time", "payload", "writers", "sig"})
_FIELDS = ("version", "criterion", "seq", "prevHash", "author", "command", "clock", "time",
           "payload", "writers", "sig")
"""The block keys of the event fields, in the order of the event's encoding."""


def varint(n: int) -> bytes:
    """The unsigned LEB128 varint of ``n`` (multiformats' unsigned-varint, minimal)."""
    if n < 0x80:
        if n < 0:
            raise ValueError(f"varint of a negative number {n}")
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# -- CIDs ------------------------------------------------------------------

_BASE32 = multibase.get("base32")
_CODEC = multicodec.get(code=DAG_CBOR)
_HASH = multihash.get(code=SHA2_256)


def _cid_public(binary: bytes) -> CID:
    return CID("base32", 1, DAG_CBOR, binary[2:])


_new = object.__new__


def _cid_direct(binary: bytes) -> CID:
    # The parts are known valid (v1, dag-cbor, sha2-256, 32 bytes), so the object
    # gets them as multiformats' own constructor sets them, without its validation.
    cid = _new(CID)
    cid._base = _BASE32
    cid._version = 1
    cid._codec = _CODEC
    cid._hashfun = _HASH
    cid._digest = binary[2:]
    return cid


def _pick_cid_builder() -> Callable[[bytes], CID]:
    """The direct constructor if it makes the same CID as the public one, else that."""
    probe = _PREFIX + sha256(b"ketten").digest()
    try:
        made, decoded = _cid_direct(probe), _cid_public(probe)
        if (type(made) is CID and made == decoded and hash(made) == hash(decoded)
                and bytes(made) == probe and repr(made) == repr(decoded)
                and made.encode("base32") == decoded.encode("base32")):
            return _cid_direct
    except Exception:  # another multiformats version: take the public path
        pass
    return _cid_public


_cid_builder = _pick_cid_builder()


def cid_from_bytes(binary: bytes) -> CID:
    """The :class:`~multiformats.CID` of a binary CID (event block CIDs take a fast path)."""
    if len(binary) == _CID_SIZE and binary.startswith(_PREFIX):
        return _cid_builder(bytes(binary))
    return CID.decode(bytes(binary))


def cid_bytes(cid: CID | bytes) -> bytes:
    """The binary form of a CID (given as a :class:`~multiformats.CID` or already binary)."""
    if type(cid) is bytes:
        return cid
    if isinstance(cid, CID):
        if cid.version == 0:
            return cid.digest
        codec = cid.codec
        return (b"\x01\x71" if codec is _CODEC else b"\x01" + varint(codec.code)) + cid.digest
    return bytes(cid)


def block_cid(data: bytes) -> CID:
    """The CIDv1 (dag-cbor, sha2-256) of a block's bytes."""
    return _cid_builder(_PREFIX + sha256(data).digest())


def _text(binary: bytes) -> str:
    """A binary CID as text: base32 for CIDv1, as IPFS tools print it; never raises."""
    if binary[:1] == b"\x01":
        return "b" + b32encode(binary).decode("ascii").lower().rstrip("=")
    try:
        return str(CID.decode(binary))  # CIDv0: base58btc, the only text form it has
    except Exception:  # not a CID at all: its bytes
        return binary.hex()


def cid_text(cid: CID | bytes) -> str:
    """A CID as text, in base32 (the form IPFS tools print for CIDv1)."""
    return _text(cid_bytes(cid))


def _is_event_cid(binary: bytes) -> bool:
    return len(binary) == _CID_SIZE and binary.startswith(_PREFIX)


# -- blocks ----------------------------------------------------------------

@attrs.frozen
class EventBlock:
    """One event as an IPLD block: its CID, its bytes, the event and the link it holds.

    ``binary`` and ``prev_binary`` are the binary CIDs of the block and of
    the predecessor's block (``None`` for a genesis); ``cid`` and ``prev``
    give them as :class:`~multiformats.CID` objects. Build one with
    :func:`event_block` or :func:`decode_block`.
    """

    binary: bytes
    data: bytes
    event: Event
    prev_binary: bytes | None

    @property
    def cid(self) -> CID:
        return _cid_builder(self.binary)

    @property
    def prev(self) -> CID | None:
        return _cid_builder(self.prev_binary) if self.prev_binary is not None else None


def _head(major: int, n: int) -> bytes:
    """A canonical CBOR head (RFC 8949 preferred serialisation, as dag-cbor requires)."""
    if n < 24:
        return bytes((major | n,))
    if n < 0x100:
        return bytes((major | 24, n))
    if n < 0x10000:
        return bytes((major | 25,)) + n.to_bytes(2, "big")
    if n < 0x100000000:
        return bytes((major | 26,)) + n.to_bytes(4, "big")
    return bytes((major | 27,)) + n.to_bytes(8, "big")


def _key(name: str) -> bytes:
    return _head(0x60, len(name)) + name.encode()


_NULL = b"\xf6"
_LINK = b"\xd8\x2a\x58\x25\x00"
"""Tag 42, then a 37-byte string: the zero byte and the 36-byte binary CID."""
# dag-cbor orders map keys by length, then bytewise.
_K_SEQ, _K_SIG, _K_PREV, _K_TIME, _K_CLOCK, _K_AUTHOR = (
    _key(k) for k in ("seq", "sig", "prev", "time", "clock", "author"))
_K_COMMAND, _K_PAYLOAD, _K_VERSION, _K_WRITERS, _K_PREV_HASH, _K_CRITERION = (
    _key(k) for k in ("command", "payload", "version", "writers", "prevHash", "criterion"))
_MAP12 = _head(0xA0, 12)


_BSTR_HEADS = [_head(0x40, n) for n in range(0x100)]


def _bstr(b: bytes) -> bytes:
    n = len(b)
    return (_BSTR_HEADS[n] if n < 0x100 else _head(0x40, n)) + b


def _encode_block(event: Event, prev: bytes | None) -> bytes:
    """The dag-cbor block of ``event`` linking the binary CID ``prev`` (or null)."""
    writers = event.writers
    command = event.command
    prev_hash = event.prev
    return b"".join((
        _MAP12,
        _K_SEQ, _head(0, event.seq),
        _K_SIG, _bstr(event.sig),
        _K_PREV, _LINK + prev if prev is not None else _NULL,
        _K_TIME, _head(0, event.time),
        _K_CLOCK, _bstr(event.clock),
        _K_AUTHOR, _bstr(event.author),
        _K_COMMAND, _head(0, command) if command is not None else _NULL,
        _K_PAYLOAD, _bstr(event.payload),
        _K_VERSION, _head(0, ENCODING_VERSION),
        _K_WRITERS, (_head(0x80, len(writers)) + b"".join(_bstr(w) for w in writers)
                     if writers is not None else _NULL),
        _K_PREV_HASH, _bstr(prev_hash) if prev_hash is not None else _NULL,
        _K_CRITERION, _bstr(event.criterion),
    ))


def _event_block(event: Event, prev: bytes | None) -> EventBlock:
    """:func:`event_block` for a checked binary ``prev``."""
    data = _encode_block(event, prev)
    return EventBlock(_PREFIX + sha256(data).digest(), data, event, prev)


def event_block(event: Event, prev: CID | bytes | None) -> EventBlock:
    """The block of ``event`` whose ``prev`` links the predecessor's block ``prev``.

    ``prev`` is a :class:`~multiformats.CID` or a binary CID. Raises
    :class:`~ketten.errors.UsageError` if ``prev`` is given for a genesis,
    missing otherwise, or not a CIDv1 dag-cbor sha2-256 CID.
    """
    if (prev is None) != event.is_genesis:
        raise UsageError("a genesis links no block; every other event links its predecessor's")
    binary = cid_bytes(prev) if prev is not None else None
    if binary is not None and not _is_event_cid(binary):
        raise UsageError(f"prev must be a CIDv1 dag-cbor sha2-256 CID, got {_text(binary)}")
    return _event_block(event, binary)


class _Link:
    """A tag-42 link read from a block: the binary CID after the zero byte."""

    __slots__ = ("binary",)

    def __init__(self, binary: bytes) -> None:
        self.binary = binary


def _refuse_semantic(decoder: Any) -> Any:
    raise cbor2.CBORDecodeError("a CBOR tag dag-cbor does not allow")


def _link_tag(first: Any, second: Any) -> Any:
    # cbor2 passes (decoder, tag) from CBORDecoder and (tag, immutable) from loads
    tag = second if isinstance(second, cbor2.CBORTag) else first
    if not isinstance(tag, cbor2.CBORTag):
        raise cbor2.CBORDecodeError("a CBOR tag that could not be read")
    if tag.tag != 42:
        raise cbor2.CBORDecodeError(f"CBOR tag {tag.tag} (dag-cbor allows only 42, links)")
    value = tag.value
    if type(value) is not bytes or not value.startswith(b"\x00"):
        raise cbor2.CBORDecodeError("a link (tag 42) that is not a zero byte and a CID")
    return _Link(value[1:])


_NO_TAGS = dict.fromkeys(_codec._BUILTIN_TAGS, _refuse_semantic)


def _loads_block(data: bytes) -> Any:
    return cbor2.loads(data, allow_indefinite=False, allow_duplicate_keys=False,
                       max_depth=_codec._MAX_DEPTH, strict_hashable_types=True,
                       semantic_decoders=_NO_TAGS, tag_hook=_link_tag)


def decode_block(cid: CID | bytes, data: bytes, *,
                 max_size: int = DEFAULT_MAX_EVENT_SIZE + BLOCK_OVERHEAD) -> EventBlock:
    """Check a block against its CID and the layout above; return it with its event.

    ``cid`` is a :class:`~multiformats.CID` or a binary CID. The signature
    is not verified here (chain checks do that). Raises
    :class:`~ketten.errors.DecodeError` naming the block for a CID of another
    kind, content that does not hash to the CID, malformed dag-cbor, a map
    with other keys or values, or any encoding but the canonical one.
    """
    if isinstance(cid, CID | bytes | bytearray | memoryview):
        binary = bytes(cid)
    else:
        raise DecodeError("not a CIDv1 dag-cbor sha2-256 CID", where=f"block {cid!r}")
    if not _is_event_cid(binary):
        raise DecodeError("not a CIDv1 dag-cbor sha2-256 CID", where=f"block {_text(binary)}")
    if type(data) is not bytes:
        data = bytes(data)
    if len(data) > max_size:
        raise DecodeError(f"{len(data)} bytes exceeds the limit of {max_size}",
                          where=f"block {_text(binary)}")
    digest = sha256(data).digest()
    if digest != binary[4:]:
        raise DecodeError(f"content does not match the CID (it hashes to "
                          f"{_text(_PREFIX + digest)})", where=f"block {_text(binary)}")
    try:
        value = _loads_block(data)
    except Exception as exc:  # cbor2 raises several types on garbage
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DecodeError(f"malformed dag-cbor ({first})",
                          where=f"block {_text(binary)}") from None
    if type(value) is not dict or value.keys() != _KEYS:
        keys = (sorted(map(str, value)) if isinstance(value, dict)
                else type(value).__name__)
        raise DecodeError(f"not a ketten event block (keys {keys})",
                          where=f"block {_text(binary)}")
    link = value["prev"]
    prev: bytes | None = None
    if link is not None:
        if type(link) is not _Link or not _is_event_cid(link.binary):
            raise DecodeError("prev must be null or a CIDv1 dag-cbor sha2-256 link",
                              where=f"block {_text(binary)}")
        prev = link.binary
    if (prev is None) != (value["prevHash"] is None):
        raise DecodeError("prev and prevHash must both be null (genesis) or both set",
                          where=f"block {_text(binary)}")
    try:
        encoded = _codec.dumps([value[k] for k in _FIELDS])
    except Exception:  # a link or another non-ketten value in an event field
        raise DecodeError("an event field holds a value of the wrong type",
                          where=f"block {_text(binary)}") from None
    try:
        event = Event.from_bytes(encoded, max_size=max_size)
    except DecodeError as exc:
        raise DecodeError(str(exc), where=f"block {_text(binary)}") from None
    if _encode_block(event, prev) != data:
        raise DecodeError("not the canonical block of the event it holds",
                          where=f"block {_text(binary)}")
    return EventBlock(binary, data, event, prev)
