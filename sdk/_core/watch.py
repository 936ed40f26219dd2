"""Patience with a chain that should move, sans-IO.

A broker of a chain whose configuration no longer matches the overlay's
nearest nodes waits for the leader to move it. Once the mismatch has lasted
the hysteresis period (a flapping node moves nothing) and no leader acted,
it is time to stand in; after standing in, it waits a full period again.
"""

from __future__ import annotations

import attrs

__all__ = ["MoveWatch"]


@attrs.define(eq=False)
class MoveWatch:
    """When each mismatched chain began to mismatch."""

    hysteresis: float
    _since: dict[bytes, float] = attrs.field(factory=dict)

    def due(self, criterion: bytes, now: float, *, mismatched: bool) -> bool:
        """Observe ``criterion`` (``mismatched``: its voters differ from the nearest
        nodes, or a change is under way); ``True`` once it has been so for the
        hysteresis period."""
        if not mismatched:
            self._since.pop(criterion, None)
            return False
        since = self._since.setdefault(criterion, now)
        return now - since >= self.hysteresis

    def stood(self, criterion: bytes, now: float) -> None:
        """Someone stood in for ``criterion``: be patient a full period again."""
        self._since[criterion] = now

    def forget(self, criterion: bytes) -> None:
        self._since.pop(criterion, None)

    def __len__(self) -> int:
        return len(self._since)
