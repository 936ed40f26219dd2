"""``Broker``: what this node answers to publishers and readers.

* ``offer``: the leader of a chain judges each offered event
  (:func:`~ketten._core.publish.judge_offer`), appends it, replicates it and
  acknowledges it once committed; a member that does not lead redirects to
  the leader, or stands for leader when urged and no leader is active; a
  node asked to create a chain checks with the nodes nearest to the key that
  it does not exist yet.
* ``commit``: the leader's commit position, after a quorum confirmed it
  still leads (reads start from it).
* ``fetch``: events of a chain after a position, committed only unless asked
  otherwise, in byte-bounded batches.
* ``locate``: what this node knows of chains (configuration, term, leader, commit).
"""

from __future__ import annotations

import attrs
import trio

from .._core.chain import WriterPolicy
from .._core.event import Event
from .._core.membership import Member
from .._core.messages import (
    MAX_HANDOVER,
    Answer,
    CommitQuery,
    CommitReply,
    Fetch,
    FetchReply,
    Handover,
    HandoverReply,
    Locate,
    LocateReply,
    Offer,
    OfferAnswer,
    OfferItem,
    OfferReply,
    Route,
)
from .._core.publish import Verdict, judge_offer, settled_answer
from .._core.quota import RateLimit
from .._core.replica import Replica
from ..errors import (
    DecodeError,
    InvalidEvent,
    KettenError,
    QuotaExceeded,
    StoreConflict,
    StoreError,
)
from ..interfaces import Peer
from .local_chains import LocalChains
from .replica_sets import ReplicaSets
from .replicator import Replicator
from .rpc import Rpc

__all__ = ["Broker"]


def _over_quota(limit: RateLimit, author: bytes, cost: float, what: str) -> OfferAnswer | None:
    """Take ``cost`` of ``author``'s quota, or the refusal naming it (``what`` has
    ``{burst}`` and ``{rate}`` in it)."""
    now = trio.current_time()
    if limit.allow(author, now, cost):
        return None
    said = what.format(burst=f"{limit.burst:.0f}", rate=f"{limit.rate:g}")
    return OfferAnswer(Answer.LIMITED, message=(
        f"author {author.hex()[:16]} {said}; wait {limit.wait(author, now, cost):.1f} s"))


