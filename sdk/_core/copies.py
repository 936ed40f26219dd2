"""``CopyBudget``: which reader copies a node gives up to stay within its bound, sans-IO.

A node keeps copies of chains it does not replicate: ``node.read()`` and
``node.sync()`` extend one, a subscription stores what it delivers, a read
through ``ipfs`` providers keeps what it fetched (and the node then provides
it). Unlike a broker's copy, such a copy can always be had again from the
chain's brokers, so it is a cache: once the copies hold more than
``max_events`` events, the least recently used go first. Pinned copies and
those with a subscription open are kept and not counted; a copy being read
is kept until the read ends.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import attrs

__all__ = ["CopyBudget"]


@attrs.define(eq=False)
class CopyBudget:
    """The sizes of a node's reader copies, least recently used first."""

    max_events: int
    """Events the copies may hold in all before the least recently used go."""
    _sizes: OrderedDict[bytes, int] = attrs.field(factory=OrderedDict, init=False)
    _total: int = attrs.field(default=0, init=False)
    _uses: dict[bytes, int] = attrs.field(factory=dict, init=False)
    _kept: set[bytes] = attrs.field(factory=set, init=False)
    """Copies found kept at the last :meth:`surplus` (they do not count)."""
    _kept_total: int = attrs.field(default=0, init=False)

    @property
    def total(self) -> int:
        """Events held in reader copies."""
        return self._total

    def __len__(self) -> int:
        return len(self._sizes)

    def __contains__(self, criterion: object) -> bool:
        return criterion in self._sizes

    def note(self, criterion: bytes, events: int) -> bool:
        """The copy of ``criterion`` now holds ``events`` events and was just used.
        Returns whether the copies that count are over the bound."""
        change = events - self._sizes.pop(criterion, 0)
        self._total += change
        if criterion in self._kept:
            self._kept_total += change
        self._sizes[criterion] = events
        return self.over()

    def over(self) -> bool:
        """Whether the copies that count (kept ones as of the last :meth:`surplus`
        do not) hold more events than the bound."""
        return self._total - self._kept_total > self.max_events

    def touch(self, criterion: bytes) -> None:
        """The copy was read: it goes last."""
        if criterion in self._sizes:
            self._sizes.move_to_end(criterion)

    def forget(self, criterion: bytes) -> None:
        """The chain is no longer a reader copy here (dropped, or replicated now)."""
        size = self._sizes.pop(criterion, 0)
        self._total -= size
        if criterion in self._kept:
            self._kept.discard(criterion)
            self._kept_total -= size

    def use(self, criterion: bytes) -> None:
        """A read of the copy begins: it is kept until :meth:`done`."""
        self._uses[criterion] = self._uses.get(criterion, 0) + 1
        self.touch(criterion)

    def done(self, criterion: bytes) -> None:
        left = self._uses.get(criterion, 0) - 1
        if left > 0:
            self._uses[criterion] = left
        else:
            self._uses.pop(criterion, None)

    def in_use(self, criterion: bytes) -> bool:
        return criterion in self._uses

    def droppable(self, criterion: bytes, keep: Callable[[bytes], bool]) -> bool:
        """Whether the copy may go now: still a copy here, not in use, not kept."""
        return criterion in self._sizes and criterion not in self._uses and not keep(criterion)

    def surplus(self, keep: Callable[[bytes], bool]) -> list[bytes]:
        """The copies to give up, least recently used first, so that the others fit
        the bound. Copies ``keep`` names (pinned, subscribed) neither count nor go;
        copies in use count but are passed over."""
        kept = self._kept = {criterion for criterion in self._sizes if keep(criterion)}
        self._kept_total = sum(self._sizes[c] for c in kept)
        excess = self._total - self._kept_total - self.max_events
        out: list[bytes] = []
        for criterion, size in self._sizes.items():
            if excess <= 0:
                break
            if criterion in self._uses or criterion in kept:
                continue
            out.append(criterion)
            excess -= size
        return out
