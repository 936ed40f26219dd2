"""``Publisher``: the trio driver of :class:`~ketten._core.publish.PublishAttempt`.

It finds routes through :class:`ReplicaSets`, signs the events the attempt
asks for, carries offers to brokers (offers to one broker made in the same
scheduler pass travel in one request; an offer to this node itself is
answered in-process), calls the application's conflict handler, and turns
the attempt's outcome into the event or a typed error.
"""

from __future__ import annotations

import inspect
import logging
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from .._core.event import DEFAULT_MAX_EVENT_SIZE, Event
from .._core.identity import Identity
from .._core.membership import Member, Pos
from .._core.messages import MAX_BATCH, Answer, Offer, OfferAnswer, OfferItem, Route
from .._core.publish import Action, PublishAttempt, Step, answered_event
from ..errors import (
    BrokenLink,
    CommandIdReused,
    DecodeError,
    InvalidEvent,
    InvalidSignature,
    KettenError,
    PublishOutcomeUnknown,
    QuorumUnavailable,
    QuotaExceeded,
    UsageError,
    WriterNotAllowed,
)
from ..logs import RateLimitedLog
from .broker import Broker
from .coalesce import Coalescer
from .replica_sets import Creation, ReplicaSets
from .rpc import Rpc

__all__ = ["PUBLISH_DEADLINE", "ConflictHandler", "Publisher"]

ConflictHandler = Callable[[Event | None], "bytes | Awaitable[bytes | None] | None"]
"""Called with the new head after the chain moved on; returns the payload to retry
with (``None``: the same payload). Raise to give up."""

_INVALID: dict[str, type[InvalidEvent]] = {
    BrokenLink.reason: BrokenLink,
    InvalidSignature.reason: InvalidSignature,
    WriterNotAllowed.reason: WriterNotAllowed,
}
PUBLISH_DEADLINE = 30.0
"""Seconds a publish call retries by default once its turn came. Under overload
an attempt waits on busy brokers, and contenders for one chain take turns (one
append per round trip): a short default turned overload into failures (50 nodes
in one process, 1,000 publishes in flight: 1-4 failed within 10 s, none within
30 s). Pulsar's producers wait 30 s by default, Kafka's 120 s."""

_MAX_KNOWN = 1 << 16
_MAX_BUILT = 4096
_BATCH_BYTES = 1 << 20


_log = logging.getLogger("ketten.publish")


@attrs.define(eq=False)
class _Call:
    """One ``publish()`` call: what the caller asked for, and what its attempt learned."""

    number: int
    criterion: bytes
    payload: bytes
    identity: Identity
    command: int | None
    on_conflict: ConflictHandler | None
    writers: Sequence[bytes] | None
    deadline: float
    conflict_head: Event | None = None
    """The head a broker answered with when it refused the offer as stale."""

    def retry_with(self, answer: object) -> None:
        """Take the conflict handler's ``answer``: a new payload, or ``None`` for the same."""
        if answer is None:
            return
        if not isinstance(answer, bytes):
            raise UsageError("on_conflict must return bytes or None")
        self.payload = answer


_StepDriver = Callable[[_Call, PublishAttempt, Action], Awaitable[None]]


def _take_route(attempt: PublishAttempt, found: Route | Creation | None, now: float,
                error: str) -> None:
    """Tell ``attempt`` what the route lookup found: a route, whom to create the chain
    on, or nothing (``error`` says why)."""
    if isinstance(found, Creation):
        attempt.routed(None, now, create=found.members)
    elif found is None:
        attempt.routed(None, now, error=error)
    else:
        attempt.routed(found, now)


