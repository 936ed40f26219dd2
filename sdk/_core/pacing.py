"""Pacing, sans-IO: how often a node exchanges digests with each peer, and how long
it waits for one answer before it asks others too.

Anti-entropy compares the chains two brokers share once per background
round. While anything changes on this node it does so every round. Once an
exchange found a peer in step and nothing changed here since, that peer is
skipped for twice as many rounds as the last time, up to ``2 ** max_level``
rounds: an idle node costs its peers almost nothing. A peer that has news
changed on its side, so it does not wait: it starts the exchange itself.
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

__all__ = ["DigestPacing", "Hedge"]


@attrs.define(eq=False)
class DigestPacing:
    """Per peer: the activity count at its last in-step exchange, the backoff level
    and the round it is due again."""

    max_level: int = 4
    _peers: dict[bytes, tuple[int, int, int]] = attrs.field(factory=dict)

    def due(self, key: bytes, round_: int, activity: int) -> bool:
        """Exchange with ``key`` in round ``round_``, this node's activity count being
        ``activity``?"""
        known = self._peers.get(key)
        return known is None or known[0] != activity or round_ >= known[2]

    def in_step(self, key: bytes, round_: int, activity: int) -> None:
        """The exchange of round ``round_`` (begun at ``activity``) found no difference."""
        known = self._peers.get(key)
        level = 0 if known is None or known[0] != activity else min(known[1] + 1,
                                                                      self.max_level)
        self._peers[key] = (activity, level, round_ + (1 << level))

    def out_of_step(self, key: bytes) -> None:
        """The exchange found differences, or failed: exchange every round again."""
        self._peers.pop(key, None)

    def keep_only(self, keys: Collection[bytes]) -> None:
        """Forget peers no chain is shared with any more."""
        for key in [k for k in self._peers if k not in keys]:
            del self._peers[key]

    def __len__(self) -> int:
        return len(self._peers)


@attrs.define(eq=False)
class Hedge:
    """When to send a hedged request: the delay after which a request that has not
    been answered is sent to others as well.

    The delay is ``floor`` while answers come quickly, and grows to ``factor``
    times the smoothed answer time (up to ``cap``) when they come slowly: a
    fixed delay below the answer time would send every request to everyone
    exactly when the nodes are overloaded, adding load where there is none
    to spare.
    """

    floor: float
    cap: float
    factor: float = 3.0
    weight: float = 0.2
    _smoothed: float | None = attrs.field(default=None, init=False)

    def observe(self, seconds: float) -> None:
        """An answer came ``seconds`` after its request was sent."""
        seconds = max(0.0, seconds)
        smoothed = self._smoothed
        self._smoothed = seconds if smoothed is None else (
            smoothed + self.weight * (seconds - smoothed))

    @property
    def smoothed(self) -> float | None:
        return self._smoothed

    @property
    def delay(self) -> float:
        if self._smoothed is None:
            return self.floor
        return min(max(self.floor, self.factor * self._smoothed), max(self.cap, self.floor))
