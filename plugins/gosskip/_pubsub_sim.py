"""A seeded, virtual-time simulation of the GosSkip pub/sub layer.

Workingnodes and churnnodes form one GosSkip ring (the *churn ring* of
5.3: every node a sans-IO :class:`~._ring.Ring`, levels built by gossip);
pubnodes, workingnodes and churnnodes run their sans-IO pub/sub cores
(:mod:`._pubsub`, :mod:`._adaptation`); messages go through an in-memory
queue, and a message to a node that is gone is lost. One round is one
second of virtual time: a gossip round, the new subscriptions and
unsubscriptions, the timers of every node, and the messages they cause.

Per topic it counts churn (subscriptions and unsubscriptions by users),
and the lookup and join messages nodes of the topic's area forwarded; the
fairness quotients follow from them (:mod:`._fairness`).

Where the seed is silent, this simulation does the following:

* The initial ``nodes`` workingnodes are spread evenly over the topics, each
  managing ``pubs_per_worker`` pubnodes (not counted as churn).
* The *lookup load* is ``lookups`` subscriptions per round to topics drawn
  uniformly; the churn pattern adds ``churn_rate`` subscriptions per round to
  the churn topic, and with ``subscribe-unsubscribe`` each of those
  subscribers unsubscribes again after ``stay`` rounds.
* Workingnodes are provided by subscribers at ``worker_ratio`` : 1 (5.3.8's
  ``x : 1``): every ``worker_ratio``-th subscriber of a topic also joins a
  workingnode at a random order in it, which leaves when the subscriber
  unsubscribes (its pubnodes then resubscribe, as in the seed), unless it is
  the topic's last workingnode.
* Lookups and joins start at a random node of the ring (the seed's bootstrap
  oracle). Resubscriptions are work but not churn.
* There is no separate workingnode ring: procedure 2 samples by walking the
  churn ring's levels to the ``x``-th neighbour (5.2.4) in a random
  direction; a churnnode met there stands for the workingnode it knows.
  Sampling is not counted as lookup work (the seed does it in the
  workingnode ring, apart from the searches for entry points).
* Adaptation ``2s`` is procedure 2 with the sampled churn scaled to the
  topic's churn (see :meth:`~._adaptation.GlobalView.decide`).
* A workingnode that procedure 2 removes hands its pubnodes to its left
  workingnode instead of letting them resubscribe.
* A workingnode takes part in procedure 2 (samples, answers samples and
  decides) only after its first complete churn interval: until then it has no
  ``c_lokal``, and reading 0 would make Algorithm 1 remove it with
  probability ``g_lokal / g_gesamt``, most often in the topic that grows.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Callable

import attrs

from ketten.errors import KettenError
from ketten.interfaces import Peer

from ._adaptation import GlobalView, SampleRequest, topic_size
from ._fairness import TopicLoad, max_difference
from ._names import Contact, clockwise, point
from ._pubsub import (
    Alive,
    AliveAck,
    Churnnode,
    Handover,
    Name,
    ProvideChurnnode,
    Publish,
    Pubnode,
    Ref,
    Send,
    Subscribe,
    Unsubscribe,
    Workingnode,
    manager_of,
)
from ._ring import Gossip, Ring

__all__ = ["ADAPTATIONS", "CHURN_PATTERNS", "PubSubSimulation", "SimConfig", "SimResult"]

ADAPTATIONS = ("off", "1", "2", "2s")
CHURN_PATTERNS = ("none", "subscribe", "subscribe-unsubscribe")


def topic_hash(index: int) -> bytes:
    """The hash of topic ``t<index>``'s keyword."""
    return hashlib.sha256(f"t{index}".encode()).digest()