@attrs.define(eq=False)
class _InTurn:
    """Calls on one criterion, one at a time in call order: a node's own publishes to
    a chain would only conflict with each other (and back off) if sent side by side."""

    _locks: dict[bytes, tuple[trio.Lock, int]] = attrs.field(factory=dict)

    async def acquire(self, criterion: bytes) -> trio.Lock:
        lock, users = self._locks.get(criterion) or (trio.Lock(), 0)
        self._locks[criterion] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._leave(criterion)
            raise
        return lock

    def release(self, criterion: bytes, lock: trio.Lock) -> None:
        lock.release()
        self._leave(criterion)

    def _leave(self, criterion: bytes) -> None:
        lock, users = self._locks[criterion]
        if users == 1:
            del self._locks[criterion]  # only criteria with calls keep an entry
        else:
            self._locks[criterion] = (lock, users - 1)


@attrs.define(eq=False, repr=False)
class Publisher:
    """Publishes events through the leaders of their chains."""

    rpc: Rpc
    sets: ReplicaSets
    broker: Broker
    own: Callable[[], Member]
    clock: Callable[[], bytes]
    observe: Callable[[Event], None]
    has_clock: bool
    now_ms: Callable[[], int]
    request_timeout: float
    rng: random.Random
    nursery: Callable[[], trio.Nursery]
    max_publishing: int = 16
    """Calls worked on at once; later ones wait their turn before their deadline starts."""
    max_event_size: int = DEFAULT_MAX_EVENT_SIZE
    """The node's ``max_event_size``: a bigger event is refused before it is sent."""
    _turns: trio.Semaphore = attrs.field(init=False)
    _in_turn: _InTurn = attrs.field(factory=_InTurn, init=False)
    _heads: OrderedDict[bytes, Pos] = attrs.field(factory=OrderedDict, init=False)
    _built: OrderedDict[bytes, int] = attrs.field(factory=OrderedDict, init=False)
    """Events built lately, by the number of the call that built them."""
    _calls: int = attrs.field(default=0, init=False)
    _events: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(_log), init=False)
    _offers: Coalescer[Member, OfferItem, OfferAnswer] = attrs.field(init=False)
    _steps: dict[Step, _StepDriver] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._turns = trio.Semaphore(self.max_publishing)
        self._steps = {Step.ROUTE: self._route, Step.BUILD: self._build_step,
                       Step.CONFLICT: self._conflict, Step.SEND: self._send,
                       Step.WAIT: self._wait, Step.FAIL: self._fail}
        self._offers = Coalescer(self._send_offers, self.nursery, MAX_BATCH,
                                 size=lambda item: len(item.event), max_bytes=_BATCH_BYTES)

    @property
    def waiting(self) -> int:
        """Publish calls waiting for their turn."""
        return self._turns.statistics().tasks_waiting

    def note_head(self, criterion: bytes, pos: Pos) -> None:
        known = self._heads.get(criterion)
        if known is None or known[0] < pos[0]:
            self._heads[criterion] = pos
            self._heads.move_to_end(criterion)
            while len(self._heads) > _MAX_KNOWN:
                self._heads.popitem(last=False)

    async def publish(
        self,
        criterion: bytes,
        payload: bytes,
        *,
        identity: Identity,
        command: int | None,
        on_conflict: ConflictHandler | None,
        deadline: float,
        writers: Sequence[bytes] | None,
        base: Pos | None,
    ) -> Event:
        """Publish once this call's turn came: after the node's earlier calls on the same
        criterion, and within :attr:`max_publishing`."""
        lock = await self._in_turn.acquire(criterion)
        try:
            async with self._turns:
                return await self._publish(criterion, payload, identity=identity,
                                           command=command, on_conflict=on_conflict,
                                           deadline=deadline, writers=writers, base=base)
        finally:
            self._in_turn.release(criterion, lock)

    async def _publish(self, criterion: bytes, payload: bytes, *, identity: Identity,
                       command: int | None, on_conflict: ConflictHandler | None,
                       deadline: float, writers: Sequence[bytes] | None,
                       base: Pos | None) -> Event:
        self._calls += 1
        call = _Call(self._calls, criterion, payload, identity, command, on_conflict,
                     writers, deadline)
        attempt = PublishAttempt(criterion, trio.current_time() + deadline, self.rng,
                                 base=self._base(criterion, base),
                                 has_conflict_handler=on_conflict is not None,
                                 route_base=not self.has_clock)
        attempt.known_route(self.sets.cached(criterion), trio.current_time())
        while (action := attempt.next(trio.current_time())).step is not Step.DONE:
            await self._steps[action.step](call, attempt, action)
        return self._done(criterion, action)

    # -- the steps of an attempt, each carried out for PublishAttempt ----------------

    def _base(self, criterion: bytes, base: Pos | None) -> Pos | None:
        """Where to start: the caller's ``base`` or the newest head seen, if later."""
        known = self._heads.get(criterion)
        return known if known is not None and (base is None or known[0] > base[0]) else base

    def _done(self, criterion: bytes, action: Action) -> Event:
        assert action.event is not None
        self.note_head(criterion, (action.event.seq, action.event.hash))
        self.sets.note_exists(criterion)
        return action.event

    async def _fail(self, call: _Call, attempt: PublishAttempt, action: Action) -> None:
        raise self._error(attempt, action.error, action.message, action.answer,
                          call.criterion, call.command, call.identity, call.deadline)

    async def _wait(self, call: _Call, attempt: PublishAttempt, action: Action) -> None:
        await trio.sleep_until(action.until)

    async def _route(self, call: _Call, attempt: PublishAttempt, action: Action) -> None:
        found: Route | Creation | None = None
        error = "the chain's brokers could not be found in time"
        with trio.move_on_at(attempt.deadline):
            try:
                found = await self.sets.route(call.criterion, refresh=action.refresh)
            except KettenError as exc:
                error = str(exc)
        _take_route(attempt, found, trio.current_time(), error)

    async def _build_step(self, call: _Call, attempt: PublishAttempt, action: Action) -> None:
        attempt.built(self._build_checked(call, action))

    async def _conflict(self, call: _Call, attempt: PublishAttempt, action: Action) -> None:
        assert call.on_conflict is not None
        answer = call.on_conflict(call.conflict_head)
        if inspect.isawaitable(answer):
            answer = await answer
        call.retry_with(answer)
        attempt.resolved()

    async def _send(self, call: _Call, attempt: PublishAttempt, action: Action) -> None:
        assert action.target is not None and action.item is not None
        reply: OfferAnswer | None = None
        event: Event | None = None
        with trio.move_on_at(attempt.deadline):
            reply, event = await self._offer(action.target, action.item, attempt.event)
        self._take_answer(call, reply, event)
        attempt.answered(action.target, reply, event, trio.current_time())

    def _take_answer(self, call: _Call, reply: OfferAnswer | None, event: Event | None) -> None:
        """Learn from a broker's answer: a newer head, a newer route or epoch."""
        if reply is None:
            return
        if reply.kind is Answer.STALE:
            call.conflict_head = event
            if event is not None:
                self.note_head(call.criterion, (event.seq, event.hash))
        self.sets.answered(call.criterion, reply.route, reply.epoch)

    def _build_checked(self, call: _Call, action: Action) -> Event:
        """The event the attempt asked for; :class:`UsageError` if the caller's input
        cannot make one."""
        if call.writers is not None and action.seq != 0:
            raise UsageError(
                f"criterion {call.criterion.hex()[:16]} already has a genesis; writers can "
                "only be declared by the first event of a chain")
        built = self._build(call.number, call.identity, call.criterion, action.seq,
                            action.prev, call.payload, call.command, call.writers)
        size = len(built.to_bytes())
        if size > self.max_event_size:
            raise UsageError(
                f"the event would take {size} bytes ({len(call.payload)} of payload), "
                f"more than max_event_size ({self.max_event_size} bytes): split "
                "the payload, or raise max_event_size in every node's NodeConfig")
        return built

    def _build(self, call: int, identity: Identity, criterion: bytes, seq: int,
               prev: bytes | None, payload: bytes, command: int | None,
               writers: Sequence[bytes] | None) -> Event:
        """A new event for publish call number ``call``, never the very event another
        call built: two calls with the same content in the same millisecond would
        otherwise be one event, acknowledged to both (a later millisecond tells them
        apart)."""
        time = self.now_ms()
        clock = self.clock()
        while True:
            event = Event.create(identity, criterion=criterion, seq=seq, prev=prev,
                                 payload=payload, time=time, command=command, clock=clock,
                                 writers=writers if seq == 0 else None)
            owner = self._built.get(event.hash)
            if owner is None or owner == call or command is not None:
                break
            time += 1
        self._built[event.hash] = call
        while len(self._built) > _MAX_BUILT:
            self._built.popitem(last=False)
        return event

    def _error(self, attempt: PublishAttempt, kind: str, message: str,
               answer: OfferAnswer | None, criterion: bytes, command: int | None,
               identity: Identity, deadline: float) -> KettenError:
        short = criterion.hex()[:16]
        if kind == "invalid":
            reason = answer.reason if answer is not None else "invalid"
            return _INVALID.get(reason, InvalidEvent)(f"the brokers refused the event: {message}",
                                                      reason=reason)
        if kind == "limited":
            return QuotaExceeded(f"publish to criterion {short}: {message}; nothing was stored")
        if kind == "reused":
            return CommandIdReused(message or (
                f"command {command} of author {identity.public_key.hex()[:16]} is already "
                f"applied with other content in criterion {short}"))
        if kind in ("unknown", "quorum"):
            self._events.warning("publish_failed", "publish to criterion %s failed (%s): %s",
                                 short, "outcome unknown" if kind == "unknown" else "no quorum",
                                 message or "no leader", key=f"publish:{criterion.hex()}",
                                 criterion=criterion.hex(), outcome=kind,
                                 brokers_answered=attempt.reached, deadline=deadline)
        if kind == "unknown":
            return PublishOutcomeUnknown(
                f"publish to criterion {short} did not complete within {deadline} s ({message}); "
                "a broker may hold the event and it may still be committed: publish again with "
                "the same command id, or wait for one of the event hashes to appear",
                event_hashes=tuple(attempt.maybe_stored))
        return QuorumUnavailable(
            f"publish to criterion {short} failed within {deadline} s: {message or 'no leader'}"
            f" ({attempt.reached} broker(s) answered); nothing was stored")

    # -- carrying offers -----------------------------------------------------------

    async def _offer(self, target: Member, item: OfferItem,
                     offered: Event | None) -> tuple[OfferAnswer | None, Event | None]:
        """Offer ``item`` to ``target``; the answer (``None``: none came) and the event it
        carries, decoded and checked against ``offered``."""
        if target.key == self.own().key:
            answer: OfferAnswer | None = None
            with trio.move_on_after(self.request_timeout):
                try:
                    answer = await self.broker.offer(item, signed_here=True, event=offered)
                except KettenError:
                    answer = None
        else:
            answer = await self._offers.call(target, item)
        if answer is None or answer.event is None or offered is None:
            return answer, None
        try:
            event = answered_event(answer, item, offered)
        except (DecodeError, InvalidEvent):
            return None, None
        self.observe(event)
        return answer, event

    async def _send_offers(self, target: Member,
                           items: list[OfferItem]) -> Sequence[OfferAnswer | None]:
        # Offers to one broker made in the same scheduler pass travel in one request.
        try:
            _, reply = await self.rpc.call(self.sets.address(target), Offer(tuple(items)),
                                           timeout=self.request_timeout + 0.5, retransmit=True,
                                           expect=target.key)
        except KettenError:
            return ()
        return reply.answers if len(reply.answers) == len(items) else ()
