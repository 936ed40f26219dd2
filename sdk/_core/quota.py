"""Rate limits per identity, sans-IO: a token bucket per key, a bounded number of keys.

A broker uses it to bound how many chains one author may start per interval
(``replication`` options ``creations_per_second`` and ``creation_burst``) and
how many bytes of events it accepts from one author per interval
(``author_bytes_per_second`` and ``author_bytes_burst``).
The table keeps at most ``max_keys`` buckets and forgets the least recently
used one first; a forgotten key starts again with a full bucket, which gives
an author nothing it could not get from a fresh key.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

__all__ = ["RateLimit"]


@attrs.define(eq=False)
class RateLimit:
    """At most ``burst`` units at once per key, refilled at ``rate`` per second (an action
    costs one unit unless it says otherwise)."""

    rate: float
    burst: float
    max_keys: int = 4096
    _buckets: OrderedDict[bytes, tuple[float, float]] = attrs.field(
        factory=OrderedDict, init=False)
    refused: int = attrs.field(default=0, init=False)

    def allow(self, key: bytes, now: float, cost: float = 1.0) -> bool:
        """Take ``cost`` tokens of ``key`` at time ``now``; ``False`` (counted, nothing
        taken) if fewer are left."""
        tokens = self._level(key, now)
        allowed = tokens >= cost
        if allowed:
            tokens -= cost
        else:
            self.refused += 1
        self._buckets[key] = (tokens, now)
        self._buckets.move_to_end(key)  # least recently used first
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return allowed

    def wait(self, key: bytes, now: float, cost: float = 1.0) -> float:
        """Seconds until ``key`` has ``cost`` tokens again (0 if it has them now)."""
        tokens = self._level(key, now)
        return 0.0 if tokens >= cost else (cost - tokens) / self.rate

    def _level(self, key: bytes, now: float) -> float:
        tokens, then = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + max(0.0, now - then) * self.rate)

    def __len__(self) -> int:
        return len(self._buckets)
