"""A chain as a DAG of event blocks: built from events, and checked back from a CAR.

A chain's CAR has one root, the head block; every other block is reached
from it through ``prev`` links, down to the genesis. Sections may come in any
order and repeat (the same CID and bytes); a block that the walk from the
root does not reach is refused, as is any second root.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs
from multiformats import CID

from ..errors import BrokenLink, DecodeError, InvalidEvent, UsageError
from .car import CarSection
from .chain import Verify, scan_encoded_chain
from .event import Event
from .ipld import EventBlock, cid_bytes, cid_from_bytes, cid_text, decode_block, event_block

__all__ = ["CarChain", "chain_blocks", "chain_from_car"]


def chain_blocks(events: Iterable[Event]) -> Iterator[EventBlock]:
    """The blocks of a run of events of one chain from its genesis, in seq order.

    Each block links the one before it. Raises
    :class:`~ketten.errors.UsageError` if the run does not start at the
    genesis or an event is not the successor of the one before it.
    """
    prev: EventBlock | None = None
    for event in events:
        if prev is None and not event.is_genesis:
            raise UsageError(f"a chain's blocks start at its genesis, not at seq {event.seq}")
        if prev is not None and (event.seq != prev.event.seq + 1 or event.prev != prev.event.hash):
            raise UsageError(f"seq {event.seq} does not follow seq {prev.event.seq}")
        block = event_block(event, prev.binary if prev is not None else None)
        yield block
        prev = block


@attrs.frozen
class CarChain:
    """A chain read back from a CAR: its head block's CID and its events, genesis first."""

    root: CID
    events: list[Event]

    @property
    def criterion(self) -> bytes:
        return self.events[0].criterion


def _name(block: EventBlock) -> str:
    return f"block {cid_text(block.binary)} (seq {block.event.seq})"


def chain_from_car(roots: list[CID], sections: Iterable[CarSection], *,
                   verify: Verify = Verify.FULL) -> CarChain:
    """Check the CAR of one chain; return the chain.

    Every block is checked against its CID and the block layout
    (:func:`~ketten._core.ipld.decode_block`), every link is followed from
    the root to the genesis, and the events are checked as a chain at level
    ``verify`` (hash links, heights and, with ``FULL``, signatures and the
    writer policy). Raises :class:`~ketten.errors.DecodeError` for a damaged
    block, a missing block or a CAR of another shape, and
    :class:`~ketten.errors.InvalidEvent` (``BrokenLink``,
    ``InvalidSignature``, ...) for a chain rule broken; each message names
    the block.
    """
    if len(roots) != 1:
        raise DecodeError(f"a chain's CAR has one root (its head block), this one has "
                          f"{len(roots)}", where="car header")
    blocks: dict[bytes, EventBlock] = {}
    for section in sections:
        seen = blocks.get(section.binary)
        if seen is None:
            blocks[section.binary] = decode_block(section.binary, section.data)
        elif seen.data != section.data:
            decode_block(section.binary, section.data)  # raises: not what the CID names
    root = cid_bytes(roots[0])
    chain: list[EventBlock] = []
    cid: bytes | None = root
    child: EventBlock | None = None
    while cid is not None:
        block = blocks.get(cid)
        if block is None:
            linked = f", linked from {_name(child)}" if child is not None else " (the root)"
            raise DecodeError(f"missing{linked}", where=f"block {cid_text(cid)}")
        if child is not None:
            if block.event.seq + 1 != child.event.seq:
                raise BrokenLink(f"{_name(child)} links {_name(block)}, which is not "
                                 f"seq {child.event.seq - 1}")
            if child.event.prev != block.event.hash:
                raise BrokenLink(f"{_name(child)}: prevHash is not the hash of the event "
                                 f"in the block it links ({cid_text(block.binary)})")
        chain.append(block)
        child, cid = block, block.prev_binary
    chain.reverse()
    if len(chain) != len(blocks):
        walked = {b.binary for b in chain}
        stray = next(c for c in blocks if c not in walked)
        raise DecodeError(f"not part of the chain of the root {cid_text(root)}",
                          where=f"block {cid_text(stray)}")
    passed = 0
    try:
        for _ in scan_encoded_chain((b.event.to_bytes() for b in chain), verify=verify):
            passed += 1
    except InvalidEvent as exc:
        raise type(exc)(f"{_name(chain[passed])}: {exc}", reason=exc.reason) from None
    return CarChain(cid_from_bytes(root), [b.event for b in chain])