@attrs.frozen
class SimConfig:
    """The knobs of one simulation run (see the module docstring)."""

    nodes: int = 128
    topics: int = 8
    churn: str = "subscribe"
    churn_topic: int = 3
    churn_rate: float = 4.0
    lookups: float = 2.0
    adaptation: str = "off"
    rounds: int = 120
    warmup: int = 12
    seed: int = 0
    pubs_per_worker: int = 2
    worker_ratio: int = 4
    interval: int = 30
    churnnode_lifetime: int = 30
    stay: int = 10

    def __attrs_post_init__(self) -> None:
        if self.nodes < self.topics or self.topics < 1:
            raise ValueError("every topic needs a workingnode: nodes >= topics >= 1")
        if self.churn not in CHURN_PATTERNS:
            raise ValueError(f"churn must be one of {', '.join(CHURN_PATTERNS)}")
        if self.adaptation not in ADAPTATIONS:
            raise ValueError(f"adaptation must be one of {', '.join(ADAPTATIONS)}")
        if not 0 <= self.churn_topic < self.topics:
            raise ValueError("the churn topic must be one of the topics (0 .. topics-1)")
        if self.rounds < 1 or self.interval < 1 or self.worker_ratio < 1:
            raise ValueError("rounds, interval and worker_ratio must be positive")
        if self.lookups < 0 or self.churn_rate < 0:
            raise ValueError("rates must not be negative")


@attrs.frozen
class SimResult:
    """One run's table: a row per topic, in topic order, and the largest difference
    of the fairness quotients."""

    config: SimConfig
    loads: tuple[TopicLoad, ...]
    max_difference: float
    workingnodes: int
    churnnodes: int
    resubscriptions: int
    dropped: int
    """Messages refused by a core as malformed (none are expected)."""
    inserted: int = 0
    """Workingnodes procedure 2 inserted."""
    removed: int = 0
    """Workingnodes procedure 2 removed."""


@attrs.frozen(eq=False)
class _Member(Contact):
    """A ring node whose name is a topic and an order (the pub/sub two-part name)."""

    topic: bytes = attrs.field(kw_only=True)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "position", point(self.topic, self.order))


