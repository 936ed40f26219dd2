"""``ReplicaSets``: who holds a chain, who leads it, who should hold it.

A chain's brokers are its configuration, not whoever the overlay names
closest right now. Routes (configuration, term, leader, commit) come from
this node's own replica state when it has one, from a bounded cache fed by
brokers' answers (a redirect, a reply), and only on a miss from a network
lookup: the overlay's closest nodes are asked what they know of the chain
(``locate``). If none of them holds it, the chain does not exist yet and the
answer is whom to create it on.

``desired()`` is what the overlay's routing table names now (no network
traffic): the leader compares it with the configuration to decide moves.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import attrs
import trio

from .._core.membership import Member, majority
from .._core.messages import Locate, Route
from ..errors import KettenError, QuorumUnavailable
from ..interfaces import Overlay, Peer
from .rpc import Rpc

__all__ = ["Creation", "ReplicaSets"]

_MAX_ROUTES = 1 << 16


@attrs.frozen
class Creation:
    """Nobody holds the chain: create it on ``members`` (nearest first)."""

    members: tuple[Member, ...]


def member_of(peer: Peer) -> Member:
    return Member(peer.public_key, peer.address)


@attrs.define(eq=False)
class ReplicaSets:
    """Routes to chains, cached; lookups on a miss; the overlay's view for moves."""

    rpc: Rpc
    overlay: Overlay | None
    own: Callable[[], Member]
    replication: int
    local: Callable[[bytes], Route | None]
    timeout: float
    _routes: OrderedDict[bytes, Route] = attrs.field(factory=OrderedDict, init=False)
    _lookups: int = attrs.field(default=0, init=False)

    @property
    def lookups(self) -> int:
        """Network lookups made (misses of the cache)."""
        return self._lookups

    def cached(self, criterion: bytes) -> Route | None:
        route = self.local(criterion)
        if route is not None:
            return route
        found = self._routes.get(criterion)
        if found is not None:
            self._routes.move_to_end(criterion)
        return found

    def learn(self, criterion: bytes, route: Route) -> None:
        """Remember ``route`` unless a newer one is known (epoch, then term)."""
        known = self._routes.get(criterion)
        if known is not None and (known.config.epoch, known.term) > (route.config.epoch,
                                                                     route.term):
            return
        self._routes[criterion] = route
        self._routes.move_to_end(criterion)
        while len(self._routes) > _MAX_ROUTES:
            self._routes.popitem(last=False)

    def forget(self, criterion: bytes) -> None:
        self._routes.pop(criterion, None)

    def address(self, member: Member) -> str:
        """Where to reach ``member`` now: the overlay's latest address for its key."""
        find = getattr(self.overlay, "address_of", None)
        if find is not None:
            found = find(member.key)
            if found:
                return str(found)
        return member.address

    def desired(self, criterion: bytes) -> list[Member]:
        """The ``r`` members the overlay's routing table names for ``criterion`` now."""
        if self.overlay is None:
            return [self.own()]
        return [member_of(p) for p in self.overlay.nearest(criterion, self.replication)]

    async def candidates(self, criterion: bytes, count: int) -> list[Member]:
        """The ``count`` nodes closest to ``criterion`` (a network lookup if need be)."""
        if self.overlay is None:
            return [self.own()]
        return [member_of(p) for p in await self.overlay.closest(criterion, count)]

    async def route(self, criterion: bytes, *, refresh: bool = False) -> Route | Creation:
        """The chain's route, or whom to create it on.

        Raises :class:`~ketten.errors.QuorumUnavailable` when no node near
        the key answered, so that nobody can tell whether the chain exists.
        """
        if not refresh:
            known = self.cached(criterion)
            if known is not None:
                return known
        else:
            local = self.local(criterion)
            if local is not None and local.leader is not None:
                return local
        route, answered, asked = await self.survey(criterion)
        if route is not None:
            return route
        cached = self._routes.get(criterion)
        if cached is not None:
            # Known to exist, its brokers silent: never start a second chain.
            return cached
        members = (await self.candidates(criterion, self.replication))[: self.replication]
        if self.overlay is not None and len(members) < self.replication:
            raise QuorumUnavailable(
                f"only {len(members)} node(s) are known near criterion {criterion.hex()[:16]}; "
                f"a new chain needs r = {self.replication} brokers (NodeConfig.replication must "
                "not exceed the number of nodes in the network)")
        if answered < majority(min(asked, len(members)) or 1):
            raise QuorumUnavailable(
                f"only {answered} of the {asked} nodes nearest to criterion "
                f"{criterion.hex()[:16]} answered; whether the chain exists cannot be told")
        return Creation(tuple(members))

    async def survey(self, criterion: bytes) -> tuple[Route | None, int, int]:
        """Ask the nodes nearest to ``criterion`` (twice ``r`` of them) what they know.

        Returns the newest route any of them holds, how many answered and
        how many were asked (this node counts as one that answered).
        """
        self._lookups += 1
        nearby = await self.candidates(criterion, 2 * self.replication)
        own = self.own().key
        best = self.local(criterion)
        answered = 1 if any(m.key == own for m in nearby) else 0
        others = [m for m in nearby if m.key != own]
        results: list[Route | bool | None] = [False] * len(others)

        async def ask(index: int, member: Member) -> None:
            try:
                _, reply = await self.rpc.call(self.address(member), Locate((criterion,)),
                                               timeout=self.timeout / 2, retransmit=True)
            except KettenError:
                return
            routes = reply.routes
            results[index] = routes[0] if len(routes) == 1 else None

        async with trio.open_nursery() as nursery:
            for index, member in enumerate(others):
                nursery.start_soon(ask, index, member)
        for result in results:
            if result is False:
                continue
            answered += 1
            if isinstance(result, Route) and (
                    best is None or (result.config.epoch, result.term) > (best.config.epoch,
                                                                        best.term)):
                best = result
        if best is not None:
            self.learn(criterion, best)
        return best, answered, len(nearby) if nearby else 1

    def members_of(self, route: Route) -> Sequence[Member]:
        return route.config.members()
