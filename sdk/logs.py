"""Structured, rate-limited log records, as ketten writes them (plugins may use them too).

ketten logs under the ``ketten`` logger (``ketten.tcp``, ``ketten.publish``,
``ketten.replication``, ``ketten.store``, ...), with a ``NullHandler``: the
application decides where records go. Nothing is logged per event at INFO
or above. Records about refused peers, failed publishes, reconfigurations
and store repairs carry a ``ketten`` attribute, a dict with ``event`` (what
happened, e.g. ``"peer_refused"``), the fields that say where (``peer``,
``criterion``, ...) and ``suppressed`` (similar records left out before this
one); a JSON formatter can write it out as is::

    class Json(logging.Formatter):
        def format(self, record):
            return json.dumps({"level": record.levelname, "message": record.getMessage(),
                               **getattr(record, "ketten", {})})

A flood of alike records (a peer retrying a refused handshake, a publish
failing in a loop) is cut to one record per key and interval; the next
record for that key reports how many were left out.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import attrs
import trio

__all__ = ["RateLimitedLog"]


def _now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # outside a trio run
        return time.monotonic()


@attrs.define(eq=False)
class RateLimitedLog:
    """At most one record per ``interval`` seconds per key on ``logger``; the rest are
    counted and reported with the next record of their key."""

    logger: logging.Logger
    interval: float = 10.0
    max_keys: int = 1024
    """Keys remembered at most; past it the memory of earlier records is dropped."""
    _last: dict[str, float] = attrs.field(factory=dict, init=False)
    _suppressed: dict[str, int] = attrs.field(factory=dict, init=False)

    def log(self, level: int, event: str, message: str, *args: Any, key: str | None = None,
            exc_info: bool = False, **fields: Any) -> bool:
        """Log ``message % args`` with ``record.ketten = {"event": event, **fields,
        "suppressed": n}``, unless a record of the same ``key`` (default ``event``)
        was logged less than ``interval`` seconds ago. Returns whether it was logged."""
        return self._emit(level, event, message, args, key, exc_info, fields, 3)

    def warning(self, event: str, message: str, *args: Any, key: str | None = None,
                exc_info: bool = False, **fields: Any) -> bool:
        """:meth:`log` at WARNING."""
        return self._emit(logging.WARNING, event, message, args, key, exc_info, fields, 3)

    def info(self, event: str, message: str, *args: Any, key: str | None = None,
             exc_info: bool = False, **fields: Any) -> bool:
        """:meth:`log` at INFO."""
        return self._emit(logging.INFO, event, message, args, key, exc_info, fields, 3)

    def _emit(self, level: int, event: str, message: str, args: tuple[Any, ...],
              key: str | None, exc_info: bool, fields: dict[str, Any], depth: int) -> bool:
        if not self.logger.isEnabledFor(level):
            return False
        slot = event if key is None else key
        now = _now()
        if now - self._last.get(slot, -math.inf) < self.interval:
            if slot in self._suppressed or len(self._suppressed) < self.max_keys:
                self._suppressed[slot] = self._suppressed.get(slot, 0) + 1
            return False
        suppressed = self._suppressed.pop(slot, 0)
        if len(self._last) >= self.max_keys:
            self._last.clear()
        self._last[slot] = now
        suffix = f" ({suppressed} similar suppressed)" if suppressed else ""
        # The record names the caller's line, not this module's.
        self.logger.log(level, message + suffix, *args, exc_info=exc_info, stacklevel=depth,
                        extra={"ketten": {"event": event, **fields, "suppressed": suppressed}})
        return True
