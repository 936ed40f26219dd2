"""When the ``sqlite`` store may run a small transaction on the event loop's thread (sans-IO).

Handing a transaction to a worker thread and back costs more CPU than a
small write on a disk that syncs fast. A disk that syncs slowly must not
stall the event loop, though. The store therefore runs small appends
inline while the median of the last 16 inline transactions stays under a
limit (a median, so that a transaction that merely lost the CPU to another
process, or met a busy disk queue, does not count), and sends everything to
the worker thread for a while once it does not.
"""

from __future__ import annotations

from collections import deque

import attrs

__all__ = ["InlineCommits"]


@attrs.define(eq=False)
class InlineCommits:
    """Tracks inline transaction times; ``now`` and durations in seconds."""

    limit: float
    """Median duration above which transactions go to the worker thread (0: never inline)."""
    window: int = 16
    backoff: float = 5.0
    """Seconds of worker-thread transactions after the median went over the limit."""
    _recent: deque[bool] = attrs.field(init=False)
    """Of the last ``window`` inline transactions: whether each took longer than ``limit``."""
    _over: int = attrs.field(default=0, init=False)
    _threaded_until: float = attrs.field(default=float("-inf"), init=False)

    def __attrs_post_init__(self) -> None:
        self._recent = deque(maxlen=self.window)

    def allowed(self, now: float) -> bool:
        """Whether the next small transaction may run inline."""
        return self.limit > 0 and now >= self._threaded_until

    def observe(self, duration: float, now: float) -> None:
        """Record how long an inline transaction took (``now``: when it ended)."""
        recent = self._recent
        if len(recent) == self.window:
            self._over -= recent[0]
        over = duration > self.limit
        recent.append(over)
        self._over += over
        count = len(recent)
        # The median (the upper one of an even count) is over the limit when at
        # least the upper half of the sorted durations is.
        if count >= self.window // 2 and self._over >= count - count // 2:
            self._threaded_until = now + self.backoff
            recent.clear()
            self._over = 0
