"""The blocks this node serves, sans-IO: event blocks by CID, bounded in bytes.

Blocks enter in two ways: :meth:`Blockstore.add_events` turns a run of a
chain's events into their IPLD blocks (each linking the block before it),
and :meth:`Blockstore.put` keeps a block fetched from a provider (checked
against its CID by the fetch). Chains this node pins (the ones it
replicates, or pinned by the application) are never collected; the blocks
of other chains are collected least recently used first once the store
holds more than ``max_bytes``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import attrs

from ketten import Event
from ketten.errors import UsageError
from ketten.ipld import EventBlock, event_block

__all__ = ["Blockstore"]


@attrs.define(eq=False)
class Blockstore:
    """Event blocks by binary CID, one main chain per criterion."""

    max_bytes: int = 256 * 1024 * 1024
    """Bytes of unpinned blocks kept before the least recently used go."""
    _blocks: OrderedDict[bytes, EventBlock] = attrs.field(factory=OrderedDict, init=False)
    _by_seq: dict[bytes, dict[int, bytes]] = attrs.field(factory=dict, init=False)
    """criterion -> {seq: binary CID} of the blocks held."""
    _tips: dict[bytes, tuple[Event, bytes]] = attrs.field(factory=dict, init=False)
    """criterion -> (last event added, its block's CID)."""
    _pinned: set[bytes] = attrs.field(factory=set, init=False)
    _bytes: int = attrs.field(default=0, init=False)
    _unpinned_bytes: int = attrs.field(default=0, init=False)
    collected: int = attrs.field(default=0, init=False)
    """Blocks collected to stay under ``max_bytes``."""

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, cid: bytes) -> bool:
        return cid in self._blocks

    @property
    def size(self) -> int:
        """Bytes of the blocks held."""
        return self._bytes

    def tip(self, criterion: bytes) -> bytes | None:
        """The CID of the newest block of ``criterion`` added by :meth:`add_events`."""
        tip = self._tips.get(criterion)
        return None if tip is None else tip[1]

    def tip_seq(self, criterion: bytes) -> int | None:
        tip = self._tips.get(criterion)
        return None if tip is None else tip[0].seq

    def cid_at(self, criterion: bytes, seq: int) -> bytes | None:
        """The CID of the held block of ``criterion`` at ``seq``."""
        cid = self._by_seq.get(criterion, {}).get(seq)
        return cid if cid is not None and cid in self._blocks else None

    def add_events(self, events: Sequence[Event]) -> list[EventBlock]:
        """Add the blocks of ``events``, a run of one chain that starts at its genesis
        or right after the last event added for it; returns the blocks.

        Raises :class:`~ketten.errors.UsageError` if the run does not follow on.
        """
        if not events:
            return []
        criterion = events[0].criterion
        tip = self._tips.get(criterion)
        prev_cid = None if tip is None else tip[1]
        prev_event = None if tip is None else tip[0]
        blocks: list[EventBlock] = []
        for event in events:
            if event.criterion != criterion:
                raise UsageError("add_events takes a run of one chain")
            if event.seq == 0:
                if prev_event is not None and blocks:
                    raise UsageError("a genesis must start the run")
                prev_cid = None
            elif prev_event is None or event.seq != prev_event.seq + 1 or event.prev != prev_event.hash:
                raise UsageError(f"seq {event.seq} of {criterion.hex()[:16]} does not follow "
                                 "the blocks held")
            block = event_block(event, prev_cid)
            blocks.append(block)
            prev_cid, prev_event = block.binary, event
        for block in blocks:
            self._keep(block)
        assert prev_event is not None and prev_cid is not None
        self._tips[criterion] = (prev_event, prev_cid)
        self._collect()
        return blocks

    def put(self, block: EventBlock) -> None:
        """Keep a block checked against its CID (a fetched one)."""
        if block.binary not in self._blocks:
            self._keep(block)
            self._collect()

    def get(self, cid: bytes) -> EventBlock | None:
        block = self._blocks.get(cid)
        if block is not None:
            self._blocks.move_to_end(cid)
        return block

    def walk(self, root: bytes, count: int, max_bytes: int) -> list[bytes]:
        """The data of up to ``count`` blocks from ``root`` back along ``prev``, at most
        ``max_bytes`` of them (always the first); stops at a block not held."""
        out: list[bytes] = []
        size = 0
        cid: bytes | None = root
        while cid is not None and len(out) < count:
            block = self._blocks.get(cid)
            if block is None or (out and size + len(block.data) > max_bytes):
                break
            out.append(block.data)
            size += len(block.data)
            cid = block.prev_binary
        return out

    def strides(self, root: bytes, stride: int, count: int) -> list[bytes]:
        """CIDs of the held blocks ``0, stride, 2 * stride, ...`` links behind ``root``
        on its chain (at most ``count``, ``root`` first); stops at one not held."""
        block = self._blocks.get(root)
        if block is None:
            return []
        index = self._by_seq.get(block.event.criterion, {})
        out: list[bytes] = []
        seq = block.event.seq
        while seq >= 0 and len(out) < count:
            cid = root if seq == block.event.seq else index.get(seq)
            if cid is None or cid not in self._blocks:
                break
            out.append(cid)
            seq -= stride
        return out

    def pin(self, criterion: bytes) -> None:
        """Keep every block of ``criterion`` whatever the bound."""
        if criterion in self._pinned:
            return
        self._pinned.add(criterion)
        for cid in self._by_seq.get(criterion, {}).values():
            block = self._blocks.get(cid)
            if block is not None:
                self._unpinned_bytes -= len(block.data)

    def unpin(self, criterion: bytes) -> None:
        if criterion not in self._pinned:
            return
        self._pinned.discard(criterion)
        for cid in self._by_seq.get(criterion, {}).values():
            block = self._blocks.get(cid)
            if block is not None:
                self._unpinned_bytes += len(block.data)
        self._collect()

    def pinned(self, criterion: bytes) -> bool:
        return criterion in self._pinned

    def _keep(self, block: EventBlock) -> None:
        old = self._blocks.pop(block.binary, None)
        if old is not None:
            self._blocks[block.binary] = old
            return
        self._blocks[block.binary] = block
        criterion = block.event.criterion
        self._by_seq.setdefault(criterion, {})[block.event.seq] = block.binary
        self._bytes += len(block.data)
        if criterion not in self._pinned:
            self._unpinned_bytes += len(block.data)

    def _collect(self) -> None:
        if self._unpinned_bytes <= self.max_bytes:
            return
        for cid in list(self._blocks):
            if self._unpinned_bytes <= self.max_bytes:
                break
            block = self._blocks[cid]
            criterion = block.event.criterion
            if criterion in self._pinned:
                continue
            del self._blocks[cid]
            size = len(block.data)
            self._bytes -= size
            self._unpinned_bytes -= size
            self.collected += 1
            index = self._by_seq.get(criterion)
            if index is not None and index.get(block.event.seq) == cid:
                del index[block.event.seq]
                if not index:
                    del self._by_seq[criterion]
            tip = self._tips.get(criterion)
            if tip is not None and tip[1] == cid:
                del self._tips[criterion]
