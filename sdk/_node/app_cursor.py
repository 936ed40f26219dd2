"""A durable subscription's cursor kept in the application's own database.

With ``node.durable_subscription(name, criteria, cursor_in=connection)`` the
cursor lives in the table ``ketten_cursors(name, state)`` of a DB-API 2.0
connection the application owns. ``async with sub.next() as event:`` writes
the cursor in that connection after the block and commits the connection
once: what the block wrote and the cursor commit, or roll back, together.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import attrs

from ..errors import StoreCorrupted, StoreError, UsageError

__all__ = ["ConnectionCursor"]

TABLE = "ketten_cursors"


_MARKERS = {"qmark": "?", "format": "%s", "pyformat": "%s", "numeric": ":{n}", "named": ":p{n}"}


def _bind(style: str, sql: str, values: tuple[Any, ...]) -> tuple[str, Any]:
    """``sql`` with its ``{}`` placeholders in the driver's paramstyle, and the parameters
    to pass with it."""
    marker = _MARKERS[style]
    text = sql.format(*(marker.format(n=n) for n in range(1, len(values) + 1)))
    if style == "named":
        return text, {f"p{n}": value for n, value in enumerate(values, 1)}
    return text, values


@attrs.define(eq=False)
class ConnectionCursor:
    """One subscription's row in ``ketten_cursors`` of an application's connection."""

    _connection: Any
    _name: str
    _style: str

    @classmethod
    def attach(cls, connection: Any, name: str) -> ConnectionCursor:
        """Check ``connection`` and make sure the table exists (committed).

        Raises :class:`~ketten.errors.UsageError` for an object that is not a
        DB-API connection or an autocommitting sqlite3 connection (the effect
        and the cursor would not commit together), and
        :class:`~ketten.errors.StoreError` if the table cannot be created.
        """
        for method in ("cursor", "commit", "rollback"):
            if not callable(getattr(connection, method, None)):
                raise UsageError(f"cursor_in must be a DB-API connection (no {method}())")
        if getattr(connection, "isolation_level", "") is None \
                or getattr(connection, "autocommit", False) is True:
            raise UsageError(
                "cursor_in: the connection commits every statement on its own (autocommit), so "
                "an effect and the cursor could not commit together; open it with transactions")
        module = sys.modules.get(type(connection).__module__.split(".")[0])
        style = getattr(module, "paramstyle", None)
        if style not in _MARKERS:
            raise UsageError(f"cursor_in: cannot tell the paramstyle of {type(connection)!r} "
                             f"(got {style!r}, not one of DB-API's five)")
        cursor = cls(connection, name, style)
        cursor._run(f"CREATE TABLE IF NOT EXISTS {TABLE} (name TEXT PRIMARY KEY, state BLOB NOT NULL)",
                    (), what="create the cursor table")
        cursor.commit()
        return cursor

    def load(self) -> bytes | None:
        """The stored state, as the connection sees it (``None``: no row yet).

        Raises :class:`~ketten.errors.StoreCorrupted` for a row whose state is not
        bytes (it is never taken for a missing one and overwritten)."""
        rows = self._run(f"SELECT state FROM {TABLE} WHERE name = {{}}", (self._name,),
                         what="read the cursor", fetch=True)
        if not rows:
            return None
        state = rows[0][0]
        if not isinstance(state, (bytes, bytearray, memoryview)):
            raise StoreCorrupted(f"durable subscription {self._name!r}: row {self._name!r} of "
                                 f"the application's {TABLE} holds {type(state).__name__}, "
                                 "not bytes")
        return bytes(state)

    def stage(self, state: bytes) -> None:
        """Write ``state`` inside the connection's current transaction (not committed)."""
        updated = self._run(f"UPDATE {TABLE} SET state = {{}} WHERE name = {{}}",
                            (state, self._name), what="write the cursor")
        if updated == 0:
            self._run(f"INSERT INTO {TABLE} (name, state) VALUES ({{}}, {{}})",
                      (self._name, state), what="write the cursor")

    def write(self, state: bytes) -> None:
        """Stage ``state`` and commit the connection; roll back if either fails."""
        try:
            self.stage(state)
            self.commit()
        except BaseException:
            with contextlib.suppress(StoreError):
                self.rollback()
            raise

    def commit(self) -> None:
        try:
            self._connection.commit()
        except Exception as exc:
            raise StoreError(f"cursor_in: commit failed: {exc!r}") from exc

    def rollback(self) -> None:
        try:
            self._connection.rollback()
        except Exception as exc:
            raise StoreError(f"cursor_in: rollback failed: {exc!r}") from exc

    def _run(self, sql: str, values: tuple[Any, ...], *, what: str, fetch: bool = False) -> Any:
        text, params = _bind(self._style, sql, values)
        try:
            cursor = self._connection.cursor()
            try:
                cursor.execute(text, params)
                return cursor.fetchall() if fetch else cursor.rowcount
            finally:
                cursor.close()
        except Exception as exc:
            raise StoreError(f"cursor_in: could not {what} in {TABLE}: {exc!r}") from exc
