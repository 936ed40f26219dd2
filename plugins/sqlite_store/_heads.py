"""The ``chains`` rows checked against the events at open.

A chain's row (head seq and hash) is derived from its events, so damage to
it is repaired from them; events missing below the head (a hole in the main
chain) are quarantined from the first missing seq, so the node fetches that
range again from its peers rather than serving or extending a broken chain.
"""

from __future__ import annotations

import sqlite3

import attrs

__all__ = ["HeadRepair", "reconcile_heads"]


@attrs.frozen
class HeadRepair:
    """One chain whose row did not match its events, and what was done."""

    criterion: bytes
    row: tuple[int, bytes] | None
    """The head the row claimed (``None``: no row)."""
    head: tuple[int, bytes] | None
    """The head the events give, after any quarantine (``None``: no events)."""
    hole: int | None = None
    """The first missing seq, if the main chain had a hole (quarantined from there)."""


def reconcile_heads(conn: sqlite3.Connection) -> list[HeadRepair]:
    """Check every chain row against the main-chain events and repair what differs,
    in one transaction; returns the repairs (none on an intact store)."""
    rows = {criterion: (seq, digest) for criterion, seq, digest in conn.execute(
        "SELECT criterion, head_seq, head_hash FROM chains")}
    spans = {criterion: (top, count) for criterion, top, count in conn.execute(
        "SELECT criterion, MAX(seq), COUNT(*) FROM events WHERE orphan IS NULL"
        " GROUP BY criterion")}
    damaged: list[tuple[bytes, tuple[int, bytes] | None, tuple[int, int] | None, int | None]] = []
    for criterion in sorted(rows.keys() | spans.keys()):
        row = rows.get(criterion)
        span = spans.get(criterion)
        hole = None
        if span is not None and span[1] != span[0] + 1:
            hole = _first_missing(conn, criterion)
        if (hole is None and span is not None and row is not None and row[0] == span[0]
                and _hash_at(conn, criterion, row[0]) == row[1]):
            continue
        damaged.append((criterion, row, span, hole))
    if not damaged:
        return []
    conn.execute("BEGIN IMMEDIATE")
    try:
        repairs = [_repair(conn, *entry) for entry in damaged]
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return repairs


def _repair(conn: sqlite3.Connection, criterion: bytes, row: tuple[int, bytes] | None,
            span: tuple[int, int] | None, hole: int | None) -> HeadRepair:
    top = None if span is None else span[0]
    if hole is not None:
        conn.execute("DELETE FROM events WHERE criterion = ? AND orphan IS NULL AND seq >= ?",
                     (criterion, hole))
        height = max(top if top is not None else -1, row[0] if row else -1) + 1
        conn.execute(
            "INSERT INTO quarantine (criterion, from_seq, old_height) VALUES (?, ?, ?)"
            " ON CONFLICT(criterion) DO UPDATE SET from_seq = min(from_seq, excluded.from_seq),"
            " old_height = max(old_height, excluded.old_height)", (criterion, hole, height))
        top = hole - 1 if hole > 0 else None
    elif (row is not None and (top is None or row[0] > top)
          and (top is None or _hash_at(conn, criterion, top) != row[1])):
        # the row names a head that is gone (not merely a damaged seq in the
        # row): fetch the events again, like a hole
        height = row[0] + 1
        conn.execute(
            "INSERT INTO quarantine (criterion, from_seq, old_height) VALUES (?, ?, ?)"
            " ON CONFLICT(criterion) DO UPDATE SET from_seq = min(from_seq, excluded.from_seq),"
            " old_height = max(old_height, excluded.old_height)",
            (criterion, 0 if top is None else top + 1, height))
    head: tuple[int, bytes] | None = None
    if top is not None:
        digest = _hash_at(conn, criterion, top)
        head = None if digest is None else (top, digest)
    if head is None:
        conn.execute("DELETE FROM chains WHERE criterion = ?", (criterion,))
    else:
        conn.execute(
            "INSERT INTO chains (criterion, head_seq, head_hash) VALUES (?, ?, ?)"
            " ON CONFLICT(criterion) DO UPDATE SET head_seq = excluded.head_seq,"
            " head_hash = excluded.head_hash", (criterion, head[0], head[1]))
    return HeadRepair(criterion, row, head, hole)


def _hash_at(conn: sqlite3.Connection, criterion: bytes, seq: int) -> bytes | None:
    found = conn.execute("SELECT hash FROM events WHERE criterion = ? AND orphan IS NULL"
                         " AND seq = ?", (criterion, seq)).fetchone()
    return None if found is None else bytes(found[0])


def _first_missing(conn: sqlite3.Connection, criterion: bytes) -> int:
    if _hash_at(conn, criterion, 0) is None:
        return 0
    found = conn.execute(
        "SELECT e.seq + 1 FROM events e WHERE e.criterion = ? AND e.orphan IS NULL"
        " AND NOT EXISTS (SELECT 1 FROM events n WHERE n.criterion = e.criterion"
        " AND n.orphan IS NULL AND n.seq = e.seq + 1) ORDER BY e.seq LIMIT 1",
        (criterion,)).fetchone()
    return int(found[0])
