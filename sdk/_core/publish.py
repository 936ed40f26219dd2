"""Publishing, sans-IO: the leader's verdict on an offer and the publisher's round.

The leader of a chain appends an offered event only if it extends its head;
an event it already holds (the same event, an earlier attempt of the same
publish call, or the same command with the same content) is acknowledged
once committed, and other content under a committed command id is
refused. The publisher (:class:`PublishAttempt`) builds events on the head
it last heard of, sends each to the leader, follows redirects, urges a
member to stand for leader when none answers, rebuilds on a newer head when
the chain moved on, and gives up at its deadline with an honest outcome:
nothing stored anywhere, or stored somewhere and maybe committed.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence

import attrs

from ..errors import DecodeError
from .event import Event
from .membership import Member, Pos
from .messages import Answer, OfferAnswer, OfferItem, Route

__all__ = [
    "Action",
    "PublishAttempt",
    "Step",
    "Verdict",
    "answered_event",
    "backoff_delay",
    "judge_offer",
    "settled_answer",
]


class Verdict(enum.Enum):
    APPEND = "append"
    """It extends the head: verify, append, replicate, acknowledge once committed."""
    PRESENT = "present"
    """This call's event is already in the chain: acknowledge it once committed."""
    REUSED = "reused"
    """Its command id names other content: refuse once that content is committed."""
    STALE = "stale"
    """It does not extend the head: answer with the head."""


def judge_offer(
    event: Event,
    *,
    head: Event | None,
    earlier: Event | None,
    by_command: Event | None,
    at_seq: Event | None,
) -> tuple[Verdict, Event | None]:
    """The leader's decision on ``event``.

    ``earlier`` is a main-chain event among the call's earlier attempts,
    ``by_command`` the main-chain event with the same ``(author, command)``,
    ``at_seq`` the main-chain event at ``event.seq``. Returns the verdict
    and the event it refers to.
    """
    if earlier is not None:
        return Verdict.PRESENT, earlier
    if by_command is not None:
        if by_command.hash == event.hash or by_command.payload == event.payload:
            return Verdict.PRESENT, by_command
        return Verdict.REUSED, by_command
    if at_seq is not None and at_seq.hash == event.hash:
        return Verdict.PRESENT, at_seq
    if head is None:
        return (Verdict.APPEND, None) if event.seq == 0 else (Verdict.STALE, None)
    if event.seq == head.seq + 1 and event.prev == head.hash:
        return Verdict.APPEND, None
    return Verdict.STALE, head


def settled_answer(verdict: Verdict, event: Event, target: Event,
                   settled: bool | None) -> OfferAnswer:
    """The leader's answer once it waited for ``target`` (the offered ``event``, or
    the event the verdict refers to) to commit: ``settled`` is ``True`` if it did,
    ``False`` if another event took its place, ``None`` if time ran out."""
    if settled is None:
        return OfferAnswer(Answer.BUSY, stored=True,
                           message="not committed in time (the outcome is unknown)")
    if settled is False:
        return OfferAnswer(Answer.BUSY, stored=True, message="leadership changed while "
                           "the event was being committed (the outcome is unknown)")
    if verdict is Verdict.REUSED:
        return OfferAnswer(Answer.REUSED, event=target.to_bytes(), message=(
            f"command {event.command} of author {event.author.hex()[:16]} is already "
            f"applied with other content as seq {target.seq}"))
    return OfferAnswer(Answer.ACK, event=None if target.hash == event.hash
                       else target.to_bytes())


def answered_event(answer: OfferAnswer, item: OfferItem, offered: Event) -> Event:
    """The event a broker's ``answer`` to ``item`` carries, checked against ``offered``.

    An acknowledgement must name this call's event (or an earlier attempt of
    it, or the same command of the same author); an acknowledged event of this
    call must carry this call's content. Raises :class:`DecodeError` naming
    what was wrong, or :class:`InvalidEvent` for a bad signature.
    """
    assert answer.event is not None
    event = Event.from_bytes(answer.event, max_size=1 << 24)
    if event.criterion != offered.criterion:
        raise DecodeError("an event of another criterion", where="offer answer")
    if answer.kind in (Answer.ACK, Answer.REUSED):
        same_call = event.hash in (offered.hash, *item.attempts)
        same_command = (offered.command is not None and event.author == offered.author
                        and event.command == offered.command)
        if not (same_call or same_command):
            raise DecodeError("acknowledged an event of another call", where="offer answer")
        if answer.kind is Answer.ACK and not same_call and event.payload != offered.payload:
            raise DecodeError("acknowledged other content", where="offer answer")
    event.verify()
    return event


