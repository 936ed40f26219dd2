"""The pub/sub layer on GosSkip (chapter 5.3 of the seed), sans-IO.

Three kinds of virtual nodes share the work:

* **Pubnodes** subscribe, publish and get notified. They do no work for the
  structure: they only know their workingnode and their two neighbours on
  the *pubnode ring* (a doubly linked ring, no long links) and take whatever
  their workingnode tells them in alive messages (:class:`Pubnode`).
* **Workingnodes** sit in the GosSkip rings and manage the pubnodes whose
  names lie between them and the next workingnode to the right; the leftmost
  workingnode of a topic also manages the topic's names below its own, the
  rightmost one the gap up to the next topic (:func:`manager_of`). They send
  alive messages, declare silent pubnodes gone, hand pubnodes over when the
  ring changes (:func:`handover`) and measure their churn
  (:class:`Workingnode`).
* **Churnnodes** only enlarge a topic's area in the ring lookups and joins
  travel (:class:`Churnnode`): a lookup that ends at one is answered with the
  workingnode it heard of (5.3.6).

Subscription protocol (5.3.4): a pubnode looks up its own name with a
nonce; a lookup not answered within ``lookup_timeout`` is sent again with
the same nonce; an answer with another nonce is ignored. It then sends the
subscription to the workingnode found and waits for alive messages; none
for ``alive_timeout`` means the workingnode failed, and it resubscribes
with a new nonce. The workingnode answers a subscription with an
unscheduled alive message to the pubnode and to its managed neighbours.

Information the seed carries in level-0 gossip (the nearest workingnodes on
each side and the nearest pubnode beyond the managed range) is a
:class:`Beacon`: the driver takes it from the sender with ``beacon(side)``
and hands it to the receiver's ``on_beacon``.

Nothing here does I/O: cores take messages and ``now`` and return
:class:`Send` records; ``tick(now)`` fires their timers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import attrs

from ketten.errors import DecodeError, ProtocolError

from ._names import ORDER_BITS, between, clockwise, point

__all__ = [
    "MAX_HANDOVER",
    "MAX_PUBNODES",
    "Alive",
    "AliveAck",
    "Beacon",
    "Churnnode",
    "Handover",
    "LookupRequest",
    "Name",
    "ProvideChurnnode",
    "Publish",
    "Pubnode",
    "Ref",
    "Send",
    "Subscribe",
    "Unsubscribe",
    "Workingnode",
    "handover",
    "manager_of",
]

MAX_PUBNODES = 4096
"""The most pubnodes one workingnode manages; more subscriptions are refused."""
MAX_HANDOVER = 1024
"""The most pubnodes one handover message may carry."""
MAX_SEEN = 1024
"""How many publications a pubnode remembers to drop duplicates."""


@attrs.frozen
class Name:
    """A two-part name ``(topic, topic order)`` (5.2.1): the topic is the hash of the
    keyword (32 bytes; SHA-256 here, the seed used SHA-1), the order a random
    64-bit number. Names sort by topic, then order, on a closed ring."""

    topic: bytes
    order: int
    position: int = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if type(self.topic) is not bytes or len(self.topic) != 32:
            raise DecodeError("a topic must be a 32-byte hash", where="gosskip pub/sub name")
        if type(self.order) is not int or not 0 <= self.order < 1 << ORDER_BITS:
            raise DecodeError("a topic order must be an integer of 64 bits",
                              where="gosskip pub/sub name")
        object.__setattr__(self, "position", point(self.topic, self.order))


@attrs.frozen
class Ref:
    """A virtual node: its address and name."""

    address: str
    name: Name

    def __attrs_post_init__(self) -> None:
        if type(self.address) is not str or not self.address:
            raise DecodeError("an address must be a non-empty string", where="gosskip pub/sub")


# -- messages ------------------------------------------------------------------


@attrs.frozen
class Subscribe:
    """Pubnode to workingnode: manage me. ``again`` marks a resubscription."""

    nonce: int
    pub: Ref
    again: bool = False


@attrs.frozen
class Unsubscribe:
    """Pubnode to workingnode: I leave."""

    pub: Ref


@attrs.frozen
class Alive:
    """Workingnode to pubnode: I manage you; your pubnode-ring neighbours are these."""

    manager: Ref
    left: Ref | None
    right: Ref | None


@attrs.frozen
class AliveAck:
    """Pubnode to workingnode: the answer to an alive message."""

    pub: Ref


@attrs.frozen
class Handover:
    """Workingnode to workingnode: take over these pubnodes."""

    pubs: tuple[Ref, ...]


@attrs.frozen
class ProvideChurnnode:
    """Workingnode to a subscribing pubnode (procedure 1): bring a churnnode into
    ``topic`` and keep it until ``until``."""

    topic: bytes
    until: float


@attrs.frozen
class Publish:
    """An event flooded through the pubnode ring of one topic."""

    origin: str
    seq: int
    topic: bytes
    payload: bytes


@attrs.frozen
class Beacon:
    """What level-0 gossip carries for the pub/sub layer (5.3.2, 5.3.6): the nearest
    workingnode on the sender's side (the sender itself if it is one) and the
    nearest pubnode on that side."""

    worker: Ref | None
    pub: Ref | None


@attrs.frozen
class LookupRequest:
    """A pubnode asks the overlay for the workingnode managing ``target``."""

    nonce: int
    target: Name


Message = Subscribe | Unsubscribe | Alive | AliveAck | Handover | ProvideChurnnode | Publish


@attrs.frozen
class Send:
    """Send ``message`` to the virtual node at ``to``."""

    to: str
    message: Message


# -- who manages what ------------------------------------------------------------


def manager_of(name: Name, left: Name, right: Name) -> Name:
    """Which of two adjacent workingnodes manages ``name``: ``left`` is the last
    workingnode at or before it on the ring, ``right`` the first after it.

    The left one manages up to the right one, except that the leftmost
    workingnode of a topic also manages the topic's names below its own
    order (5.3.2)."""
    if left.topic == name.topic:
        return left
    if right.topic == name.topic:
        return right
    return left


def _topic(name: Name) -> int:
    return int.from_bytes(name.topic, "big")


def _strictly_between(start: Name, middle: Name, end: Name) -> bool:
    """Whether ``middle``'s topic lies strictly inside the clockwise topic arc from
    ``start``'s to ``end``'s; nothing lies between a topic and itself."""
    a, m, b = _topic(start), _topic(middle), _topic(end)
    return a != b and between(a, m, b)


def handover(manager: Name, neighbour: Name, pub: Name, side: str) -> tuple[int, bool]:
    """The handover rules of 5.3.7: which rule decides, and whether ``manager``
    hands ``pub`` to ``neighbour``, the nearest workingnode on ``side`` (``"left"``:
    heard by a level-0 gossip message; ``"right"``: by a gossip answer).

    1. The pubnode has the neighbour's topic and the manager has not: hand over.
    2. All three topics differ: hand over when the pubnode's topic does not lie
       between the manager's and the neighbour's.
    3. Manager and neighbour share a topic, the pubnode has another: as in 2.
    4. All three share the topic: (a) the manager's order is the larger: hand
       over when the pubnode's order is below the manager's; (b) the
       neighbour's order is the larger: hand over when the pubnode's order is
       above the neighbour's.
    5. Otherwise the manager keeps it.

    "Between" in rules 2 and 3 is the topic arc the manager keeps towards a
    right neighbour: strictly inside the clockwise arc from the manager's topic
    to the neighbour's (empty when they are equal). The seed words the rule
    for that case; towards a left neighbour the manager keeps nothing (it
    manages rightwards), so the mirror image applies: hand over when the
    pubnode's topic lies strictly inside the arc from the neighbour's topic to
    the manager's.
    """
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', not {side!r}")
    same_mp = manager.topic == pub.topic
    same_np = neighbour.topic == pub.topic
    same_mn = manager.topic == neighbour.topic
    if same_np and not same_mp:
        return 1, True
    if not (same_mp or same_np or same_mn) or (same_mn and not same_mp):
        rule = 3 if same_mn else 2
        if side == "right":
            return rule, not _strictly_between(manager, pub, neighbour)
        return rule, _strictly_between(neighbour, pub, manager)
    if same_mp and same_np:
        if manager.order > neighbour.order:
            return 4, pub.order < manager.order
        if neighbour.order > manager.order:
            return 4, pub.order > neighbour.order
    return 5, False


# -- pubnodes --------------------------------------------------------------------


@attrs.define(eq=False)
class Pubnode:
    """A subscriber's virtual node. ``first_nonce`` starts its nonce counter."""

    me: Ref
    lookup_timeout: float = 3.0
    alive_timeout: float = 4.0
    first_nonce: int = 1
    _nonce: int = attrs.field(default=0, init=False)
    _looking: bool = attrs.field(default=False, init=False)
    _lookup_sent: float = attrs.field(default=0.0, init=False)
    _manager: Ref | None = attrs.field(default=None, init=False)
    _waiting_since: float = attrs.field(default=0.0, init=False)
    _last_alive: float = attrs.field(default=0.0, init=False)
    _left: Ref | None = attrs.field(default=None, init=False)
    _right: Ref | None = attrs.field(default=None, init=False)
    _subscribed: bool = attrs.field(default=False, init=False)
    _seen: OrderedDict[tuple[str, int], None] = attrs.field(factory=OrderedDict, init=False)
    _delivered: list[Publish] = attrs.field(factory=list, init=False)
    _seq: int = attrs.field(default=0, init=False)
    resubscriptions: int = attrs.field(default=0, init=False)
    lookups: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        self._nonce = self.first_nonce

    @property
    def manager(self) -> Ref | None:
        return self._manager

    @property
    def neighbours(self) -> tuple[Ref | None, Ref | None]:
        return self._left, self._right

    @property
    def nonce(self) -> int:
        return self._nonce

    def subscribe(self, now: float) -> list[LookupRequest]:
        """Start the subscription: look up this pubnode's own name."""
        self._subscribed = True
        return self._lookup(now)

    def take_manager(self, manager: Ref, now: float) -> None:
        """Start out managed by ``manager`` without the protocol (a simulation's
        initial population)."""
        self._subscribed = True
        self._manager, self._last_alive, self._looking = manager, now, False

    def on_lookup_result(self, nonce: int, manager: Ref, now: float) -> list[Send]:
        """The lookup with ``nonce`` found ``manager``: subscribe there (a stale nonce
        is ignored)."""
        if not self._looking or nonce != self._nonce:
            return []
        self._looking = False
        self._manager = manager
        self._waiting_since = now
        self._last_alive = now
        return [Send(manager.address, Subscribe(nonce, self.me, again=self.resubscriptions > 0))]

    def on_alive(self, alive: Alive, now: float) -> list[Send]:
        """Take an alive message: whoever sends it is the manager from now on (5.3.1)."""
        if not self._subscribed:
            return []
        for ref in (alive.left, alive.right):
            if ref is not None and ref.address == self.me.address:
                raise ProtocolError("an alive message naming the pubnode as its own neighbour")
        self._manager = alive.manager
        self._left, self._right = alive.left, alive.right
        self._last_alive = now
        self._looking = False
        return [Send(alive.manager.address, AliveAck(self.me))]

    def tick(self, now: float) -> list[LookupRequest]:
        """Timers: a lost lookup goes again with its nonce; a silent manager means
        resubscribing with a new one."""
        if not self._subscribed:
            return []
        if self._looking:
            if now - self._lookup_sent >= self.lookup_timeout:
                self._lookup_sent = now
                self.lookups += 1
                return [LookupRequest(self._nonce, self.me.name)]
            return []
        if now - self._last_alive >= self.alive_timeout:
            self.resubscriptions += 1
            self._nonce += 1
            self._manager = None
            return self._lookup(now)
        return []

    def unsubscribe(self) -> list[Send]:
        """Leave: tell the manager directly (5.3.2); the pubnode then falls silent."""
        self._subscribed = False
        self._looking = False
        manager, self._manager = self._manager, None
        return [] if manager is None else [Send(manager.address, Unsubscribe(self.me))]

    # -- publishing --------------------------------------------------------------

    def publish(self, payload: bytes) -> list[Send]:
        """Flood an event of this pubnode's topic both ways through the pubnode ring."""
        self._seq += 1
        event = Publish(self.me.address, self._seq, self.me.name.topic, payload)
        self._remember(event)
        return self._forward(event, came_from=None)

    def on_publish(self, event: Publish, sender: str) -> list[Send]:
        """Store and forward an event: deliver it once, pass it on away from the sender
        while the neighbour is still in the topic."""
        if event.topic != self.me.name.topic:
            raise ProtocolError("a publication of another topic")
        if (event.origin, event.seq) in self._seen:
            return []
        self._remember(event)
        return self._forward(event, came_from=sender)

    @property
    def delivered(self) -> list[Publish]:
        return list(self._delivered)

    def _remember(self, event: Publish) -> None:
        self._seen[(event.origin, event.seq)] = None
        while len(self._seen) > MAX_SEEN:
            self._seen.popitem(last=False)
        self._delivered.append(event)
        del self._delivered[:-MAX_SEEN]

    def _forward(self, event: Publish, came_from: str | None) -> list[Send]:
        out: list[Send] = []
        for ref in (self._left, self._right):
            if (ref is not None and ref.address != came_from
                    and ref.name.topic == event.topic and ref.address != self.me.address):
                out.append(Send(ref.address, event))
        return out

    def _lookup(self, now: float) -> list[LookupRequest]:
        self._looking = True
        self._lookup_sent = now
        self.lookups += 1
        return [LookupRequest(self._nonce, self.me.name)]


