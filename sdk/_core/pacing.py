"""How often a node exchanges digests with each peer, sans-IO.

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

__all__ = ["DigestPacing"]


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
