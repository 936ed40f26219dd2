"""The CIDs of the chains in this node's store, sans-IO.

A chain's blocks are not kept twice: the store holds the events, and this
index the CID of each one's block, by seq (a block's CID depends on every
block before it, so it is computed once, in order, as the chain grows). A
block is rebuilt from its event and its predecessor's CID when it is served,
and checked against the indexed CID, so a store that changed under the index
serves nothing wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ketten import Event
from ketten.ipld import EventBlock, event_block

__all__ = ["ChainIndex"]


@attrs.define(eq=False)
class ChainIndex:
    """CIDs by seq for each chain indexed, and the hash of each chain's last event."""

    _cids: dict[bytes, list[bytes]] = attrs.field(factory=dict, init=False)
    _last: dict[bytes, bytes] = attrs.field(factory=dict, init=False)
    """criterion -> hash of the last event indexed."""

    def __contains__(self, criterion: bytes) -> bool:
        return criterion in self._cids

    def length(self, criterion: bytes) -> int:
        """How many events of ``criterion`` are indexed (the next seq to index)."""
        cids = self._cids.get(criterion)
        return 0 if cids is None else len(cids)

    def extend(self, events: Sequence[Event]) -> bool:
        """Index ``events``, a run of one chain following what is indexed of it.
        False (and nothing indexed) if the run does not follow on: the chain
        changed under the index, which then starts again (:meth:`cut` to 0)."""
        if not events:
            return True
        criterion = events[0].criterion
        cids = self._cids.get(criterion, [])
        last = self._last.get(criterion)
        prev_cid = cids[-1] if cids else None
        expected = len(cids)
        added: list[bytes] = []
        for event in events:
            if (event.criterion != criterion or event.seq != expected
                    or (expected > 0 and event.prev != last)):
                self.cut(criterion, 0)
                return False
            block = event_block(event, prev_cid)
            added.append(block.binary)
            prev_cid, last, expected = block.binary, event.hash, expected + 1
        self._cids.setdefault(criterion, cids).extend(added)
        assert last is not None
        self._last[criterion] = last
        return True

    def cut(self, criterion: bytes, length: int) -> None:
        """The store cut its copy back to ``length`` events: forget the chain's CIDs
        (indexed again from the store when next asked for)."""
        cids = self._cids.get(criterion)
        if cids is None or length >= len(cids):
            return
        # The hash of the event now last is not kept here: index from the store again.
        del self._cids[criterion]
        self._last.pop(criterion, None)

    def cid(self, criterion: bytes, seq: int) -> bytes | None:
        cids = self._cids.get(criterion)
        if cids is None or not 0 <= seq < len(cids):
            return None
        return cids[seq]

    def tip(self, criterion: bytes) -> tuple[bytes, int] | None:
        """The CID and seq of the newest indexed block of ``criterion``."""
        cids = self._cids.get(criterion)
        return None if not cids else (cids[-1], len(cids) - 1)

    def strides(self, criterion: bytes, seq: int, root: bytes, stride: int,
                count: int) -> list[bytes]:
        """The CIDs ``0, stride, 2 * stride, ...`` links behind ``root`` at ``seq``
        (at most ``count``), or nothing if ``root`` is not at ``seq`` here."""
        if self.cid(criterion, seq) != root:
            return []
        cids = self._cids[criterion]
        return [cids[s] for s in range(seq, max(-1, seq - stride * count), -stride)]

    def blocks(self, criterion: bytes, seq: int, events: Sequence[Event]) -> list[EventBlock]:
        """The blocks of ``events`` (read from the store: seq ``seq`` down, newest
        first), each checked against the indexed CID; stops at the first that
        does not match."""
        out: list[EventBlock] = []
        for offset, event in enumerate(events):
            at = seq - offset
            cid = self.cid(criterion, at)
            if cid is None or event.seq != at:
                break
            block = event_block(event, self.cid(criterion, at - 1) if at > 0 else None)
            if block.binary != cid:
                break
            out.append(block)
        return out
