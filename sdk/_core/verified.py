"""``VerifiedSignatures``: the events whose signatures this node checked lately."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import attrs

from .event import Event, is_verified, mark_verified

__all__ = ["VerifiedSignatures"]


@attrs.define(eq=False)
class VerifiedSignatures:
    """A bounded memory of the hashes of events whose signatures verified here.

    An event's hash covers its signature and every signed field, so the same
    event decoded again from the network (a retransmitted append, a reader's
    copy fetched again after it was dropped) needs no second Ed25519 check.
    Only events that verified are remembered; the oldest are forgotten first.
    """

    capacity: int = 4096
    """About 0.6 MB when full."""
    _hashes: OrderedDict[bytes, None] = attrs.field(factory=OrderedDict, init=False)

    def recall(self, events: Sequence[Event]) -> int:
        """Mark those of ``events`` whose hash verified here before as verified;
        return how many were."""
        known = 0
        hashes = self._hashes
        for event in events:
            if event.hash in hashes:
                mark_verified(event)
                known += 1
        return known

    def remember(self, events: Sequence[Event]) -> None:
        """Remember those of ``events`` whose signature verified."""
        hashes = self._hashes
        for event in events:
            if is_verified(event):
                hashes[event.hash] = None
        while len(hashes) > self.capacity:
            hashes.popitem(last=False)

    def __len__(self) -> int:
        return len(self._hashes)
