"""Integrity checks and file helpers shared by the durable stores.

A stored event is trusted only if its canonical bytes start with the fields
its position implies (criterion, seq, link to the previous hash) and hash to
the digest stored next to it. Both checks are cheap next to decoding, so
every read path runs them and damaged records are never served.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
from collections.abc import Iterable, Mapping
from hashlib import sha256
from typing import Any

from ketten.errors import ConfigError, StoreError

__all__ = [
    "HASH_SIZE",
    "TMP_SUFFIX",
    "DirLock",
    "atomic_write",
    "event_prefix",
    "find_in_files",
    "fsync_dir",
    "parse_position",
    "record_ok",
    "store_path",
    "uint_bytes",
]

HASH_SIZE = 32
_HEAD = b"\x8b\x01\x58\x20"  # array(11), version 1, bytes(32) header of the criterion
_BYTES32 = b"\x58\x20"
_NULL = b"\xf6"


def uint_bytes(n: int) -> bytes:
    """The canonical CBOR encoding of the unsigned integer ``n``."""
    if n < 24:
        return bytes((n,))
    if n < 0x100:
        return bytes((0x18, n))
    if n < 0x10000:
        return b"\x19" + n.to_bytes(2, "big")
    if n < 0x100000000:
        return b"\x1a" + n.to_bytes(4, "big")
    return b"\x1b" + n.to_bytes(8, "big")


def event_prefix(criterion: bytes, seq: int, prev: bytes | None) -> bytes:
    """The first bytes of the canonical encoding of any event at this position."""
    link = _NULL if prev is None else _BYTES32 + prev
    return _HEAD + criterion + uint_bytes(seq) + link


def record_ok(raw: bytes, criterion: bytes, seq: int, prev: bytes | None, digest: bytes) -> bool:
    """Whether ``raw`` is the event stored at this position with this hash.

    ``prev`` is the hash of the event at ``seq - 1`` (``None`` for a genesis).
    """
    return raw.startswith(event_prefix(criterion, seq, prev)) and sha256(raw).digest() == digest


def _read_uint(raw: bytes, pos: int) -> tuple[int, int]:
    first = raw[pos]
    if first < 24:
        return first, pos + 1
    width = {0x18: 1, 0x19: 2, 0x1A: 4, 0x1B: 8}.get(first)
    if width is None:
        raise ValueError(f"no unsigned integer at byte {pos}")
    end = pos + 1 + width
    if end > len(raw):
        raise ValueError("truncated integer")
    return int.from_bytes(raw[pos + 1 : end], "big"), end


def parse_position(raw: bytes) -> tuple[bytes, int, bytes | None, bytes, int | None]:
    """``(criterion, seq, prev, author, command)`` read from the start of an encoding.

    Only for bytes that were a valid event when written (their checksum
    proves they are unchanged). Raises :class:`ValueError` otherwise.
    """
    if not raw.startswith(_HEAD) or len(raw) < 40:
        raise ValueError("not an event encoding")
    criterion = raw[4:36]
    seq, pos = _read_uint(raw, 36)
    prev: bytes | None
    if raw[pos] == 0xF6:
        prev, pos = None, pos + 1
    elif raw[pos : pos + 2] == _BYTES32:
        prev, pos = raw[pos + 2 : pos + 34], pos + 34
    else:
        raise ValueError("bad prev field")
    if raw[pos : pos + 2] != _BYTES32:
        raise ValueError("bad author field")
    author = raw[pos + 2 : pos + 34]
    pos += 34
    command: int | None
    if pos < len(raw) and raw[pos] == 0xF6:
        command = None
    else:
        command, pos = _read_uint(raw, pos)
    if len(criterion) != HASH_SIZE or len(author) != HASH_SIZE:
        raise ValueError("truncated event")
    return criterion, seq, prev, author, command


def find_in_files(paths: Iterable[str], needle: bytes) -> tuple[str, int] | None:
    """Where ``needle`` first occurs in one of ``paths`` (to name a damaged record)."""
    needle = needle[:64]
    if not needle:
        return None
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        offset = data.find(needle)
        if offset >= 0:
            return path, offset
    return None


def fsync_dir(path: str) -> None:
    """Make a directory's entries (created, renamed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


TMP_SUFFIX = ".tmp"
"""Temporary files of :func:`atomic_write` end so; one left by a crash is garbage."""


def atomic_write(path: str, data: bytes) -> None:
    """Replace ``path`` by ``data`` durably: write a temporary file, fsync, rename, fsync dir."""
    directory = os.path.dirname(path) or "."
    # A name of its own per write: two writes of one path at once (two threads)
    # must not share a temporary file.
    tmp = f"{path}.{secrets.token_hex(6)}{TMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)


def store_path(options: Mapping[str, Any], kind: str) -> str:
    """The ``path`` option of a store, checked. Raises :class:`~ketten.errors.ConfigError`."""
    path = options.get("path")
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise ConfigError(f"the {kind} store needs the option 'path' (a directory), got {path!r}")
    return os.path.abspath(os.fspath(path))


class DirLock:
    """An exclusive advisory lock on a file, held while a store is open for writing."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        """Raises :class:`~ketten.errors.StoreError` if another store holds it."""
        fd = os.open(self._path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise StoreError(
                    f"{self._path}: the store is open in another process or store object"
                ) from None
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
