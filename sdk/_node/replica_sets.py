"""``ReplicaSets``: who holds a chain, who leads it, who should hold it.

A chain's brokers are its configuration, not whoever the overlay names
closest right now. Routes (configuration, term, leader, commit) come from
this node's own replica state when it has one, from a bounded cache fed by
brokers' answers (a redirect, a reply); on a miss, the ``r`` nodes the
overlay's routing table names nearest to the key are asked what they know of
the chain (``locate``, no lookup). Only when none of them knows it, or the
known route went stale, does a network lookup find the nodes nearest to the
key and ask them all. If none of them holds it either, the chain does not
exist yet and the answer is whom to create it on.

``desired()`` is what the overlay's routing table names now (no network
traffic): the leader compares it with the configuration to decide moves.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from .._core.acquaintances import Acquaintances
from .._core.claims import AddressClaims
from .._core.handover import HandoverState
from .._core.membership import ChainConfig, Member
from .._core.messages import MAX_BATCH, Handover, Locate, Ping, Pong, Route
from .._core.pacing import Hedge
from .._core.survey import Creation, Located, Survey, conclude, doubt, preference, tally
from ..errors import KettenError, RemoteError, UsageError
from ..interfaces import Overlay, Peer
from .coalesce import Coalescer
from .rpc import Rpc, guarded

__all__ = ["Creation", "Located", "ReplicaSets", "Survey"]

_MAX_ROUTES = 1 << 16
_MAX_KNOWN = 1 << 18

_Desired = tuple[tuple[Member, ...], frozenset[bytes]]
"""The members the routing table names for a key, and their keys."""


def member_of(peer: Peer) -> Member:
    return Member(peer.public_key, peer.address)


@attrs.define(eq=False, repr=False)
class ReplicaSets:
    """Routes to chains, cached; lookups on a miss; the overlay's view for moves."""

    rpc: Rpc
    overlay: Overlay | None
    own: Callable[[], Member]
    replication: int
    local: Callable[[bytes], Route | None]
    timeout: float
    nursery: Callable[[], trio.Nursery]
    """Where batched locate requests run."""
    rival: Callable[[bytes, bytes, str, tuple[ChainConfig, ...]], None] = (
        lambda criterion, genesis, address, configs: None)
    """Called when a survey finds another chain of a criterion this node holds."""
    known_changed: Callable[[], None] = lambda: None
    """Called when the known chains (see :meth:`known_bytes`) grew."""
    load: Callable[[bytes], Awaitable[Route | None]] | None = None
    """This node's view of a chain it holds state of, read from the store if need be
    (after a restart nothing is loaded until asked)."""
    acquaintances: Acquaintances = attrs.field(factory=Acquaintances)
    """Nodes this node heard from (fed by the node from every authenticated peer)."""
    memory: float = 600.0
    """How long a node heard from counts as near a key though the overlay dropped it."""
    now: Callable[[], float] = trio.current_time
    _routes: OrderedDict[bytes, Route] = attrs.field(factory=OrderedDict, init=False)
    _known: OrderedDict[bytes, None] = attrs.field(factory=OrderedDict, init=False)
    """Chains this node has seen exist (kept longer than routes, and across restarts)."""
    _known_dirty: bool = attrs.field(default=False, init=False)
    _lookups: int = attrs.field(default=0, init=False)
    _near_asks: int = attrs.field(default=0, init=False)
    _locates: Coalescer[Member, bytes, Located] = attrs.field(init=False)
    _desired: OrderedDict[bytes, tuple[int, _Desired]] = attrs.field(factory=OrderedDict,
                                                                       init=False)
    _handover: HandoverState[Member] = attrs.field(factory=HandoverState, init=False)
    """Who handed this node the chains near it, whom to ask next (see :meth:`settle`)."""
    _near_self: tuple[int, list[tuple[bytes, Member]]] | None = attrs.field(
        default=None, init=False)
    """The nodes nearest to this one, and the routing-table version they were read at."""
    _want: trio.Event = attrs.field(factory=trio.Event, init=False)
    _hedge: Hedge = attrs.field(init=False)
    _claims: AddressClaims = attrs.field(
        factory=lambda: AddressClaims(retry_after=60.0, max_checks=32), init=False)
    """Claimed addresses proven and refuted. A refuted claim is ignored for a minute,
    then checked again: a check can fail for an honest node (a partition that began
    just then), and its requests count again soon."""
    _refuted: int = attrs.field(default=0, init=False)
    _admits: Callable[[bytes], bool] | None = attrs.field(default=None, init=False)
    """The overlay's optional ``admits`` (see :class:`~ketten.interfaces.Overlay`)."""

    def __attrs_post_init__(self) -> None:
        admits = getattr(self.overlay, "admits", None)
        self._admits = admits if callable(admits) else None
        self._locates = Coalescer(self._send_locate, self.nursery, MAX_BATCH)
        self._hedge = Hedge(floor=min(0.25, self.timeout / 8), cap=self.timeout / 4)
        self.rpc.serve(Ping, self._serve_ping)

    async def _serve_ping(self, peer: Peer, request: Ping) -> Pong:
        return Pong()

    def heard(self, peer: Peer, reached: bool) -> None:
        """``peer`` sent an authenticated request (``reached``: an answer to one sent
        to its address, or the transport knows it listens there). A node first
        heard from through its own request is
        remembered at the address it claims while that address is checked with one
        ping: an answer with its key proves it; a claim refused there (nobody
        listens, another node answers) is forgotten and ignored for a minute; a
        check that gets no answer in time leaves the claim counting near a key for
        two request timeouts only (a partition may have begun), and it is
        checked again when the node is heard from again. A claim that cannot be checked
        now (too many checks out, or one of this node's already) is not
        remembered. A peer the overlay does not admit (see
        :class:`~ketten.interfaces.Overlay`) is never remembered."""
        key, address, now = peer.public_key, peer.address, self.now()
        if self._admits is not None and not self._admits(key):
            return  # not a member of this network: it stands for nobody near a key
        known = self.acquaintances
        node_id = int.from_bytes(peer.node_id, "big")
        if reached:
            if known.answered_at(key) != address:  # else proven when it first answered
                self._claims.prove(node_id, address)
        elif (known.answered_at(key) is None
              and (known.claimed_at(key) != address or known.doubted(key))
              and not self._claims.proven(node_id, address)):
            if self._claims.refuted(node_id, address, now):
                return  # a claim found false a moment ago: not remembered again
            if not self._claims.check(node_id, address, now):
                return
            try:
                self.nursery().start_soon(guarded, self._check_claim, peer)
            except UsageError:  # the node is closing
                self._claims.checked(node_id, address)
                return
        known.saw(key, address, now, reached=reached)

    async def _check_claim(self, peer: Peer) -> None:
        node_id = int.from_bytes(peer.node_id, "big")
        refused = False
        try:
            with trio.move_on_after(self.timeout / 2) as waited:
                await self.rpc.call(peer.address, Ping(), timeout=self.timeout,
                                    retransmit=True, expect=peer.public_key)
            if waited.cancelled_caught:
                # It counts near a key a little longer (a partition may have begun).
                self.acquaintances.doubt(peer.public_key, peer.address,
                                         self.now() + 2 * self.timeout)
        except RemoteError:
            pass  # something answered there, with an error: proves nothing either way
        except KettenError:
            refused = True  # refused, or answered by another node
        finally:
            self._claims.checked(node_id, peer.address)
        if refused:
            self._claims.refute(node_id, peer.address, self.now())
            if self.acquaintances.refute(peer.public_key, peer.address):
                self._refuted += 1

    async def _send_locate(self, member: Member, criteria: list[bytes]) -> list[Located]:
        sent = self.now()
        try:
            _, reply = await self.rpc.call(self.address(member), Locate(tuple(criteria)),
                                           timeout=self.timeout / 2, retransmit=True,
                                           expect=member.key)
        except KettenError:
            return []
        self._hedge.observe(self.now() - sent)
        if len(reply.routes) != len(criteria):
            return []
        held = reply.held or (False,) * len(criteria)
        settled = reply.settled or (False,) * len(criteria)
        return [Located(route, h, s)
                for route, h, s in zip(reply.routes, held, settled, strict=True)]

    async def locate(self, member: Member, criterion: bytes) -> Located | None:
        """What ``member`` knows of ``criterion`` (``None``: it did not answer). Asks
        made in one scheduler pass to one node travel in one request."""
        return await self._locates.call(member, criterion)

    def settled_for(self, criterion: bytes) -> bool:
        """Whether this node has had the hand-over (see :meth:`settle`) from a majority
        of the ``r`` other nodes its routing table names nearest to ``criterion``:
        only then does its "no such chain" count. If not, it asks them soon."""
        if self.overlay is None or self.replication <= 1:
            return True
        own = self.own().key
        near = [(m.key, m) for m in map(member_of, self.overlay.nearest(
            criterion, self.replication + 1)) if m.key != own][: self.replication]
        settled = self._handover.settled(near)
        if self._handover.wanting:
            self._want.set()
        return settled

    async def settle(self, retry: float) -> None:
        """Take the hand-over of the chains near this node (those it is nearer to
        than one of their brokers): from the ``2r`` nodes nearest to it, and from
        the nodes near a key it was asked about (see :meth:`settled_for`); each
        node once, tried again every ``retry`` seconds until it answers in full.

        A node that joined near a key, or came back after a while, knows nothing
        of the chains there; without the hand-over its "no such chain" would let
        a survey conclude that a chain with acknowledged events does not exist.
        """
        if self.overlay is None or self.replication <= 1:
            return
        while True:
            await guarded(self._settle_round)
            with trio.move_on_after(retry):
                await self._want.wait()

    async def _settle_round(self) -> None:
        assert self.overlay is not None
        self._want = trio.Event()  # first: a round that fails must not leave it set
        asks = self._handover.round(self._nearest_to_self())
        if not asks:
            return
        async with trio.open_nursery() as nursery:
            for key, member in asks:
                nursery.start_soon(self._take_handover, key, member)

    def _nearest_to_self(self) -> list[tuple[bytes, Member]]:
        """The ``2r`` nodes nearest to this one (keyed), worked out again only when
        the overlay's routing table changed."""
        assert self.overlay is not None
        version = self.routing_version()
        if version is not None and self._near_self is not None and self._near_self[0] == version:
            return self._near_self[1]
        own = self.own()
        near = [(m.key, m) for m in map(member_of, self.overlay.nearest(
            own.node_id, 2 * self.replication + 1)) if m.key != own.key]
        if version is not None:
            self._near_self = version, near
        return near

    async def _take_handover(self, key: bytes, member: Member) -> None:
        after: bytes | None = b""
        while after is not None:
            try:
                _, reply = await self.rpc.call(self.address(member), Handover(after),
                                               timeout=self.timeout, retransmit=True,
                                               expect=key)
            except KettenError:
                return
            page = self._handover.on_reply(key, after, reply)
            for criterion in page.criteria:
                self.note_exists(criterion)
            after = page.after

    @property
    def hedge(self) -> float:
        """Seconds to wait for the nearest node's answer before asking the others too:
        a quarter second while answers come quickly, longer when they come slowly."""
        return self._hedge.delay

    @property
    def lookups(self) -> int:
        """Network lookups made (misses of the cache the routing table could not answer)."""
        return self._lookups

    @property
    def claims_refuted(self) -> int:
        """Claimed addresses that did not answer as the node that claimed them."""
        return self._refuted

    @property
    def near_asks(self) -> int:
        """Misses of the cache answered by the nodes the routing table names (no lookup)."""
        return self._near_asks

    def cached(self, criterion: bytes) -> Route | None:
        """The best route known without asking anyone: this node's own view of the chain
        (it holds replication state) or the route it learned, whichever is newer (a
        broker that was moved out of a chain keeps an old view)."""
        local = self.local(criterion)
        found = self._routes.get(criterion)
        if found is not None:
            self._routes.move_to_end(criterion)
            if local is None or preference(found) < preference(local):
                return found
        return local

    def exists(self, criterion: bytes) -> bool:
        """Has this node seen the chain exist (a route, a copy, an answer)?"""
        return criterion in self._known or self.local(criterion) is not None

    def note_exists(self, criterion: bytes) -> None:
        if criterion not in self._known:
            self._known[criterion] = None
            self._known_dirty = True
            self.known_changed()
            while len(self._known) > _MAX_KNOWN:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(criterion)

    def known_bytes(self) -> bytes | None:
        """The known chains to store (``None``: nothing changed since the last time)."""
        if not self._known_dirty:
            return None
        self._known_dirty = False
        return b"".join(self._known)

    def load_known(self, data: bytes) -> None:
        for start in range(0, len(data) - len(data) % 32, 32):
            self._known[data[start:start + 32]] = None

    def learn(self, criterion: bytes, route: Route, *, fresh: bool = False) -> None:
        """Remember ``route`` unless a better one is known (see :func:`preference`);
        ``fresh``: the best the nodes near the key answered now, which replaces what was
        known (a configuration that was abandoned can look newer than the one in force)."""
        self.note_exists(criterion)
        known = self._routes.get(criterion)
        if not fresh and known is not None and preference(known) < preference(route):
            return
        self._routes[criterion] = route
        self._routes.move_to_end(criterion)
        while len(self._routes) > _MAX_ROUTES:
            self._routes.popitem(last=False)

    def forget(self, criterion: bytes) -> None:
        self._routes.pop(criterion, None)

    def answered(self, criterion: bytes, route: Route | None, epoch: int = 0) -> None:
        """A broker answered about ``criterion``, naming the ``route`` it knows (if
        any) or the ``epoch`` it is at (0: none). A route is learned; an epoch newer
        than the cached route's means the chain moved, and the route is forgotten
        (the next attempt asks the nodes near the key)."""
        if route is not None:
            self.learn(criterion, route)
        elif epoch:
            cached = self.cached(criterion)
            if cached is not None and cached.config.epoch < epoch:
                self.forget(criterion)

    def address(self, member: Member) -> str:
        """Where to reach ``member`` now: the overlay's latest address for its key."""
        find = getattr(self.overlay, "address_of", None)
        if find is not None:
            found = find(member.key)
            if found:
                return str(found)
        return member.address

    def distance(self, node_id: int, key: int) -> int:
        """How far a node is from a key by the overlay's metric: its optional
        ``distance(node id, key)`` (both 32 bytes), else XOR."""
        metric = getattr(self.overlay, "distance", None)
        if not callable(metric):
            return node_id ^ key
        return int(metric(node_id.to_bytes(32, "big"), key.to_bytes(32, "big")))

    def routing_version(self) -> int | None:
        """The overlay's routing-table version (``None``: it keeps none, so
        :meth:`desired` may change at any time)."""
        version = getattr(self.overlay, "version", None)
        return version if isinstance(version, int) else None

    def desired(self, criterion: bytes) -> list[Member]:
        """The ``r`` members the overlay's routing table names for ``criterion`` now.

        Remembered per chain while the overlay's ``version`` (if it has one) stays
        the same, so background rounds over many chains cost no table scans."""
        return list(self._desired_entry(criterion)[0])

    def nearest(self, criterion: bytes, count: int) -> list[Member]:
        """The ``count`` members the overlay's routing table names nearest to
        ``criterion`` (no lookup; this node among them if it is one)."""
        if self.overlay is None:
            return [self.own()]
        return [member_of(p) for p in self.overlay.nearest(criterion, count)]

    def desired_keys(self, criterion: bytes) -> frozenset[bytes]:
        """The keys of :meth:`desired`."""
        return self._desired_entry(criterion)[1]

    def _desired_entry(self, criterion: bytes) -> _Desired:
        if self.overlay is None:
            own = self.own()
            return (own,), frozenset((own.key,))
        version = getattr(self.overlay, "version", None)
        if version is not None:
            known = self._desired.get(criterion)
            if known is not None and known[0] == version:
                return known[1]
        members = tuple(self.nearest(criterion, self.replication))
        entry = members, frozenset(m.key for m in members)
        if version is not None:
            self._desired[criterion] = (version, entry)
            self._desired.move_to_end(criterion)
            while len(self._desired) > _MAX_ROUTES:
                self._desired.popitem(last=False)
        return entry

    async def candidates(self, criterion: bytes, count: int) -> list[Member]:
        """The ``count`` nodes closest to ``criterion`` (a network lookup if need be)."""
        if self.overlay is None:
            return [self.own()]
        return [member_of(p) for p in await self.overlay.closest(criterion, count)]

    async def route(self, criterion: bytes, *, refresh: bool = False) -> Route | Creation:
        """The chain's route, or whom to create it on.

        Raises :class:`~ketten.errors.QuorumUnavailable` when too few of the
        nodes near the key answered to tell whether the chain exists (the
        nodes the overlay names, and those this node heard from within the
        ``creation_memory`` window).
        """
        if not refresh:
            known = self.cached(criterion)
            if known is not None:
                return known
        else:
            local = self.local(criterion)
            if local is not None and local.leader == self.own().key:
                return local  # this node leads the chain: nobody knows better
        if not refresh:
            near = await self.ask_near(criterion)
            if near is not None:
                return near
        found = await self.survey(criterion)
        return conclude(criterion, found, known=self._routes.get(criterion),
                        exists=self.exists(criterion), replication=self.replication,
                        overlay=self.overlay is not None, memory=self.memory)

    def doubt(self, criterion: bytes, found: Survey) -> str | None:
        """Why ``found`` cannot tell that the chain does not exist (``None``: it can)."""
        return doubt(criterion, found, self.replication, self.memory)

    async def ask_near(self, criterion: bytes) -> Route | None:
        """The best route the ``r`` nodes the routing table names nearest to
        ``criterion`` know (``None``: none of them knows one, or answered).

        No lookup: the routing table answers for a key in all but the first
        moments of a node's life. A route is only a hint (every broker checks
        offers against its own configuration), so one node that knows the
        chain is enough; a new chain is never started on this answer alone.
        The nearest is asked first; the others only if it knows nothing, or
        has not answered within :meth:`hedge` seconds (a hedged request).
        """
        own = self.own().key
        near = [m for m in self.desired(criterion) if m.key != own]
        if not near:
            return None
        found: list[Route] = []
        first_done = trio.Event()

        async def ask(member: Member, done: trio.Event | None = None) -> None:
            answer = await self.locate(member, criterion)
            if answer is not None and answer.route is not None:
                found.append(answer.route)
            if done is not None:
                done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, near[0], first_done)
            with trio.move_on_after(self.hedge):
                await first_done.wait()
            if found:
                nursery.cancel_scope.cancel()
            else:
                for member in near[1:]:
                    nursery.start_soon(ask, member)
        if not found:
            return None
        self._near_asks += 1
        best = min(found, key=preference)
        local = self.local(criterion)
        if local is not None and preference(local) < preference(best):
            return local
        self.learn(criterion, best)
        return best

    async def survey(self, criterion: bytes) -> Survey:
        """Ask the nodes nearest to ``criterion`` what they know: twice ``r`` of them
        named by the overlay, and the ``r`` nearest of those this node heard from
        within the memory window (the overlay may have dropped them).

        The answer holds the best route any of them knows, whether any holds
        a copy, and how many answered (this node counts as one that answered).
        """
        self._lookups += 1
        nearby = await self.candidates(criterion, 2 * self.replication)
        own = self.own().key
        asked = {m.key: m for m in nearby}
        now = self.now()
        remembered = self.acquaintances.nearest(criterion, self.replication,
                                                since=now - self.memory, now=now,
                                                distance=self.distance)
        for member in remembered:
            asked.setdefault(member.key, member)
        best = self.local(criterion)
        if best is None and self.load is not None:
            best = await self.load(criterion)
        others = [m for m in asked.values() if m.key != own]
        results: list[Located | None] = [None] * len(others)

        async def ask(index: int, member: Member) -> None:
            results[index] = await self.locate(member, criterion)

        async with trio.open_nursery() as nursery:
            for index, member in enumerate(others):
                nursery.start_soon(ask, index, member)
        counted = tally(goal=int.from_bytes(criterion, "big"), own=own,
                        own_settled=own in asked and self.settled_for(criterion), local=best,
                        nearby=nearby, asked=list(asked.values()),
                        answers=list(zip(others, results, strict=True)),
                        replication=self.replication, distance=self.distance)
        for member, found in counted.rivals:
            assert found.genesis is not None
            self.rival(criterion, found.genesis, self.address(member), (found.config,))
        survey = counted.survey
        if survey.route is not None:
            self.learn(criterion, survey.route, fresh=True)
        elif survey.held:
            self.note_exists(criterion)
        return survey

    def members_of(self, route: Route) -> Sequence[Member]:
        return route.config.members()
