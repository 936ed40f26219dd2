"""Kademlia identifiers: the XOR metric, contacts and the S/Kademlia static puzzle."""

from __future__ import annotations

import random

import attrs

from ketten import leading_zero_bits, puzzle_ok, solve_puzzle
from ketten.errors import UsageError
from ketten.interfaces import Peer

__all__ = [
    "ID_BITS",
    "Contact",
    "bucket_index",
    "id_in_bucket",
    "leading_zero_bits",
    "puzzle_ok",
    "solve_puzzle",
]

ID_BITS = 256


@attrs.frozen(slots=True)
class Contact:
    """An authenticated node: its id (as an integer, for the XOR metric) and its peer."""

    id: int
    peer: Peer

    @classmethod
    def of(cls, peer: Peer) -> Contact:
        return cls(int.from_bytes(peer.node_id, "big"), peer)

    @property
    def node_id(self) -> bytes:
        return self.id.to_bytes(32, "big")


def bucket_index(own: int, other: int) -> int:
    """Length of the common prefix of two ids (256 for equal ids)."""
    return ID_BITS - (own ^ other).bit_length()


def id_in_bucket(own: int, index: int, rng: random.Random) -> int:
    """A random id sharing exactly ``index`` leading bits with ``own``."""
    if not 0 <= index < ID_BITS:
        raise UsageError(f"bucket index must be in [0, {ID_BITS}), got {index}")
    flip = 1 << (ID_BITS - 1 - index)
    low = rng.getrandbits(ID_BITS - 1 - index) if index < ID_BITS - 1 else 0
    keep = ~((flip << 1) - 1) & ((1 << ID_BITS) - 1)
    return (own & keep) | ((own ^ flip) & flip) | low