def backoff_delay(attempt: int, draw: float, *, base: float = 0.01, cap: float = 1.0) -> float:
    """Full-jitter exponential backoff: ``draw`` in ``[0, 1)`` times the capped bound."""
    bound: float = min(cap, base * 2.0 ** min(attempt, 30))
    return draw * bound


class Step(enum.Enum):
    ROUTE = "route"
    """Find out who holds the chain (``refresh``: the known route is stale)."""
    BUILD = "build"
    """Sign a new event at ``seq`` after ``prev`` and call :meth:`PublishAttempt.built`."""
    CONFLICT = "conflict"
    """Let the application re-check its intent against ``head`` (:meth:`~PublishAttempt.resolved`)."""
    SEND = "send"
    """Offer ``item`` to ``target`` and call :meth:`PublishAttempt.answered`."""
    WAIT = "wait"
    """Sleep until ``until``, then ask again."""
    DONE = "done"
    """Acknowledged: ``event`` is committed."""
    FAIL = "fail"
    """Gave up: ``error`` names the kind (see :class:`PublishAttempt`)."""


@attrs.frozen
class Action:
    step: Step
    refresh: bool = False
    seq: int = 0
    prev: bytes | None = None
    head: Pos | None = None
    target: Member | None = None
    item: OfferItem | None = None
    until: float = 0.0
    event: Event | None = None
    error: str = ""
    message: str = ""
    answer: OfferAnswer | None = None


