"""Taking the hand-over of the chains near a node, sans-IO.

A node that joined near a key, or came back after a while, knows nothing of
the chains there; its "no such chain" must not count until a majority of the
nodes nearest to that key have handed over (told it the chains it is nearer
to than one of their voters). This object keeps who has handed over, who to
ask next, and follows each peer's paged answer; the driver sends the
:class:`~ketten._core.messages.Handover` requests it names and feeds back
the replies.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

import attrs

from .membership import majority
from .messages import HandoverReply

__all__ = ["HandoverState", "Page"]

P = TypeVar("P")

MAX_PAGES = 64
"""Pages taken from one peer in one round; a peer that has more is asked again later."""
MAX_HANDED = 1 << 12
"""Peers remembered as having handed over (the oldest are forgotten first)."""
MAX_WANTED = 64
"""Peers waiting to be asked (beyond that, asks wait for the next round)."""


@attrs.frozen
class Page:
    """What one hand-over page told: chains to note as existing, and what next."""

    criteria: tuple[bytes, ...]
    after: bytes | None
    """Ask again from after this key; ``None``: this peer is done with."""
    handed: bool
    """The peer has handed over in full."""


@attrs.define(eq=False)
class HandoverState(Generic[P]):
    """Who has handed over; whom to ask next (peers known by key, reached as ``P``)."""

    _handed: OrderedDict[bytes, None] = attrs.field(factory=OrderedDict)
    _wanted: dict[bytes, P] = attrs.field(factory=dict)
    _pages: dict[bytes, int] = attrs.field(factory=dict)

    def settled(self, near: Sequence[tuple[bytes, P]]) -> bool:
        """Whether a majority of ``near`` (the ``r`` other nodes nearest to a key,
        as ``(key, address)``) has handed over. Those that have not are wanted."""
        missing = [(key, peer) for key, peer in near if key not in self._handed]
        for key, peer in missing:
            if len(self._wanted) >= MAX_WANTED:
                break
            self._wanted.setdefault(key, peer)
        return bool(near) and len(near) - len(missing) >= majority(len(near))

    @property
    def wanting(self) -> bool:
        """Some peer waits to be asked: a round is due now."""
        return bool(self._wanted)

    def round(self, near: Iterable[tuple[bytes, P]]) -> list[tuple[bytes, P]]:
        """Start a round: the peers to ask (``near``, the nodes nearest to this one,
        and those wanted since the last round), none that handed over already."""
        wanted, self._wanted = self._wanted, {}
        peers = dict(near)
        peers.update(wanted)
        self._pages.clear()
        return [(key, peer) for key, peer in peers.items() if key not in self._handed]

    def on_reply(self, key: bytes, after: bytes, reply: HandoverReply) -> Page:
        """``reply`` of peer ``key`` to ``Handover(after)``."""
        noted = tuple(c for c in reply.criteria if c > after)
        if not reply.more:
            self._handed[key] = None
            while len(self._handed) > MAX_HANDED:
                self._handed.popitem(last=False)
            return Page(noted, None, True)
        pages = self._pages.get(key, 0) + 1
        self._pages[key] = pages
        if not reply.criteria or reply.criteria[-1] <= after or pages >= MAX_PAGES:
            return Page(noted, None, False)  # "more" without progress, or too many
        return Page(noted, reply.criteria[-1], False)

    def handed(self, key: bytes) -> bool:
        return key in self._handed
