"""Head records, sans-IO: the newest committed block of a chain, kept near its key.

Like an IPNS record, a head record names the current root of a mutable
thing (a chain) and carries a version (the head's seq) so that a newer one
replaces an older one. It is the head event's block itself: its CID is
checked against its bytes and the event's signature by its author, so a
record cannot be forged for an event nobody signed. A node that holds a
committed copy of a chain puts the record of its commit position at the
nodes closest to the chain's key; readers take the highest seq they are
shown. A record is a hint, not a proof that the chain's brokers committed
that event: :meth:`ketten.Node.read` asks the chain's leader. A record lapses
``ttl`` seconds after it was last put (holders put theirs again with every
provider announcement), so one that nobody renews (a chain whose holders
all left) is forgotten.
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
    expires: float


@attrs.define(eq=False)
class HeadRecords:
    """The highest head record of each key this node was given, bounded."""

    ttl: float
    """Seconds a record lives unless it is put again."""
    max_keys: int = 16384
    """Keys kept (the least recently updated goes first)."""
    per_publisher: int = 1024
    """Keys one publisher's records may hold here."""
    _records: OrderedDict[bytes, HeadRecord] = attrs.field(factory=OrderedDict, init=False)
    _held: dict[bytes, int] = attrs.field(factory=dict, init=False)
    refused: int = attrs.field(default=0, init=False)

    def __len__(self) -> int:
        return len(self._records)

    def offer(self, key: bytes, cid: bytes, seq: int, block: bytes, publisher: bytes,
              now: float) -> bool:
        """Keep the record (already checked) if it is newer than the one held, or put
        again (it lives ``ttl`` from ``now`` then); whether this node now holds
        exactly it."""
        held = self.get(key, now)
        if held is not None and (held.seq > seq or (held.seq == seq and held.cid < cid)):
            return False
        if held is not None and held.seq == seq and held.cid == cid:  # put again
            self._records[key] = attrs.evolve(held, expires=now + self.ttl)
            self._records.move_to_end(key)
            return True
        if ((held is None or held.publisher != publisher)
                and self._held.get(publisher, 0) >= self.per_publisher):
            self.refused += 1
            return False
        if held is not None:
            self._drop(key)
        while len(self._records) >= self.max_keys:
            self._drop(next(iter(self._records)))
        self._records[key] = HeadRecord(cid, seq, block, publisher, now + self.ttl)
        self._held[publisher] = self._held.get(publisher, 0) + 1
        return True

    def get(self, key: bytes, now: float) -> HeadRecord | None:
        """The live record of ``key``, or ``None``."""
        record = self._records.get(key)
        if record is not None and record.expires <= now:
            self._drop(key)
            return None
        return record

    def expire(self, now: float) -> int:
        """Forget every lapsed record; return how many went."""
        lapsed = [key for key, record in self._records.items() if record.expires <= now]
        for key in lapsed:
            self._drop(key)
        return len(lapsed)

    def _drop(self, key: bytes) -> None:
        record = self._records.pop(key)
        left = self._held[record.publisher] - 1
        if left:
            self._held[record.publisher] = left
        else:
            del self._held[record.publisher]
