"""On-disk format of the ``file`` store: frames, segment names, small metadata files.

A store directory holds a marker file, append-only segment files of frames,
a ``cursors`` directory and an optional ``quarantine`` file. A frame is a
12-byte header ``magic u16 | type u8 | 0 u8 | body length u32 | crc32 u32``
(little-endian; the CRC covers the first 8 header bytes and the body)
followed by the body. A batch is any number of frames closed by a COMMIT
frame that counts them; frames after the last COMMIT are a torn write.

Compaction writes a *base segment*: it opens with a BASE frame and holds the
state of every segment before it (main-chain EVENT frames, ORPHAN frames,
MARK frames for quarantined ranges), so a replay starts at the last base and
the segments before it are garbage. Format 2 added BASE, ORPHAN and MARK.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import zlib

from ketten.errors import StoreCorrupted, StoreFormatError

__all__ = [
    "BASE",
    "BASE_BODY",
    "COMMIT",
    "DROP",
    "DROP_BODY",
    "EVENT",
    "FORMAT_VERSION",
    "HEADER",
    "MARKER",
    "MARK_BODY",
    "ORPHAN",
    "QUARANTINE",
    "REPLACE",
    "check_directory",
    "decode_cursor",
    "decode_spans",
    "encode_cursor",
    "encode_spans",
    "frame",
    "is_base",
    "marker_bytes",
    "parse_frame",
    "segment_name",
    "segment_numbers",
]

MARKER = "KETTEN-FILE-STORE"
FORMAT_VERSION = 2
_MARKER_TEXT = b"ketten file store\nformat %d\n"
_MARKER_RE = re.compile(rb"\Aketten file store\nformat (\d+)\n\Z")

Buffer = bytes | mmap.mmap

MAGIC = 0x4B45
HEADER = struct.Struct("<HBBII")
HEADER_SIZE = HEADER.size
EVENT, REPLACE, QUARANTINE, COMMIT, DROP, ORPHAN, MARK, BASE = 1, 2, 3, 4, 5, 6, 7, 8
TYPES = frozenset((EVENT, REPLACE, QUARANTINE, COMMIT, DROP, ORPHAN, MARK, BASE))
RECORDS = frozenset((EVENT, ORPHAN))
MAX_BODY = 1 << 28

REPLACE_BODY = struct.Struct("<32sQ")
QUARANTINE_BODY = struct.Struct("<32sQQ")
DROP_BODY = struct.Struct("<32s")
MARK_BODY = struct.Struct("<32sQQ")
BASE_BODY = struct.Struct("<Q")
COMMIT_BODY = struct.Struct("<I")
_SEGMENT_RE = re.compile(r"\Aseg-(\d{8})\.log\Z")

_CURSOR_MAGIC = b"KCUR"
_SPANS_MAGIC = b"KQSP"
_SPAN = struct.Struct("<IQI")


def marker_bytes(version: int = FORMAT_VERSION) -> bytes:
    return _MARKER_TEXT % version


def segment_name(number: int) -> str:
    return f"seg-{number:08d}.log"


def segment_numbers(names: list[str]) -> list[int]:
    """Numbers of the segment files among ``names``, sorted."""
    return sorted(int(m.group(1)) for n in names if (m := _SEGMENT_RE.match(n)))


def frame(kind: int, body: bytes) -> bytes:
    """One frame: header and body."""
    head = struct.pack("<HBBI", MAGIC, kind, 0, len(body))
    return head + struct.pack("<I", zlib.crc32(body, zlib.crc32(head))) + body


def parse_frame(buf: Buffer, pos: int, size: int) -> tuple[int, int, int] | None:
    """``(type, body offset, end)`` of a valid frame at ``pos``, or ``None``."""
    if pos + HEADER_SIZE > size:
        return None
    magic, kind, flags, length, crc = HEADER.unpack_from(buf, pos)
    if magic != MAGIC or kind not in TYPES or flags != 0 or length > MAX_BODY:
        return None
    end = pos + HEADER_SIZE + length
    if end > size:
        return None
    body_at = pos + HEADER_SIZE
    if zlib.crc32(buf[body_at:end], zlib.crc32(buf[pos : pos + 8])) != crc:
        return None
    return kind, body_at, end


def is_base(buf: Buffer, size: int) -> bool:
    """Whether a segment opens with an intact BASE frame."""
    found = parse_frame(buf, 0, size)
    return found is not None and found[0] == BASE


def plausible_length(buf: Buffer, pos: int, size: int) -> int | None:
    """The end of a frame at ``pos`` whose header looks intact (CRC not checked)."""
    if pos + HEADER_SIZE > size:
        return None
    magic, kind, flags, length, _ = HEADER.unpack_from(buf, pos)
    if magic != MAGIC or kind not in TYPES or flags != 0:
        return None
    end = pos + HEADER_SIZE + length
    return end if end <= size else None


def find_commit(buf: Buffer, start: int, size: int) -> int | None:
    """Offset of the first valid COMMIT frame at or after ``start``, or ``None``."""
    needle = struct.pack("<HB", MAGIC, COMMIT)
    data = bytes(buf[start:size])
    at = data.find(needle)
    while at >= 0:
        found = parse_frame(buf, start + at, size)
        if found is not None and found[0] == COMMIT:
            return start + at
        at = data.find(needle, at + 1)
    return None


def check_directory(path: str) -> int | None:
    """The format version of the file store at ``path``; ``None`` if there is none yet.

    Reads only. Raises :class:`~ketten.errors.StoreFormatError` if ``path``
    is not a directory, holds other files but no marker, or holds a marker
    of a newer version or garbage.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise StoreFormatError(f"{path}: not a directory, cannot hold a file store")
    marker = os.path.join(path, MARKER)
    try:
        with open(marker, "rb") as f:
            data = f.read(256)
    except FileNotFoundError:
        if os.path.isdir(path):
            others = sorted(os.listdir(path))
            if others:
                raise StoreFormatError(
                    f"{path}: holds {', '.join(others[:5])} but no {MARKER}; "
                    "not a file store directory"
                ) from None
        return None
    match = _MARKER_RE.match(data)
    if match is None:
        raise StoreFormatError(f"{marker}: not a ketten file store marker")
    version = int(match.group(1))
    if version > FORMAT_VERSION:
        raise StoreFormatError(
            f"{marker}: format version {version} is newer than this ketten "
            f"(supports up to {FORMAT_VERSION}); upgrade ketten to open it"
        )
    if version < 1:
        raise StoreFormatError(f"{marker}: unknown format version {version}")
    return version


