"""The publisher side of publish: build, offer to the brokers, count, retry.

A thin trio driver around :class:`~ketten._replication.PublishTally`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._core.event import Event
from ._core.identity import Identity
from ._offers import OfferBatcher
from ._replication import Outcome, PublishTally, backoff_delay, majority, pick_base
from ._sync import Replicator, encode_pair
from ._wire import field
from .errors import (
    BrokenLink,
    CommandIdReused,
    DecodeError,
    InvalidEvent,
    InvalidSignature,
    KettenError,
    QuorumUnavailable,
    Unavailable,
    UsageError,
    WriterNotAllowed,
)
from .interfaces import Peer

if TYPE_CHECKING:
    from ._broker import Broker
    from ._node import Node

__all__ = ["ConflictHandler", "Publisher"]

ConflictHandler = Callable[[Event | None], "bytes | Awaitable[bytes | None] | None"]
"""Called with the new head after a stale round; returns the payload to retry
with (``None``: the same payload). Raise to give up."""

_INVALID: dict[str, type[InvalidEvent]] = {
    BrokenLink.reason: BrokenLink,
    InvalidSignature.reason: InvalidSignature,
    WriterNotAllowed.reason: WriterNotAllowed,
}


@attrs.define(eq=False)
class Publisher:
    """Publishes events of this node (or of an agent identity) to their brokers."""

    node: Node
    replicator: Replicator
    broker: Broker
    _known: dict[bytes, Event] = attrs.field(factory=dict, init=False)
    _acked: dict[bytes, tuple[int, bytes]] = attrs.field(factory=dict, init=False)
    _offers: OfferBatcher = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._offers = OfferBatcher(self.node)

    def note_head(self, event: Event) -> None:
        known = self._known.get(event.criterion)
        if known is None or known.seq < event.seq:
            self._known[event.criterion] = event

    async def _base(self, criterion: bytes, replicas: list[Peer]) -> Event | None:
        """The latest head this node knows: its own copy if it is a broker, else what it
        last published or was told."""
        known = self._known.get(criterion)
        if known is not None and not any(self.replicator.is_self(p) for p in replicas):
            return known
        local = await self.node.head(criterion)
        if local is None or (known is not None and known.seq > local.seq):
            return known
        return local

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
    ) -> Event:
        node = self.node
        replication = node.config.replication
        end = trio.current_time() + deadline
        replicas = await self.replicator.replicas(criterion)
        base = await self._base(criterion, replicas)
        attempt = 0
        reached = 0
        while True:
            if writers is not None and base is not None:
                raise UsageError(
                    f"criterion {criterion.hex()[:16]} already has a genesis; writers can only "
                    "be declared by the first event of a chain"
                )
            event = Event.create(
                identity,
                criterion=criterion,
                seq=0 if base is None else base.seq + 1,
                prev=None if base is None else base.hash,
                payload=payload,
                time=node.now_ms(),
                command=command,
                clock=node.clock.stamp() if node.clock is not None else b"",
                writers=writers,
            )
            tally = PublishTally(tuple(p.node_id for p in replicas), replication)
            by_id = {p.node_id: p for p in replicas}
            while True:
                remaining = end - trio.current_time()
                if remaining <= 0:
                    raise self._gave_up(criterion, reached, deadline)
                targets = [by_id[b] for b in tally.start_round()]
                await self._round(event, targets, tally,
                                  min(node.config.request_timeout, remaining))
                reached = tally.answered_this_round
                outcome = tally.outcome()
                if outcome is Outcome.DONE:
                    return self._done(event, tally)
                if outcome is Outcome.REUSED:
                    existing = tally.reused_event
                    assert existing is not None
                    raise CommandIdReused(
                        f"command {command} of author {identity.public_key.hex()[:16]} is "
                        f"already applied with other content as seq {existing.seq} of "
                        f"criterion {criterion.hex()[:16]}"
                    )
                if outcome is Outcome.INVALID:
                    reason, message = tally.invalid_reason or ("invalid", "")
                    raise _INVALID.get(reason, InvalidEvent)(
                        f"the brokers refused the event: {message}", reason=reason)
                if outcome is Outcome.STALE:
                    break
                attempt += 1
                await self._pause(attempt, end)
                fresh = await self.replicator.replicas(criterion)
                if [p.node_id for p in fresh] != [p.node_id for p in replicas]:
                    replicas = fresh
                    tally = PublishTally(tuple(p.node_id for p in replicas), replication)
                    by_id = {p.node_id: p for p in replicas}
            # Stale: learn the new head (and, for an application that wants to
            # re-check its intent, the events before it), then rebuild.
            heads = tally.stale_heads
            for head in heads:
                if head is not None:
                    self.note_head(head)
            base = pick_base(heads) or await self._base(criterion, replicas)
            if on_conflict is not None:
                try:
                    synced = await self.replicator.sync(criterion, quorum=False)
                except KettenError:
                    synced = None
                if synced is not None and (base is None or synced.seq >= base.seq):
                    base = synced
                answer = on_conflict(base)
                if inspect.isawaitable(answer):
                    answer = await answer
                if answer is not None:
                    if not isinstance(answer, bytes):
                        raise UsageError("on_conflict must return bytes or None")
                    payload = answer
            attempt += 1
            await self._pause(attempt, end)
            replicas = await self.replicator.replicas(criterion)

    async def _pause(self, attempt: int, end: float) -> None:
        delay = backoff_delay(attempt, self.replicator.rng.random())
        await trio.sleep(max(0.0, min(delay, end - trio.current_time())))

    def _gave_up(self, criterion: bytes, reached: int, deadline: float) -> Unavailable:
        replication = self.node.config.replication
        need = majority(replication)
        if reached < need:
            return QuorumUnavailable(
                f"only {reached} of the {replication} brokers of criterion "
                f"{criterion.hex()[:16]} answered within {deadline} s (a majority of {need} is "
                "needed); nothing was acknowledged"
            )
        return Unavailable(
            f"no event of criterion {criterion.hex()[:16]} gathered a majority within "
            f"{deadline} s (the chain kept moving); nothing was acknowledged"
        )

    def _done(self, event: Event, tally: PublishTally) -> Event:
        winner = tally.winner()
        assert winner is not None
        held, other = winner
        result = event if held == event.hash else other
        assert result is not None
        criterion = result.criterion
        self.note_head(result)
        # The commit mark travels with this node's next publish of the criterion.
        mark = (result.seq, result.hash)
        known = self._acked.get(criterion)
        if known is None or known[0] < mark[0]:
            self._acked[criterion] = mark
        self.replicator.claim_commit(criterion, mark)
        return result

    async def _round(self, event: Event, targets: list[Peer], tally: PublishTally,
                     timeout: float) -> None:
        """Offer ``event`` to ``targets``; return once the tally is decided, every target
        answered, or ``timeout`` passed. Offers go on in the node's nursery after the
        round is decided: the remaining brokers still get the event."""
        mark = self._acked.get(event.criterion)
        waiting = len(targets)
        finished = trio.Event()
        is_open = True

        def answered(peer: Peer, reply: Any) -> None:
            nonlocal waiting
            if not is_open:
                return  # a late answer of an earlier round
            waiting -= 1
            if reply is not None:
                try:
                    self._count(peer, event, reply, tally)
                except (DecodeError, InvalidEvent):
                    pass
            if waiting == 0 or tally.decided():
                finished.set()

        body: dict[str, Any] | None = None
        try:
            with trio.move_on_after(timeout):
                for peer in targets:
                    if self.replicator.is_self(peer):
                        self.node.nursery.start_soon(
                            self._offer_locally, event, mark, timeout,
                            functools.partial(answered, peer))
                        continue
                    if body is None:
                        raw = event.to_bytes()
                        body = {"e": raw, "r": self.node.config.replication,
                                "k": encode_pair(mark)}
                    self._offers.submit(peer.address, body, size=len(raw), timeout=timeout,
                                        answered=functools.partial(answered, peer))
                await finished.wait()
        finally:
            is_open = False

    async def _offer_locally(self, event: Event, mark: tuple[int, bytes] | None,
                             timeout: float, answered: Callable[[Any], None]) -> None:
        reply: Any = None
        try:
            with trio.move_on_after(timeout):
                reply = await self.broker.serve_local(event, mark)
        except KettenError:
            pass
        answered(reply)

    def _proof(self, raw: Any, event: Event, *, same_command: bool) -> Event:
        if type(raw) is not bytes:
            raise DecodeError("expected event bytes", where="publish reply")
        other = Event.from_bytes(raw, max_size=self.node.config.max_event_size)
        if other.criterion != event.criterion:
            raise DecodeError("the event belongs to another criterion", where="publish reply")
        if same_command and (other.author != event.author or other.command != event.command):
            raise DecodeError("the event is not of the same command", where="publish reply")
        other.verify()
        self.node.observe_clock(other)
        return other

    def _count(self, peer: Peer, event: Event, reply: Any, tally: PublishTally) -> None:
        status = field(reply, "s", str, where="publish reply")
        broker = peer.node_id
        if status == "ack":
            raw = reply.get("e")
            if raw is None:
                tally.ack(broker, event.hash)
            else:
                existing = self._proof(raw, event, same_command=True)
                if existing.payload != event.payload:
                    raise DecodeError("acknowledged other content", where="publish reply")
                tally.ack(broker, existing.hash, existing)
        elif status == "stale":
            raw = reply.get("e")
            head = self._proof(raw, event, same_command=False) if raw is not None else None
            tally.stale(broker, head)
        elif status == "invalid":
            reason = field(reply, "r", str, where="publish reply")
            message = field(reply, "m", str, where="publish reply")
            tally.invalid(broker, reason, message[:500])
        elif status == "reused":
            existing = self._proof(reply.get("e"), event, same_command=True)
            if existing.payload == event.payload:
                tally.ack(broker, existing.hash, existing)
            else:
                tally.reused(broker, existing)
        else:
            tally.abstain(broker)