@attrs.define(eq=False)
class PubSubSimulation:
    """Build with a :class:`SimConfig`, then :meth:`run`."""

    config: SimConfig
    now: float = attrs.field(default=0.0, init=False)
    rings: dict[str, Ring] = attrs.field(factory=dict, init=False)
    workers: dict[str, Workingnode] = attrs.field(factory=dict, init=False)
    churners: dict[str, Churnnode] = attrs.field(factory=dict, init=False)
    pubs: dict[str, Pubnode] = attrs.field(factory=dict, init=False)
    views: dict[str, GlobalView] = attrs.field(factory=dict, init=False)
    churn: list[int] = attrs.field(init=False)
    lookups: list[int] = attrs.field(init=False)
    joins: list[int] = attrs.field(init=False)
    dropped: int = attrs.field(default=0, init=False)
    inserted: int = attrs.field(default=0, init=False)
    removed: int = attrs.field(default=0, init=False)
    _rng: random.Random = attrs.field(init=False)
    _topics: list[bytes] = attrs.field(init=False)
    _topic_index: dict[bytes, int] = attrs.field(init=False)
    _queue: deque[tuple[str, Send]] = attrs.field(factory=deque, init=False)
    _counter: int = attrs.field(default=0, init=False)
    _subscribers: list[int] = attrs.field(init=False)
    _provided: dict[str, str] = attrs.field(factory=dict, init=False)
    """A subscriber's pubnode address -> the workingnode it provides."""
    _leaving: list[tuple[float, str]] = attrs.field(factory=list, init=False)
    _phases: dict[str, int] = attrs.field(factory=dict, init=False)
    _counting: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        c = self.config
        self._rng = random.Random(c.seed)
        self._topics = [topic_hash(i) for i in range(c.topics)]
        self._topic_index = {t: i for i, t in enumerate(self._topics)}
        self.churn = [0] * c.topics
        self.lookups = [0] * c.topics
        self.joins = [0] * c.topics
        self._subscribers = [0] * c.topics
        self._build()

    # -- setup -----------------------------------------------------------------------

    def _address(self, kind: str) -> str:
        self._counter += 1
        return f"{kind}:{self._counter}"

    def _member(self, address: str, topic: bytes) -> _Member:
        return _Member(Peer(address, self._rng.randbytes(32)), self._rng.getrandbits(64),
                       topic=topic)

    def _ring(self, member: _Member) -> Ring:
        return Ring(member, k=2, repair=5, stale=3.0)

    def _build(self) -> None:
        c = self.config
        members: list[_Member] = []
        for i in range(c.nodes):
            topic = self._topics[i % c.topics]
            address = self._address("w")
            member = self._member(address, topic)
            members.append(member)
            self.rings[address] = self._ring(member)
            self.workers[address] = self._worker(member)
        members.sort(key=lambda m: m.position)
        for i, member in enumerate(members):
            following = [members[(i + j) % len(members)] for j in range(1, 6)]
            self.rings[member.peer.address].adopt(following)
        for i, member in enumerate(members):
            for _ in range(c.pubs_per_worker):
                right = members[(i + 1) % len(members)]
                # An order that puts the pubnode in this workingnode's range.
                pub_name = self._name_in_range(member, right)
                pub = self._new_pubnode(member.topic, pub_name.order)
                owner = manager_of(pub_name, self._name(member), self._name(right))
                manager = members[i] if owner == self._name(member) else right
                pub.take_manager(self._ref(manager), 0.0)
                self.workers[manager.peer.address].on_handover(Handover((pub.me,)), 0.0)

    def _name_in_range(self, left: _Member, right: _Member) -> Name:
        if right.topic == left.topic and right.order > left.order:
            return Name(left.topic, self._rng.randrange(left.order, right.order))
        return Name(left.topic, self._rng.randrange(left.order, 1 << 64))

    @staticmethod
    def _name(member: Contact) -> Name:
        assert isinstance(member, _Member)
        return Name(member.topic, member.order)

    def _ref(self, member: Contact) -> Ref:
        return Ref(member.peer.address, self._name(member))

    def _worker(self, member: _Member) -> Workingnode:
        c = self.config
        lifetime = float(c.churnnode_lifetime) if c.adaptation == "1" else None
        worker = Workingnode(self._ref(member), churn_interval=float(c.interval),
                             churnnode_lifetime=lifetime, started=self.now)
        if c.adaptation in ("2", "2s"):
            self.views[member.peer.address] = GlobalView()
            self._phases[member.peer.address] = self._rng.randrange(c.interval)
        return worker

    def _new_pubnode(self, topic: bytes, order: int | None = None) -> Pubnode:
        address = self._address("p")
        order = self._rng.getrandbits(64) if order is None else order
        pub = Pubnode(Ref(address, Name(topic, order)),
                      first_nonce=self._rng.getrandbits(32))
        self.pubs[address] = pub
        return pub

    # -- running ---------------------------------------------------------------------

    def run(self, on_round: Callable[[int, int], None] | None = None) -> SimResult:
        """Warm up (gossip builds the levels, nothing counted), then run the rounds."""
        c = self.config
        total = c.warmup + c.rounds
        for done in range(total):
            self._counting = done >= c.warmup
            self.step(load=self._counting)
            if on_round is not None:
                on_round(done + 1, total)
        return self.result()

    def step(self, load: bool = True) -> None:
        """One round: gossip, churn, timers, adaptation, messages."""
        c = self.config
        self.now += 1.0
        self._gossip()
        if load:
            for _ in range(self._count(c.lookups)):
                self.subscribe(self._rng.randrange(c.topics))
            if c.churn != "none":
                for _ in range(self._count(c.churn_rate)):
                    pub = self.subscribe(c.churn_topic)
                    if c.churn == "subscribe-unsubscribe":
                        self._leaving.append((self.now + c.stay, pub))
        self._leave_due()
        self._expire_churnnodes()
        self._timers()
        if c.adaptation in ("2", "2s"):
            self._procedure_2()
        self._drain()

    def _count(self, rate: float) -> int:
        whole = int(rate)
        return whole + (self._rng.random() < rate - whole)

    def _alive(self, address: str) -> bool:
        return address in self.workers or address in self.churners

    # -- gossip ----------------------------------------------------------------------

    def _gossip(self) -> None:
        order = [a for a in self.rings if self._alive(a)]
        self._rng.shuffle(order)
        for address in order:
            ring = self.rings[address]
            for gossip in ring.gossip_due(self.now):
                self._deliver_gossip(address, gossip)

    def _deliver_gossip(self, address: str, gossip: Gossip, depth: int = 0) -> None:
        ring = self.rings[address]
        target = gossip.to.peer.address
        if not self._alive(target):
            again = ring.on_failure(gossip.to, gossip.level, self.now)
        else:
            answer = self.rings[target].on_gossip(ring.me, gossip.level, gossip.entries,
                                                  self.now)
            if gossip.level == 0:
                self._beacon(address, target)
            again = ring.on_answer(gossip.to, gossip.level, answer, self.now)
        if again and depth < 4:
            for follow in ring.gossip_due(self.now):
                if follow.level == 0:
                    self._deliver_gossip(address, follow, depth + 1)

    def _beacon(self, sender: str, receiver: str) -> None:
        """Level-0 gossip carries the sender's beacon right, the answer the receiver's left."""
        left = self.workers.get(sender) or self.churners[sender]
        right = self.workers.get(receiver) or self.churners[receiver]
        self._post(receiver, right.on_beacon("left", left.beacon("right"), self.now))
        self._post(sender, left.on_beacon("right", right.beacon("left"), self.now))

    # -- routing ---------------------------------------------------------------------

    def _route(self, target: int, kind: str) -> str | None:
        """Route from a random ring node to ``target``'s predecessor, counting each
        forward for the forwarding node's topic; the node reached, or ``None``."""
        alive = [a for a in self.rings if self._alive(a)]
        node = self._rng.choice(alive)
        for _ in range(256):
            ring = self.rings[node]
            ahead = ring.route(target, count=8)
            live = [c for c in ahead if self._alive(c.peer.address)]
            for dead in ahead:
                if not self._alive(dead.peer.address):
                    ring.on_failure(dead, 1, self.now)
            if not ahead:
                return node
            if not live:
                return None
            self._work(ring.me, kind)
            node = live[0].peer.address
        return None

    def _work(self, member: Contact, kind: str) -> None:
        if not self._counting:
            return
        assert isinstance(member, _Member)
        index = self._topic_index[member.topic]
        if kind == "join":
            self.joins[index] += 1
        else:
            self.lookups[index] += 1

    def _answer(self, node: str, target: Name) -> Ref | None:
        """The workingnode the lookup's last node names for ``target`` (5.3.6)."""
        worker = self.workers.get(node)
        left: Ref | None
        right: Ref | None
        if worker is not None:
            left, right = worker.me, worker.workers()[1]
        else:
            left, right = self.churners[node].workers()
        if left is None or right is None:
            return left or right
        found = manager_of(target, left.name, right.name)
        return left if found == left.name else right

    def _join(self, member: _Member) -> bool:
        """Route a join for ``member`` and put it into the ring after the node reached."""
        node = self._route(member.position, "join")
        if node is None:
            return False
        ring = self._ring(member)
        host = self.rings[node]
        ring.adopt([host.me, *host.successors])
        host.adopt([member, *host.successors])
        self.rings[member.peer.address] = ring
        return True

    # -- subscribers ---------------------------------------------------------------------

    def subscribe(self, topic_index: int) -> str:
        """A new subscriber of topic ``topic_index``; its pubnode's address."""
        topic = self._topics[topic_index]
        pub = self._new_pubnode(topic)
        if self._counting:
            self.churn[topic_index] += 1
        self._subscribers[topic_index] += 1
        for request in pub.subscribe(self.now):
            self._lookup(pub, request.nonce)
        if self._subscribers[topic_index] % self.config.worker_ratio == 0:
            member = self._member(self._address("w"), topic)
            if self._join(member):
                self.workers[member.peer.address] = self._worker(member)
                self._provided[pub.me.address] = member.peer.address
        return pub.me.address

    def unsubscribe(self, address: str) -> None:
        pub = self.pubs.pop(address, None)
        if pub is None:
            return
        if self._counting:
            self.churn[self._topic_index[pub.me.name.topic]] += 1
        self._post(address, pub.unsubscribe())
        worker = self._provided.pop(address, None)
        if worker is not None and len(self._of_topic(pub.me.name.topic)) > 1:
            self.workers.pop(worker, None)
            self.views.pop(worker, None)
            self._phases.pop(worker, None)

    def _of_topic(self, topic: bytes) -> list[str]:
        return [a for a, w in self.workers.items() if w.me.name.topic == topic]

    def _lookup(self, pub: Pubnode, nonce: int) -> None:
        node = self._route(pub.me.name.position, "lookup")
        if node is None:
            return
        manager = self._answer(node, pub.me.name)
        if manager is not None:
            self._post(pub.me.address, pub.on_lookup_result(nonce, manager, self.now))

    def _leave_due(self) -> None:
        due = [a for t, a in self._leaving if t <= self.now]
        self._leaving = [(t, a) for t, a in self._leaving if t > self.now]
        for address in due:
            self.unsubscribe(address)

    def _timers(self) -> None:
        for pub in list(self.pubs.values()):
            for request in pub.tick(self.now):
                self._lookup(pub, request.nonce)
        for address, worker in list(self.workers.items()):
            self._post(address, worker.tick(self.now))

    # -- churnnodes and workingnodes that adaptation adds ---------------------------------

    def _churnnode(self, topic: bytes, until: float) -> None:
        member = self._member(self._address("c"), topic)
        if self._join(member):
            self.churners[member.peer.address] = Churnnode(self._ref(member), until)

    def _expire_churnnodes(self) -> None:
        for address in [a for a, n in self.churners.items() if n.until <= self.now]:
            del self.churners[address]

    def _procedure_2(self) -> None:
        """Algorithm 1's timer: every workingnode every ``interval`` rounds, each at its
        own phase."""
        phase = int(self.now) % self.config.interval
        for address in [a for a, p in self._phases.items() if p == phase]:
            worker = self.workers.get(address)
            view = self.views.get(address)
            if worker is None or view is None or not worker.measured:
                continue
            ring = self.rings[address]
            for request in view.requests(ring.height - 1):
                sampled = self._sample_target(address)
                if sampled is None or not self.workers[sampled].measured:
                    continue
                other = self.workers[sampled]
                try:
                    view.on_response(GlobalView.answer(
                        SampleRequest(request.nonce), other.me.name.topic, other.churn,
                        self._size(sampled)))
                except KettenError:
                    self.dropped += 1
            left, right = worker.workers()
            topic = worker.me.name.topic
            alone = not any(w is not None and w.name.topic == topic
                            and w.address != address for w in (left, right))
            decision = view.decide(topic, worker.churn, self._size(address),
                                   self._rng.random(), alone=alone,
                                   topic_churn=self.config.adaptation == "2s")
            if decision.action == "insert":
                member = self._member(self._address("w"), topic)
                if self._join(member):
                    self.workers[member.peer.address] = self._worker(member)
                    self.inserted += 1
            elif decision.action == "leave":
                self.removed += 1
                self._post(address, worker.leave())
                del self.workers[address]
                del self.views[address]
                del self._phases[address]
                self._drain()  # the handover arrives before the next one decides

    def _sample_target(self, start: str) -> str | None:
        """A workingnode about ``x`` hops away, ``x`` uniform up to the size estimate,
        in a random direction, walking the ring's levels (5.2.4, 5.3.9)."""
        ring = self.rings[start]
        side = "right" if self._rng.random() < 0.5 else "left"
        steps = self._rng.randint(1, 2 ** ring.height)
        node = start
        while steps > 0:
            here = self.rings[node]
            level = steps.bit_length() - 1
            link = None
            while level >= 0:
                link = here.link(side, level)
                if link is not None and self._alive(link.peer.address):
                    break
                level -= 1
            if link is None or level < 0:
                break
            node = link.peer.address
            steps -= 1 << level
        if node in self.workers:
            return node if node != start else None
        if node in self.churners:
            left, right = self.churners[node].workers()
            for ref in (right, left):
                if ref is not None and ref.address in self.workers and ref.address != start:
                    return ref.address
        return None

    def _size(self, address: str) -> int:
        """This node's estimate of its topic's area (5.2.3)."""
        ring = self.rings[address]
        me = ring.me
        assert isinstance(me, _Member)
        levels: list[int | None] = []
        for side in ("right", "left"):
            best: int | None = None
            for level in range(ring.height):
                link = ring.link(side, level)
                if not isinstance(link, _Member) or link.topic != me.topic:
                    continue
                if (link.order > me.order) == (side == "right"):
                    best = level
            levels.append(best)
        return topic_size(levels)

    # -- messages ------------------------------------------------------------------------

    def _post(self, sender: str, sends: list[Send]) -> None:
        for send in sends:
            self._queue.append((sender, send))

    def _drain(self, limit: int = 1_000_000) -> None:
        while self._queue and limit > 0:
            limit -= 1
            sender, send = self._queue.popleft()
            try:
                self._dispatch(sender, send)
            except KettenError:
                self.dropped += 1

    def _dispatch(self, sender: str, send: Send) -> None:
        message, to = send.message, send.to
        worker = self.workers.get(to)
        pub = self.pubs.get(to)
        if isinstance(message, Subscribe) and worker is not None:
            self._post(to, worker.on_subscribe(message, self.now))
        elif isinstance(message, Unsubscribe) and worker is not None:
            self._post(to, worker.on_unsubscribe(message, self.now))
        elif isinstance(message, AliveAck) and worker is not None:
            worker.on_alive_ack(message, self.now)
        elif isinstance(message, Handover) and worker is not None:
            self._post(to, worker.on_handover(message, self.now))
        elif isinstance(message, Alive) and pub is not None:
            self._post(to, pub.on_alive(message, self.now))
        elif isinstance(message, Publish) and pub is not None:
            self._post(to, pub.on_publish(message, sender))
        elif isinstance(message, ProvideChurnnode) and pub is not None:
            # The subscriber's physical node brings the churnnode.
            self._churnnode(message.topic, message.until)

    def publish(self, address: str, payload: bytes) -> Publish:
        """Publish from the pubnode at ``address`` and deliver the flood."""
        pub = self.pubs[address]
        sends = pub.publish(payload)
        self._post(address, sends)
        self._drain()
        return pub.delivered[-1]

    # -- results -------------------------------------------------------------------------

    def result(self) -> SimResult:
        c = self.config
        pubnodes = [0] * c.topics
        for pub in self.pubs.values():
            pubnodes[self._topic_index[pub.me.name.topic]] += 1
        nodes = [0] * c.topics
        for address in list(self.workers) + list(self.churners):
            member = self.rings[address].me
            assert isinstance(member, _Member)
            nodes[self._topic_index[member.topic]] += 1
        loads = tuple(
            TopicLoad(f"t{i}", pubnodes[i], nodes[i], self.churn[i], self.lookups[i],
                      self.joins[i])
            for i in self._ring_order())
        return SimResult(c, loads, max_difference(load.quotient for load in loads),
                         len(self.workers), len(self.churners),
                         sum(p.resubscriptions for p in self.pubs.values()), self.dropped,
                         self.inserted, self.removed)

    def _ring_order(self) -> list[int]:
        """Topic indices in the order their areas follow each other on the ring."""
        return sorted(range(self.config.topics),
                      key=lambda i: clockwise(0, point(self._topics[i])))
