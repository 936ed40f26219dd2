"""Schema, migrations and format recognition of the ``sqlite`` store.

The database file carries ``application_id`` (who owns the file) and
``user_version`` (schema version) in its header, so a store directory can be
recognised, and refused, by reading 100 bytes without touching anything.
"""

from __future__ import annotations

import os
import re
import sqlite3

from ketten.errors import StoreCorrupted, StoreFormatError

__all__ = [
    "APPLICATION_ID",
    "DB_NAME",
    "SCHEMA_VERSION",
    "check_existing",
    "corrupted",
    "migrate",
    "owns_directory",
]

DB_NAME = "ketten.sqlite3"
APPLICATION_ID = 0x6B746E31  # "ktn1"
SCHEMA_VERSION = 1
_SQLITE_MAGIC = b"SQLite format 3\x00"

# Each entry migrates from the previous version; index 0 creates version 1.
_MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY,
            criterion BLOB NOT NULL,
            seq INTEGER NOT NULL,
            hash BLOB NOT NULL,
            author BLOB NOT NULL,
            command INTEGER,
            orphan INTEGER,
            raw BLOB NOT NULL
        )""",
        # ``orphan`` is NULL on the main chain, else the number of the fork
        # resolution (per criterion) that orphaned the event.
        "CREATE UNIQUE INDEX events_main ON events(criterion, seq) WHERE orphan IS NULL",
        "CREATE UNIQUE INDEX events_command ON events(criterion, author, command)"
        " WHERE orphan IS NULL AND command IS NOT NULL",
        "CREATE INDEX events_hash ON events(hash)",
        "CREATE INDEX events_orphans ON events(criterion, orphan, seq) WHERE orphan IS NOT NULL",
        """CREATE TABLE chains (
            criterion BLOB PRIMARY KEY,
            head_seq INTEGER NOT NULL,
            head_hash BLOB NOT NULL
        ) WITHOUT ROWID""",
        "CREATE TABLE cursors (name TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID",
        """CREATE TABLE quarantine (
            criterion BLOB PRIMARY KEY,
            from_seq INTEGER NOT NULL,
            old_height INTEGER NOT NULL
        ) WITHOUT ROWID""",
    ],
]
assert len(_MIGRATIONS) == SCHEMA_VERSION

SCHEMA_V1 = _MIGRATIONS[0]


def corrupted(db_path: str, exc: sqlite3.DatabaseError, page_size: int | None = None) -> StoreCorrupted:
    """A :class:`StoreCorrupted` for an error SQLite raised on a damaged file."""
    offset = None
    match = re.search(r"[Pp]age (\d+)", str(exc))
    if match and page_size:
        offset = (int(match.group(1)) - 1) * page_size
    return StoreCorrupted(f"SQLite reports a damaged database: {exc}", path=db_path, offset=offset)


def owns_directory(path: str) -> bool:
    """Whether ``path`` holds a database file that claims to be a ketten sqlite store."""
    header = _read_header(os.path.join(path, DB_NAME))
    return header is not None and _application_id(header) == APPLICATION_ID


def _read_header(db_path: str) -> bytes | None:
    try:
        with open(db_path, "rb") as f:
            return f.read(100)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _application_id(header: bytes) -> int:
    return int.from_bytes(header[68:72], "big")


def check_existing(path: str) -> bool:
    """Check that ``path`` may be opened as a sqlite store; return whether it holds one.

    Reads only. Raises :class:`~ketten.errors.StoreFormatError` if ``path``
    is not a directory, holds other files and no store, or holds a database
    that is not a ketten store or has a newer schema version.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise StoreFormatError(f"{path}: not a directory, cannot hold a sqlite store")
    db_path = os.path.join(path, DB_NAME)
    header = _read_header(db_path)
    if header is None:
        if os.path.isdir(path):
            others = sorted(os.listdir(path))
            if others:
                raise StoreFormatError(
                    f"{path}: holds {', '.join(others[:5])} but no {DB_NAME}; "
                    "not a sqlite store directory"
                )
        return False
    if len(header) == 0:
        return False  # SQLite creates the file empty; nothing was ever committed
    if not header.startswith(_SQLITE_MAGIC) or len(header) < 100:
        raise StoreFormatError(f"{db_path}: not an SQLite database")
    app_id = _application_id(header)
    if app_id != APPLICATION_ID:
        raise StoreFormatError(
            f"{db_path}: an SQLite database of another application (application_id {app_id:#x})"
        )
    version = int.from_bytes(header[60:64], "big")
    if version > SCHEMA_VERSION:
        raise StoreFormatError(
            f"{db_path}: schema version {version} is newer than this ketten "
            f"(supports up to {SCHEMA_VERSION}); upgrade ketten to open it"
        )
    return True


def migrate(conn: sqlite3.Connection, db_path: str) -> None:
    """Bring a fresh or older database to :data:`SCHEMA_VERSION` in one transaction.

    Raises :class:`~ketten.errors.StoreFormatError` for a database of another
    application or a newer version (also re-checked here, after any WAL).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _version_to_migrate(conn, db_path)
        for step in range(version, SCHEMA_VERSION):
            for statement in _MIGRATIONS[step]:
                conn.execute(statement)
        if version != SCHEMA_VERSION:
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _version_to_migrate(conn: sqlite3.Connection, db_path: str) -> int:
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    foreign = StoreFormatError(f"{db_path}: an SQLite database of another application")
    if app_id not in (0, APPLICATION_ID) or (app_id == 0 and version != 0):
        raise foreign
    if version > SCHEMA_VERSION:
        raise StoreFormatError(
            f"{db_path}: schema version {version} is newer than this ketten "
            f"(supports up to {SCHEMA_VERSION})"
        )
    if version == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        raise foreign
    return version
