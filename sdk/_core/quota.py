"""Rate limits per identity, sans-IO: a token bucket per key, a bounded number of keys.

A broker uses it to bound how many chains one author may start per interval
(``replication`` options ``creations_per_second`` and ``creation_burst``).
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
    """At most ``burst`` actions at once per key, refilled at ``rate`` per second."""

    rate: float
    burst: float
    max_keys: int = 4096
    _buckets: OrderedDict[bytes, tuple[float, float]] = attrs.field(
        factory=OrderedDict, init=False)
    refused: int = attrs.field(default=0, init=False)

    def allow(self, key: bytes, now: float) -> bool:
        """Take one token of ``key`` at time ``now``; ``False`` (counted) if none is left."""
        tokens, then = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - then) * self.rate)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        else:
            self.refused += 1
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return allowed

    def wait(self, key: bytes, now: float) -> float:
        """Seconds until ``key`` has a token again (0 if it has one now)."""
        tokens, then = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - then) * self.rate)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def __len__(self) -> int:
        return len(self._buckets)