# -- churnnodes ------------------------------------------------------------------


@attrs.define(eq=False)
class Churnnode:
    """A churnnode's pub/sub state: only the nearest workingnodes it heard of by
    gossip, to answer lookups with (5.3.6). It leaves at ``until``."""

    me: Ref
    until: float
    _left_worker: Ref | None = attrs.field(default=None, init=False)
    _right_worker: Ref | None = attrs.field(default=None, init=False)
    _left_pub: Ref | None = attrs.field(default=None, init=False)
    _right_pub: Ref | None = attrs.field(default=None, init=False)

    def workers(self) -> tuple[Ref | None, Ref | None]:
        return self._left_worker, self._right_worker

    def beacon(self, side: str) -> Beacon:
        """What this node passes on towards ``side``: it relays what it heard from the
        other side (workingnodes stop the relay, churnnodes do not)."""
        if side == "right":
            return Beacon(self._left_worker, self._left_pub)
        return Beacon(self._right_worker, self._right_pub)

    def on_beacon(self, side: str, beacon: Beacon, now: float) -> list[Send]:
        if side == "left":
            self._left_worker, self._left_pub = beacon.worker, beacon.pub
        else:
            self._right_worker, self._right_pub = beacon.worker, beacon.pub
        return []


# -- workingnodes ------------------------------------------------------------------


