"""Head records, sans-IO: the newest committed block of a chain, kept near its key.

Like an IPNS record, a head record names the current root of a mutable
thing (a chain) and carries a version (the head's seq) so that a newer one
replaces an older one. It is the head event's block itself: its CID is
checked against its bytes and the event's signature by its author, so a
record cannot be forged for an event nobody signed. A node that holds a
committed copy of a chain puts the record of its commit position at the
nodes closest to the chain's key; readers take the highest seq they are
shown. A record is a hint, not a proof that the chain's brokers committed
that event: :meth:`ketten.Node.read` asks the chain's leader.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

__all__ = ["HeadRecord", "HeadRecords"]


@attrs.frozen
class HeadRecord:
    """One head record: the block (and its CID) of the head at ``seq``."""

    cid: bytes
    seq: int
    block: bytes
    publisher: bytes


@attrs.define(eq=False)
class HeadRecords:
    """The highest head record of each key this node was given, bounded."""

    max_keys: int = 16384
    """Keys kept (the least recently updated goes first)."""
    per_publisher: int = 1024
    """Keys one publisher's records may hold here."""
    _records: OrderedDict[bytes, HeadRecord] = attrs.field(factory=OrderedDict, init=False)
    _held: dict[bytes, int] = attrs.field(factory=dict, init=False)
    refused: int = attrs.field(default=0, init=False)

    def __len__(self) -> int:
        return len(self._records)

    def offer(self, key: bytes, cid: bytes, seq: int, block: bytes, publisher: bytes) -> bool:
        """Keep the record (already checked) if it is newer than the one held; whether
        this node now holds exactly it."""
        held = self._records.get(key)
        if held is not None and (held.seq > seq or (held.seq == seq and held.cid <= cid)):
            return held.cid == cid
        if ((held is None or held.publisher != publisher)
                and self._held.get(publisher, 0) >= self.per_publisher):
            self.refused += 1
            return False
        if held is not None:
            self._drop(key)
        while len(self._records) >= self.max_keys:
            self._drop(next(iter(self._records)))
        self._records[key] = HeadRecord(cid, seq, block, publisher)
        self._held[publisher] = self._held.get(publisher, 0) + 1
        return True

    def get(self, key: bytes) -> HeadRecord | None:
        return self._records.get(key)

    def _drop(self, key: bytes) -> None:
        record = self._records.pop(key)
        left = self._held[record.publisher] - 1
        if left:
            self._held[record.publisher] = left
        else:
            del self._held[record.publisher]