@attrs.define(eq=False)
class PublishAttempt:
    """One ``publish()`` call, from the first offer to its outcome.

    Failure kinds (:attr:`Action.error`): ``"quorum"`` (nothing was stored
    anywhere), ``"unknown"`` (some broker may hold an attempt; its hashes
    are :attr:`maybe_stored`), ``"invalid"`` and ``"reused"`` (the answer is
    in :attr:`Action.answer`).
    """

    criterion: bytes
    deadline: float
    rng: random.Random
    base: Pos | None = None
    has_conflict_handler: bool = False
    route_base: bool = True
    """Build on a route's commit position when nothing better is known (a publisher
    with a logical clock turns this off: it must see the head's stamp first, and
    a stale answer carries the head)."""
    max_retries: int = 10_000
    route: Route | None = None
    create: tuple[Member, ...] | None = None
    event: Event | None = None
    attempts: list[bytes] = attrs.field(factory=list)
    maybe_stored: list[bytes] = attrs.field(factory=list)
    _need_route: bool = True
    _refresh: bool = False
    _failed: dict[bytes, float] = attrs.field(factory=dict)
    _target: Member | None = None
    _urge: bool = False
    _retries: int = 0
    _wait_until: float = 0.0
    _pending_conflict: Pos | None = None
    _done: Event | None = None
    _fail: tuple[str, str, OfferAnswer | None] | None = None
    _reached: set[bytes] = attrs.field(factory=set)
    _last_error: str = ""

    # -- inputs --------------------------------------------------------------

    def routed(self, route: Route | None, now: float, *,
               create: Sequence[Member] | None = None, error: str = "") -> None:
        """The route the driver found at ``now``; or, for a chain nobody holds, whom to
        create it on; or neither (``error`` says why): ask again after a backoff."""
        self._need_route = False
        self._refresh = False
        if route is not None:
            self.route = route
            self.create = None
            if self.base is None and route.commit is not None and self.route_base:
                self.base = route.commit
        elif create:
            self.create = tuple(create)
        else:
            self._last_error = error or "no broker of the chain could be found"
            self._retry_later(now)

    def known_route(self, route: Route | None, now: float) -> None:
        """A route the driver knew before asking (``None``: none): taken as a lookup's."""
        if route is not None and self._need_route and not self._refresh:
            self.routed(route, now)

    def built(self, event: Event) -> None:
        self.event = event
        self.attempts.append(event.hash)
        del self.attempts[:-64]

    def resolved(self) -> None:
        """The application accepted the new head (it may have changed the payload)."""
        self._pending_conflict = None

    def answered(self, target: Member, answer: OfferAnswer | None, event: Event | None,
                 now: float) -> None:
        """The answer of ``target`` to the last offer (``None``: none came).

        ``event`` is the event the answer carries, decoded and checked by the
        driver (the acknowledged one, or the head of a stale answer).
        """
        offered = self.event
        if answer is None:
            # It may have taken the offer before going silent.
            if offered is not None and offered.hash not in self.maybe_stored:
                self.maybe_stored.append(offered.hash)
            self._failed[target.key] = now
            self._target = None
            self._urge = True
            self._retry_later(now)
            self._last_error = f"{target.address} did not answer"
            return
        self._reached.add(target.key)
        kind = answer.kind
        if kind is Answer.ACK:
            self._done = event if event is not None else offered
            return
        if kind is Answer.INVALID:
            self._fail = ("invalid", answer.message, answer)
            return
        if kind is Answer.REUSED:
            self._fail = ("reused", answer.message, answer)
            return
        if kind is Answer.LIMITED:
            self._fail = ("limited", answer.message, answer)
            return
        if kind is Answer.STALE:
            head = None if event is None else (event.seq, event.hash)
            self.base = head
            self.event = None
            if self.has_conflict_handler:
                self._pending_conflict = head
            self._retry_later(now, quick=True)
            return
        if kind is Answer.REDIRECT:
            assert answer.route is not None
            self.route = answer.route
            self.create = None
            leader = answer.route.leader
            self._target = None
            # A broker that names itself leader yet redirects does not lead: urge one.
            self._urge = leader is None or leader in self._failed or leader == target.key
            if (self.base is None and answer.route.commit is not None and self.event is None
                    and self.route_base):
                self.base = answer.route.commit
            self._retry_later(now, quick=leader is not None)
            return
        if kind is Answer.BUSY:
            if answer.stored and offered is not None and offered.hash not in self.maybe_stored:
                self.maybe_stored.append(offered.hash)
            self._last_error = answer.message or f"{target.address} could not decide in time"
            self._retry_later(now)
            return
        # ABSENT: our route is stale (or the chain could not be created yet).
        self._last_error = answer.message or f"{target.address} does not hold the chain"
        self._need_route = True
        self._refresh = True
        self.route = None if self.create is None else self.route
        self._retry_later(now)

    # -- the next step -------------------------------------------------------

    def _retry_later(self, now: float, *, quick: bool = False) -> None:
        self._retries += 1
        if quick and self._retries < 3:
            self._wait_until = now
            return
        self._wait_until = now + backoff_delay(self._retries, self.rng.random(),
                                               base=0.01, cap=0.5)

    def _choose_target(self, now: float) -> tuple[Member, bool] | None:
        route = self.route
        if route is None and self.create:
            ordered = [m for m in self.create if m.key not in self._failed] or list(self.create)
            return ordered[0], ordered[0] != self.create[0]
        if route is None:
            return None
        members = list(route.config.members())
        leader = route.leader
        if leader is not None and not self._urge and leader not in self._failed:
            for member in members:
                if member.key == leader:
                    return member, False
        # No known live leader: ask a member to stand, the least recently failed first.
        ranked = sorted(members, key=lambda m: (self._failed.get(m.key, float("-inf")),
                                                self.rng.random()))
        return ranked[0], True

    def next(self, now: float) -> Action:
        if self._done is not None:
            return Action(Step.DONE, event=self._done)
        if self._fail is not None:
            kind, message, answer = self._fail
            return Action(Step.FAIL, error=kind, message=message, answer=answer)
        if now >= self.deadline or self._retries > self.max_retries:
            return self._give_up()
        if self._wait_until > now:
            return Action(Step.WAIT, until=min(self._wait_until, self.deadline))
        if self._pending_conflict is not None:
            return Action(Step.CONFLICT, head=self._pending_conflict)
        if self._need_route:
            return Action(Step.ROUTE, refresh=self._refresh)
        if self.event is None:
            base = self.base
            return Action(Step.BUILD, seq=0 if base is None else base[0] + 1,
                          prev=None if base is None else base[1])
        chosen = self._choose_target(now)
        if chosen is None:
            self._need_route = True
            return Action(Step.ROUTE, refresh=True)
        target, urge = chosen
        earlier = tuple(h for h in self.attempts if h != self.event.hash)
        item = OfferItem(self.event.to_bytes(), earlier,
                         self.create if self.route is None else None, urge)
        return Action(Step.SEND, target=target, item=item)

    def _give_up(self) -> Action:
        if self.maybe_stored:
            return Action(Step.FAIL, error="unknown", message=self._last_error)
        return Action(Step.FAIL, error="quorum", message=self._last_error)

    @property
    def reached(self) -> int:
        """How many brokers answered at all."""
        return len(self._reached)