@attrs.frozen
class _Managed:
    ref: Ref
    acked: float


@attrs.define(eq=False)
class Workingnode:
    """A workingnode's pub/sub state (5.3.2).

    ``alive_interval`` is the period of alive messages, ``alive_timeout`` how
    long a pubnode may stay silent. Churn (subscriptions accepted and
    unsubscriptions seen) is counted per interval of ``churn_interval``
    seconds from ``started``. With ``churnnode_lifetime`` set, procedure 1 is on: a
    subscription arriving while the churn is not lower than in the interval
    before asks the subscriber for a churnnode, and only one churnnode asked
    for by this workingnode is alive at a time (the preventive rule).
    """

    me: Ref
    alive_interval: float = 1.0
    alive_timeout: float = 4.0
    churn_interval: float = 10.0
    churnnode_lifetime: float | None = None
    max_pubnodes: int = MAX_PUBNODES
    started: float = 0.0
    """When the first churn interval begins."""
    _pubs: dict[str, _Managed] = attrs.field(factory=dict, init=False)
    _left_worker: Ref | None = attrs.field(default=None, init=False)
    _right_worker: Ref | None = attrs.field(default=None, init=False)
    _left_pub: Ref | None = attrs.field(default=None, init=False)
    _right_pub: Ref | None = attrs.field(default=None, init=False)
    _last_alive: float = attrs.field(default=float("-inf"), init=False)
    _interval_start: float = attrs.field(default=0.0, init=False)
    _churn_now: int = attrs.field(default=0, init=False)
    _churn_prev: int = attrs.field(default=0, init=False)
    _churnnode_until: float = attrs.field(default=float("-inf"), init=False)
    churnnodes_asked: int = attrs.field(default=0, init=False)
    handovers: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        self._interval_start = self.started

    # -- reading -------------------------------------------------------------------

    @property
    def churn(self) -> int:
        """The churn measured in the last complete interval (``c_lokal``)."""
        return self._churn_prev

    @property
    def measured(self) -> bool:
        """Whether one churn interval is complete: before that :attr:`churn` reads 0
        for want of a measurement, not for want of churn."""
        return self._interval_start > self.started

    def workers(self) -> tuple[Ref | None, Ref | None]:
        return self._left_worker, self._right_worker

    def managed(self) -> list[Ref]:
        """The managed pubnodes in ring order, read against the right workingnode:
        ``A < B`` when ``B`` lies between ``A`` and it (5.3.2)."""
        anchor = self._right_worker.name.position if self._right_worker else self.me.name.position
        return sorted((m.ref for m in self._pubs.values()),
                      key=lambda r: -clockwise(r.name.position, anchor))

    def beacon(self, side: str) -> Beacon:
        """What level-0 gossip carries from this node towards ``side``."""
        pubs = self.managed()
        if side == "right":
            return Beacon(self.me, pubs[-1] if pubs else self._left_pub)
        return Beacon(self.me, pubs[0] if pubs else self._right_pub)

    # -- the subscription protocol ---------------------------------------------------

    def on_subscribe(self, message: Subscribe, now: float) -> list[Send]:
        """Manage a new pubnode: an unscheduled alive message to it and to its managed
        neighbours, and (procedure 1) maybe a request for a churnnode."""
        pub = message.pub
        if pub.address not in self._pubs and len(self._pubs) >= self.max_pubnodes:
            raise ProtocolError(f"this workingnode manages {self.max_pubnodes} pubnodes already")
        self._roll(now)
        self._pubs[pub.address] = _Managed(pub, now)
        out = self._alive_around(pub, now)
        if not message.again:
            self._churn_now += 1
            if (self.churnnode_lifetime is not None and self._churn_now >= self._churn_prev
                    and self._churnnode_until <= now):
                self._churnnode_until = now + self.churnnode_lifetime
                self.churnnodes_asked += 1
                out.append(Send(pub.address, ProvideChurnnode(self.me.name.topic,
                                                               self._churnnode_until)))
        return out

    def on_unsubscribe(self, message: Unsubscribe, now: float) -> list[Send]:
        """A pubnode leaves: repair the pubnode ring around it at once."""
        self._roll(now)
        if self._pubs.pop(message.pub.address, None) is None:
            return []
        self._churn_now += 1
        return self._alive_all(now) if self._pubs else []

    def on_alive_ack(self, message: AliveAck, now: float) -> None:
        managed = self._pubs.get(message.pub.address)
        if managed is not None and managed.ref == message.pub:
            self._pubs[message.pub.address] = _Managed(managed.ref, now)

    def tick(self, now: float) -> list[Send]:
        """Timers: drop pubnodes silent for ``alive_timeout``, send the periodic alive
        messages, close the churn interval."""
        self._roll(now)
        horizon = now - self.alive_timeout
        for address in [a for a, m in self._pubs.items() if m.acked < horizon]:
            del self._pubs[address]
        if now - self._last_alive < self.alive_interval:
            return []
        self._last_alive = now
        return self._alive_all(now)

    # -- the ring around it ------------------------------------------------------------

    def on_beacon(self, side: str, beacon: Beacon, now: float) -> list[Send]:
        """Take what level-0 gossip from ``side`` carried; then check the handover
        rules against the nearest workingnode there (5.3.7)."""
        if side == "left":
            changed = beacon.pub != self._left_pub
            self._left_worker, self._left_pub = beacon.worker, beacon.pub
        else:
            changed = beacon.pub != self._right_pub
            self._right_worker, self._right_pub = beacon.worker, beacon.pub
        out: list[Send] = []
        neighbour = beacon.worker
        if neighbour is not None and neighbour.address != self.me.address:
            leaving = [m.ref for m in self._pubs.values()
                       if handover(self.me.name, neighbour.name, m.ref.name, side)[1]]
            for start in range(0, len(leaving), MAX_HANDOVER):
                chunk = tuple(leaving[start:start + MAX_HANDOVER])
                out.append(Send(neighbour.address, Handover(chunk)))
            for ref in leaving:
                del self._pubs[ref.address]
            self.handovers += len(leaving)
            changed = changed or bool(leaving)
        if changed and self._pubs:
            pubs = self.managed()
            edge = pubs[0] if side == "left" else pubs[-1]
            out.extend(self._alive_around(edge, now))
        return out

    def on_handover(self, message: Handover, now: float) -> list[Send]:
        """Take over pubnodes from a neighbour and tell them at once."""
        if len(message.pubs) > MAX_HANDOVER:
            raise ProtocolError(f"a handover of {len(message.pubs)} pubnodes")
        if len(self._pubs) + len(message.pubs) > self.max_pubnodes:
            raise ProtocolError(f"this workingnode manages {self.max_pubnodes} pubnodes already")
        for ref in message.pubs:
            self._pubs[ref.address] = _Managed(ref, now)
        return self._alive_all(now) if message.pubs else []

    def leave(self) -> list[Send]:
        """Leave on purpose (adaptation): the pubnodes go to the left workingnode, which
        inherits this node's range. (The seed lets a leaving workingnode fall silent
        and its pubnodes resubscribe; handing them over saves those lookups.)"""
        pubs = tuple(m.ref for m in self._pubs.values())
        self._pubs.clear()
        target = self._left_worker or self._right_worker
        if target is None or not pubs or target.address == self.me.address:
            return []
        return [Send(target.address, Handover(pubs[i:i + MAX_HANDOVER]))
                for i in range(0, len(pubs), MAX_HANDOVER)]

    # -- internals -----------------------------------------------------------------

    def _roll(self, now: float) -> None:
        while now - self._interval_start >= self.churn_interval:
            self._churn_prev, self._churn_now = self._churn_now, 0
            self._interval_start += self.churn_interval

    def _neighbours_in(self, pubs: Sequence[Ref], index: int) -> tuple[Ref | None, Ref | None]:
        left = pubs[index - 1] if index > 0 else self._left_pub
        right = pubs[index + 1] if index + 1 < len(pubs) else self._right_pub
        me = pubs[index].address
        return (None if left is not None and left.address == me else left,
                None if right is not None and right.address == me else right)

    def _alive(self, pubs: Sequence[Ref], index: int) -> Send:
        left, right = self._neighbours_in(pubs, index)
        return Send(pubs[index].address, Alive(self.me, left, right))

    def _alive_all(self, now: float) -> list[Send]:
        self._last_alive = now
        pubs = self.managed()
        return [self._alive(pubs, i) for i in range(len(pubs))]

    def _alive_around(self, pub: Ref, now: float) -> list[Send]:
        pubs = self.managed()
        index = next(i for i, r in enumerate(pubs) if r.address == pub.address)
        return [self._alive(pubs, i) for i in range(max(0, index - 1), min(len(pubs), index + 2))]