def encode_cursor(name: str, value: bytes) -> bytes:
    encoded = name.encode("utf-8")
    body = struct.pack("<I", len(encoded)) + encoded + value
    return _CURSOR_MAGIC + struct.pack("<I", zlib.crc32(body)) + body


def decode_cursor(path: str, data: bytes) -> tuple[str, bytes]:
    """``(name, value)`` of a cursor file. Raises :class:`StoreCorrupted`."""
    if len(data) < 12 or not data.startswith(_CURSOR_MAGIC):
        raise StoreCorrupted("not a cursor file", path=path, offset=0)
    (crc,) = struct.unpack_from("<I", data, 4)
    body = data[8:]
    if zlib.crc32(body) != crc:
        raise StoreCorrupted("cursor checksum mismatch", path=path, offset=0)
    (n,) = struct.unpack_from("<I", body, 0)
    try:
        name = body[4 : 4 + n].decode("utf-8")
    except UnicodeDecodeError:
        raise StoreCorrupted("cursor name is not UTF-8", path=path, offset=8) from None
    return name, body[4 + n :]


def encode_spans(spans: dict[tuple[int, int], int]) -> bytes:
    body = b"".join(_SPAN.pack(seg, off, n) for (seg, off), n in sorted(spans.items()))
    return _SPANS_MAGIC + struct.pack("<I", zlib.crc32(body)) + body


def decode_spans(path: str, data: bytes) -> dict[tuple[int, int], int]:
    """The quarantined frame spans ``{(segment, offset): length}``. Raises :class:`StoreCorrupted`."""
    if len(data) < 8 or not data.startswith(_SPANS_MAGIC) or (len(data) - 8) % _SPAN.size:
        raise StoreCorrupted("not a quarantine file", path=path, offset=0)
    (crc,) = struct.unpack_from("<I", data, 4)
    if zlib.crc32(data[8:]) != crc:
        raise StoreCorrupted("quarantine file checksum mismatch", path=path, offset=0)
    return {(seg, off): n for seg, off, n in _SPAN.iter_unpack(data[8:])}
