"""CARv1 framing: a header naming root CIDs, then sections of (CID, block bytes).

The format (https://ipld.io/specs/transport/car/carv1/): an unsigned varint
``n`` and ``n`` bytes of dag-cbor ``{"roots": [CID, ...], "version": 1}``;
then sections until the end, each an unsigned varint ``n`` and ``n`` bytes
holding a CID followed by its block. This module frames and unframes bytes
only: whether a block matches its CID is :mod:`ketten._core.ipld`'s job.

Sections are framed and read directly (binary CIDs, varints); the header,
read and written once per file, goes through ``dag_cbor``, and any CID that
is not an event block's through ``multiformats``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs
import dag_cbor
from multiformats import CID

from ..errors import DecodeError
from .ipld import DAG_CBOR, SHA2_256, cid_bytes, cid_from_bytes, varint

__all__ = ["CarSection", "car_header", "car_section", "read_car_header", "read_car_sections"]

_MAX_HEADER = 1 << 16
_MAX_VARINT_BYTES = 9
_EVENT_PREFIX = bytes([1, DAG_CBOR, SHA2_256, 32])
"""CIDv1, dag-cbor, sha2-256, 32 bytes: the start of every event block's CID."""
_EVENT_CID = len(_EVENT_PREFIX) + 32


def car_header(roots: Sequence[CID]) -> bytes:
    """The CARv1 header naming ``roots``, length prefix included."""
    header = dag_cbor.encode({"roots": list(roots), "version": 1})
    return varint(len(header)) + header


def car_section(cid: CID | bytes, data: bytes) -> bytes:
    """One CARv1 section: the length prefix, the binary CID, the block.

    ``cid`` is a :class:`~multiformats.CID` or a binary CID.
    """
    binary = cid_bytes(cid)
    return b"".join((varint(len(binary) + len(data)), binary, data))


@attrs.frozen
class CarSection:
    """A section read from a CAR: its binary CID, its block bytes and where it starts.

    ``binary`` is a readable CID (checked when the section is read); ``cid``
    gives it as a :class:`~multiformats.CID`.
    """

    binary: bytes
    data: bytes
    offset: int

    @property
    def cid(self) -> CID:
        return cid_from_bytes(self.binary)


def _uvarint(buf: memoryview, pos: int, what: str) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = shift = 0
    for i in range(pos, min(pos + _MAX_VARINT_BYTES, len(buf))):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and i > pos:
                raise DecodeError(f"non-minimal varint at byte {pos}", where=what)
            return value, i + 1
        shift += 7
    raise DecodeError(f"truncated or oversized varint at byte {pos}", where=what)


def read_car_header(buf: bytes | memoryview) -> tuple[list[CID], int]:
    """The roots of a CARv1 and the offset of its first section.

    Raises :class:`~ketten.errors.DecodeError` for anything but a CARv1 header
    (a CARv2 is named as such).
    """
    view = memoryview(buf)
    if not len(view):
        raise DecodeError("empty file", where="car header")
    size, pos = _uvarint(view, 0, "car header")
    if size == 0 or size > _MAX_HEADER or pos + size > len(view):
        raise DecodeError(f"header length {size} does not fit the file", where="car header")
    try:
        header = dag_cbor.decode(bytes(view[pos:pos + size]))
    except Exception as exc:  # dag_cbor raises several types on garbage
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DecodeError(f"malformed dag-cbor ({first})", where="car header") from None
    if not isinstance(header, dict):
        raise DecodeError("the header is not a map", where="car header")
    version = header.get("version")
    if version == 2:
        raise DecodeError("a CARv2 file; only CARv1 is read (convert it with `car` or "
                          "`ipfs dag export`)", where="car header")
    roots = header.get("roots")
    # ``True == 1`` in Python: the version must be the integer itself.
    if (type(version) is not int or version != 1 or set(header) != {"roots", "version"}
            or not isinstance(roots, list)
            or not all(isinstance(r, CID) for r in roots)):
        raise DecodeError("not a CARv1 header ({roots: [CID...], version: 1})",
                          where="car header")
    return [root for root in roots if isinstance(root, CID)], pos + size


def read_car_sections(buf: bytes | memoryview, offset: int) -> Iterator[CarSection]:
    """The sections of a CARv1 from ``offset`` (after the header) to the end.

    Raises :class:`~ketten.errors.DecodeError` naming the byte offset of a
    truncated section or an unreadable CID.
    """
    view = memoryview(buf)
    pos = offset
    end = len(view)
    while pos < end:
        start = pos
        where = f"car section at byte {start}"
        size, pos = _uvarint(view, pos, where)
        if size == 0 or pos + size > end:
            raise DecodeError(f"section length {size} runs past the end of the file "
                              f"({end - pos} bytes left)", where=where)
        body = view[pos:pos + size]
        if body[:4] == _EVENT_PREFIX and size >= _EVENT_CID:
            binary = bytes(body[:_EVENT_CID])  # an event block's CID: readable as it is
        else:
            binary = bytes(body[:_cid_length(body, where)])
            try:
                CID.decode(binary)
            except Exception as exc:  # multiformats raises several types on bad CIDs
                raise DecodeError(f"unreadable CID ({exc})", where=where) from None
        yield CarSection(binary, bytes(body[len(binary):]), start)
        pos += size


def _cid_length(body: memoryview, where: str) -> int:
    """How many bytes the binary CID at the start of a section body takes."""
    if len(body) >= 2 and body[0] == 0x12 and body[1] == 0x20:
        length = 34  # CIDv0: a bare sha2-256 multihash
    else:
        _, pos = _uvarint(body, 0, where)   # version
        _, pos = _uvarint(body, pos, where)  # codec
        _, pos = _uvarint(body, pos, where)  # multihash code
        digest, pos = _uvarint(body, pos, where)
        length = pos + digest
    if length > len(body):
        raise DecodeError("the CID runs past the end of its section", where=where)
    return length
