"""Two-part names on the GosSkip ring and the contacts that carry them.

A node's name is the pair ``(key hash, random order)``: the key hash is its
node id (``SHA-256`` of its public key), the order a random 64-bit number it
draws when it starts. Names sort by key hash first, then by order, and the
ring closes after the largest name. A criterion's key ``K`` names the point
``(K, 0)``; its *successors* are the nodes met going clockwise from there,
so a node whose id is ``K`` is its first successor.
"""

from __future__ import annotations

import attrs

from ketten.interfaces import Peer

__all__ = [
    "ORDER_BITS",
    "RING",
    "Contact",
    "between",
    "clockwise",
    "key_distance",
    "point",
]

ORDER_BITS = 64
RING = 1 << (256 + ORDER_BITS)
"""Positions run from 0 to ``RING - 1``: the key hash above the order."""


def point(key: bytes, order: int = 0) -> int:
    """The ring position of the name ``(key, order)``."""
    return (int.from_bytes(key, "big") << ORDER_BITS) | order


def clockwise(start: int, end: int) -> int:
    """Steps from ``start`` clockwise to ``end`` (0 when they are equal)."""
    return (end - start) % RING


def between(start: int, middle: int, end: int) -> bool:
    """Whether ``middle`` lies strictly inside the clockwise arc from ``start`` to ``end``.

    With ``start == end`` the arc is the whole ring but ``start``."""
    if start == end:
        return middle != start
    return 0 < clockwise(start, middle) < clockwise(start, end)


def key_distance(node_id: bytes, key: bytes) -> int:
    """How far a node lies clockwise from a key, by key hash alone: nodes sorted by it
    are the key's ring successors, nearest first (the metric of ``closest``)."""
    return (int.from_bytes(node_id, "big") - int.from_bytes(key, "big")) % (1 << 256)


@attrs.frozen
class Contact:
    """A node on the ring: the peer (address and public key) and its name's order."""

    peer: Peer
    order: int
    position: int = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "position", point(self.peer.node_id, self.order))

    @property
    def key(self) -> bytes:
        """The public key identifying the node."""
        return self.peer.public_key
