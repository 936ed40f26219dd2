"""Checked reads of a ``sqlite`` store database, shared by the store and its reader.

Every function takes a connection and returns only events whose bytes passed
the integrity checks of :mod:`ketten.plugins._store_records`; anything else
raises :class:`~ketten.errors.StoreCorrupted` naming the file and the offset
of the damaged record.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from hashlib import sha256

from ketten import Event
from ketten.errors import DecodeError, StoreCorrupted

from .._store_records import event_prefix, find_in_files, uint_bytes

__all__ = [
    "MAX_SEQ", "damaged", "decode_checked", "iter_main", "iter_main_unchecked", "iter_orphans",
    "read_main",
]

MAX_SEQ = 2**63 - 1
_HEAD = b"\x8b\x01\x58\x20"
_FETCH_ROWS = 512


def damaged(db_path: str, criterion: bytes, seq: int, raw: bytes, why: str) -> StoreCorrupted:
    """A :class:`StoreCorrupted` for the record of ``criterion``/``seq`` (located on disk)."""
    found = find_in_files((db_path, db_path + "-wal"), raw)
    path, offset = found if found is not None else (db_path, None)
    return StoreCorrupted(
        f"event seq {seq} of criterion {criterion.hex()[:16]}: {why}; "
        "the range is refused (quarantine it and repair it from peers)",
        path=path,
        offset=offset,
        criterion=criterion,
        seq=seq,
    )


def check_row(
    db_path: str, criterion: bytes, seq: int, prev: bytes | None, digest: bytes, raw: bytes,
    *, linked: bool,
) -> None:
    """Raise :class:`StoreCorrupted` unless ``raw`` is the event stored at this position.

    ``linked``: ``prev`` is known and checked (else only criterion and seq).
    """
    if type(raw) is not bytes or type(digest) is not bytes:
        raise damaged(db_path, criterion, seq, b"", "stored values have the wrong type")
    prefix = event_prefix(criterion, seq, prev) if linked else _HEAD + criterion + uint_bytes(seq)
    if not raw.startswith(prefix):
        raise damaged(db_path, criterion, seq, raw, "stored bytes do not match the position")
    if sha256(raw).digest() != digest:
        raise damaged(db_path, criterion, seq, raw, "stored bytes do not match the event hash")


def decode_checked(db_path: str, criterion: bytes, seq: int, digest: bytes, raw: bytes) -> Event:
    """Decode a row already checked (or check it while decoding)."""
    try:
        event = Event.from_bytes(raw)
    except DecodeError as exc:
        raise damaged(db_path, criterion, seq, raw, f"undecodable ({exc})") from None
    if event.hash != digest or event.criterion != criterion or event.seq != seq:
        raise damaged(db_path, criterion, seq, raw, "stored bytes do not match the event hash")
    return event


def iter_main(
    conn: sqlite3.Connection, db_path: str, criterion: bytes, start: int, stop: int | None
) -> Iterator[tuple[int, bytes, bytes]]:
    """``(seq, hash, raw)`` of the main chain in ``[start, stop)``, every link checked.

    One SELECT statement: in WAL mode it reads one consistent snapshot.
    """
    start = max(start, 0)
    stop = MAX_SEQ if stop is None else stop
    if stop <= start:
        return
    first = start - 1 if start > 0 else 0
    rows = conn.execute(
        "SELECT seq, hash, raw FROM events WHERE criterion = ? AND orphan IS NULL"
        " AND seq >= ? AND seq < ? ORDER BY seq",
        (criterion, first, stop),
    )
    expected = first
    prev: bytes | None = None
    try:
        for seq, digest, raw in rows:
            if seq != expected:
                raise StoreCorrupted(
                    f"criterion {criterion.hex()[:16]}: seq {expected} is missing (found {seq})",
                    path=db_path, criterion=criterion, seq=expected,
                )
            if seq >= start:
                check_row(db_path, criterion, seq, prev, digest, raw,
                          linked=seq == 0 or seq > first)
                yield seq, digest, raw
            prev = digest
            expected = seq + 1
    finally:
        rows.close()  # ends the statement's read snapshot


def read_main(
    conn: sqlite3.Connection, db_path: str, criterion: bytes, start: int, stop: int | None
) -> list[Event]:
    """The decoded main-chain events in ``[start, stop)``, every link and hash checked.

    Like :func:`iter_main` + :func:`decode_checked`, but each row is hashed
    once (by decoding) and the link is checked on the decoded event.
    """
    start = max(start, 0)
    stop = MAX_SEQ if stop is None else stop
    if stop <= start:
        return []
    first = start - 1 if start > 0 else 0
    rows = conn.execute(
        "SELECT seq, hash, raw FROM events WHERE criterion = ? AND orphan IS NULL"
        " AND seq >= ? AND seq < ? ORDER BY seq",
        (criterion, first, stop),
    ).fetchall()
    out: list[Event] = []
    prev: bytes | None = None
    expected = first
    from_bytes = Event.from_bytes
    for seq, digest, raw in rows:
        if seq != expected:
            raise StoreCorrupted(
                f"criterion {criterion.hex()[:16]}: seq {expected} is missing (found {seq})",
                path=db_path, criterion=criterion, seq=expected,
            )
        expected = seq + 1
        if seq < start:
            prev = digest
            continue
        if type(raw) is not bytes or type(digest) is not bytes:
            raise damaged(db_path, criterion, seq, b"", "stored values have the wrong type")
        try:
            event = from_bytes(raw)
        except DecodeError as exc:
            raise damaged(db_path, criterion, seq, raw, f"undecodable ({exc})") from None
        if event.hash != digest:
            raise damaged(db_path, criterion, seq, raw, "stored bytes do not match the event hash")
        if event.criterion != criterion or event.seq != seq or (
            event.prev != prev if seq == 0 or seq > first else False
        ):
            raise damaged(db_path, criterion, seq, raw, "stored bytes do not match the position")
        out.append(event)
        prev = digest
    return out


def iter_main_unchecked(
    conn: sqlite3.Connection, criterion: bytes, start: int, stop: int | None
) -> sqlite3.Cursor:
    """A cursor over ``(seq, raw)`` of the main chain in ``[start, stop)`` as stored.

    No per-row checks: for callers that prove every hash link themselves.
    One SELECT statement, so one consistent snapshot until the cursor is
    closed; a value of the wrong type reads as bytes that fail to decode,
    never as another Python type. Fetch with ``fetchmany()``.
    """
    start = max(start, 0)
    stop = MAX_SEQ if stop is None else max(stop, start)
    rows = conn.execute(
        "SELECT seq, ifnull(CAST(raw AS BLOB), x'') FROM events"
        " WHERE criterion = ? AND orphan IS NULL AND seq >= ? AND seq < ? ORDER BY seq",
        (criterion, start, stop),
    )
    rows.arraysize = _FETCH_ROWS
    return rows


def iter_orphans(
    conn: sqlite3.Connection, db_path: str, criterion: bytes
) -> Iterator[tuple[int, bytes, bytes]]:
    """``(seq, hash, raw)`` of the orphans of a chain, oldest first, each checked."""
    rows = conn.execute(
        "SELECT seq, hash, raw FROM events WHERE criterion = ? AND orphan IS NOT NULL"
        " ORDER BY orphan, seq",
        (criterion,),
    )
    try:
        for seq, digest, raw in rows:
            check_row(db_path, criterion, seq, None, digest, raw, linked=False)
            yield seq, digest, raw
    finally:
        rows.close()