@attrs.define(eq=False, repr=False)
class Broker:
    """The broker side of publish and read."""

    rpc: Rpc
    chains: LocalChains
    replicator: Replicator
    sets: ReplicaSets
    own: Member | None
    request_timeout: float
    batch_bytes: int
    creations: RateLimit
    """Chains one author may start (per author key)."""
    author_bytes: RateLimit
    """Bytes of events this node accepts from one author as leader (per author key)."""
    handovers: RateLimit = attrs.field(factory=lambda: RateLimit(8.0, 128.0))
    """Hand-over pages one peer may ask for (each scans the chains held here)."""
    _received: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        self.rpc.serve(Offer, self._serve_offer)
        self.rpc.serve(CommitQuery, self._serve_commit)
        self.rpc.serve(Fetch, self._serve_fetch)
        self.rpc.serve(Locate, self._serve_locate)
        self.rpc.serve(Handover, self._serve_handover)

    @property
    def events_received(self) -> int:
        return self._received

    # -- offers ------------------------------------------------------------------

    async def _serve_offer(self, peer: Peer, request: Offer) -> OfferReply:
        answers: list[OfferAnswer] = [OfferAnswer(Answer.BUSY)] * len(request.items)

        async def one(index: int, item: OfferItem) -> None:
            answers[index] = await self.offer(item, signed_here=False, peer=peer)

        # One deadline for the whole request: what is not decided by then is busy.
        with trio.move_on_after(self.request_timeout):
            if len(request.items) == 1:
                await one(0, request.items[0])
            else:
                async with trio.open_nursery() as nursery:
                    for index, item in enumerate(request.items):
                        nursery.start_soon(one, index, item)
        return OfferReply(tuple(answers))

    async def offer(self, item: OfferItem, *, signed_here: bool,
                    event: Event | None = None, peer: Peer | None = None) -> OfferAnswer:
        """Answer one offered event (``signed_here``: made by this process, so its
        signature is not checked again; ``peer``: who sent it, ``None`` for this node).

        A chain is created on the nodes this node's routing table names nearest to
        the key, never on members the offer names: whoever offers the first event
        of a criterion must not pick its brokers."""
        self._received += 1
        try:
            if event is None:
                event = Event.from_bytes(item.event, max_size=self.chains.max_event_size)
        except DecodeError as exc:
            self.chains.count_invalid()
            return OfferAnswer(Answer.INVALID, reason="malformed", message=str(exc))
        criterion = event.criterion
        until = trio.current_time() + self.request_timeout
        replica = await self.replicator.replica(criterion)
        if replica is None or replica.config is None:
            if item.create is None:
                return OfferAnswer(Answer.ABSENT, message="this node holds no such chain")
            if event.seq == 0:
                # Only a signed event may charge its author's quota: a forged one
                # would let anyone use up an honest author's chains.
                if not signed_here:
                    try:
                        event.verify()
                    except InvalidEvent as exc:
                        self.chains.count_invalid()
                        return OfferAnswer(Answer.INVALID, reason=exc.reason, message=str(exc))
                    signed_here = True  # checked: _decide need not check it again
                refused = _over_quota(self.creations, event.author, 1,
                                      "started more than {burst} chains at this broker, "
                                      "then more than {rate} per second")
                if refused is not None:
                    return refused
            if peer is not None and not await self.replicator.may_take_on(criterion, peer):
                return OfferAnswer(Answer.LIMITED, message=(
                    "this peer made this node a broker of too many chains lately"))
            made = await self.replicator.create(criterion, tuple(self.sets.desired(criterion)))
            if isinstance(made, Route):
                self.sets.learn(criterion, made)
                return OfferAnswer(Answer.REDIRECT, route=made)
            if made is None:
                return OfferAnswer(Answer.BUSY, message="the chain could not be created now "
                                   "(no quorum of its first brokers)")
            replica = made
        if not replica.is_leader:
            led = await self.replicator.lead(criterion, urge=item.urge)
            if isinstance(led, Route) or led is None:
                route = led if isinstance(led, Route) else await self.replicator.route(criterion)
                if route is None:
                    return OfferAnswer(Answer.ABSENT, message="this node holds no such chain")
                return OfferAnswer(Answer.REDIRECT, route=route)
            replica = led
        answer = await self._decide(replica, event, item.attempts, signed_here, until)
        return attrs.evolve(answer, epoch=replica.state.epoch)

    async def _decide(self, replica: Replica, event: Event, attempts: tuple[bytes, ...],
                      signed_here: bool, until: float) -> OfferAnswer:
        criterion = replica.criterion
        chains = self.chains
        async with chains.lock(criterion):
            if not replica.is_leader:
                route = await self.replicator.route(criterion)
                if route is None:
                    return OfferAnswer(Answer.ABSENT)
                return OfferAnswer(Answer.REDIRECT, route=route)
            head = await chains.head(criterion)
            earlier = None
            for digest in attempts:
                found = await chains.store.get(digest)
                if (found is not None and found.criterion == criterion
                        and await chains.hash_at(criterion, found.seq) == digest):
                    earlier = found  # on the main chain, not an orphan
                    break
            by_command = None
            if event.command is not None:
                by_command = await chains.store.by_command(criterion, event.author,
                                                           event.command)
            at_seq = None
            if head is not None and event.seq <= head.seq:
                at_seq = await chains.event_at(criterion, event.seq)
            verdict, ref = judge_offer(event, head=head, earlier=earlier,
                                       by_command=by_command, at_seq=at_seq)
            if verdict is Verdict.STALE:
                return OfferAnswer(Answer.STALE, event=None if ref is None else ref.to_bytes())
            if verdict is Verdict.APPEND:
                try:
                    if signed_here:
                        await self._check_writer(criterion, event)
                        await chains.verify_run(criterion, head, [event], signatures=False)
                    else:
                        await chains.verify_run(criterion, head, [event])
                except InvalidEvent as exc:
                    return OfferAnswer(Answer.INVALID, reason=exc.reason, message=str(exc))
                # Charged once the signature checked out, as for creations.
                refused = _over_quota(self.author_bytes, event.author, len(event.to_bytes()),
                                      "sent this leader more than {burst} bytes of events, "
                                      "then more than {rate} bytes per second")
                if refused is not None:
                    return refused
                try:
                    await chains.append([event])
                except StoreConflict:
                    head = await chains.head(criterion)
                    return OfferAnswer(Answer.STALE,
                                       event=None if head is None else head.to_bytes())
                except StoreError as exc:
                    return OfferAnswer(Answer.BUSY, message=f"store: {exc}")
                await self.replicator.leader_appended(replica, (event.seq, event.hash))
                target = event
            else:
                assert ref is not None
                target = ref
        settled = await self.replicator.wait_commit(criterion, target.seq, target.hash, until)
        return settled_answer(verdict, event, target, settled)

    async def _check_writer(self, criterion: bytes, event: Event) -> None:
        if event.seq == 0:
            return
        policy: WriterPolicy | None = await self.chains.policy(criterion)
        if policy is not None and not policy.allows(event.author):
            from ..errors import WriterNotAllowed

            raise WriterNotAllowed(f"seq {event.seq}: author {event.author.hex()[:16]} may not "
                                   "write to this chain")

    # -- reads ---------------------------------------------------------------------

    async def _serve_commit(self, peer: Peer, request: CommitQuery) -> CommitReply:
        return await self.commit(request.criterion, urge=request.urge)

    async def commit(self, criterion: bytes, *, urge: bool) -> CommitReply:
        """The leader's confirmed commit position (or where to ask instead)."""
        replica = await self.replicator.replica(criterion)
        if replica is None or replica.config is None:
            return CommitReply("absent", message="this node holds no such chain")
        if not replica.is_leader:
            led = await self.replicator.lead(criterion, urge=urge)
            if not isinstance(led, Replica):
                route = led if isinstance(led, Route) else await self.replicator.route(criterion)
                if route is None:
                    return CommitReply("absent")
                return CommitReply("redirect", route=route)
        until = trio.current_time() + self.request_timeout
        confirmed, commit = await self.replicator.barrier(criterion, until)
        if not confirmed:
            return CommitReply("busy", message="no quorum confirmed the leader in time")
        return CommitReply("commit", commit=commit)

    async def _serve_fetch(self, peer: Peer, request: Fetch) -> FetchReply:
        criterion = request.criterion
        budget = min(request.max_bytes, self.batch_bytes)
        replica = self.replicator.loaded(criterion) or await self.replicator.replica(criterion)
        commit = None if replica is None else replica.commit
        start = 0
        if request.after is not None:
            if await self.chains.hash_at(criterion, request.after[0]) != request.after[1]:
                return FetchReply(False, (), False, commit)
            start = request.after[0] + 1
        # A copy without replication state (a reader's) holds committed events only.
        stop = None
        if request.committed and replica is not None:
            stop = -1 if commit is None else commit[0] + 1
        if stop is not None and start >= stop:
            return FetchReply(True, (), False, commit)
        raws, more = await self.chains.read_batch(criterion, start, budget, stop=stop)
        return FetchReply(True, tuple(raws), more, commit)

    async def _serve_locate(self, peer: Peer, request: Locate) -> LocateReply:
        routes: list[Route | None] = []
        held: list[bool] = []
        for criterion in request.criteria:
            try:
                route = await self.replicator.route(criterion)
            except KettenError:
                route = None
            routes.append(route or self.sets.cached(criterion))
            held.append(route is not None or self.sets.exists(criterion)
                        or await self.chains.head(criterion) is not None)
        return LocateReply(tuple(routes), tuple(held),
                           tuple(self.sets.settled_for(c) for c in request.criteria))

    async def _serve_handover(self, peer: Peer, request: Handover) -> HandoverReply:
        if not self.handovers.allow(peer.public_key, trio.current_time()):
            raise QuotaExceeded("too many hand-over requests from this peer; ask again later")
        criteria, more = self.replicator.handover_for(Member(peer.public_key, peer.address),
                                                      request.after, MAX_HANDOVER)
        return HandoverReply(tuple(criteria), more)
