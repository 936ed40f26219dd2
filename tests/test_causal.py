"""The ``causal`` delivery: seed 001's scenarios, scope, random histories, bound, index."""

from __future__ import annotations

import itertools
import random

import attrs
import pytest

from ketten import Event, Identity, criterion_key
from ketten._core.codec import dumps
from ketten.errors import ConfigError, HoldbackFull, UsageError
from ketten.interfaces import Delivery
from ketten.plugins.causal_delivery import CausalDelivery, make_causal_delivery
from ketten.plugins.vector_clock import VectorClock


@attrs.define(eq=False)
class World:
    """Authors publishing into chains, with the truth about happened-before.

    ``past[i]`` is the bitset of the events that happened before event ``i``,
    computed from what each author had seen, never from stamp comparisons.
    Every publisher observes the head it builds on, as the replication layer does.
    """

    rng: random.Random
    authors: list[Identity] = attrs.field(factory=list)
    clocks: list[VectorClock] = attrs.field(factory=list)
    knows: list[int] = attrs.field(factory=list)
    events: list[Event] = attrs.field(factory=list)
    past: list[int] = attrs.field(factory=list)
    heads: dict[bytes, int] = attrs.field(factory=dict)

    def author(self) -> int:
        identity = Identity.from_seed(self.rng.randbytes(32))
        self.authors.append(identity)
        self.clocks.append(VectorClock(identity.public_key))
        self.knows.append(0)
        return len(self.authors) - 1

    def observe(self, who: int, index: int) -> None:
        self.clocks[who].observe(self.events[index].clock)
        self.knows[who] |= self.past[index] | (1 << index)

    def publish(self, who: int, criterion: bytes) -> Event:
        head = self.heads.get(criterion)
        if head is not None:
            self.observe(who, head)
        prev = self.events[head] if head is not None else None
        event = Event.create(
            self.authors[who],
            criterion=criterion,
            seq=prev.seq + 1 if prev is not None else 0,
            prev=prev.hash if prev is not None else None,
            payload=len(self.events).to_bytes(4, "big"),
            time=len(self.events),
            clock=self.clocks[who].stamp(),
        )
        index = len(self.events)
        self.events.append(event)
        self.past.append(self.knows[who])
        self.knows[who] |= 1 << index
        self.heads[criterion] = index
        return event

    def head_seq(self, criterion: bytes) -> int | None:
        head = self.heads.get(criterion)
        return self.events[head].seq if head is not None else None


def check_linear_extension(world: World, subscribed: set[bytes], delivered: list[Event]) -> None:
    """``delivered`` holds each subscribed event once, and every event comes after
    all subscribed events that happened before it."""
    index = {event.hash: i for i, event in enumerate(world.events)}
    mask = 0
    for i, event in enumerate(world.events):
        if event.criterion in subscribed:
            mask |= 1 << i
    done = 0
    for event in delivered:
        i = index[event.hash]
        assert not (done >> i) & 1, f"event {i} delivered twice"
        missing = world.past[i] & mask & ~done
        assert not missing, f"event {i} delivered before {missing.bit_length() - 1}"
        done |= 1 << i
    assert done == mask, "not every subscribed event was delivered"


def offer_all(delivery: Delivery, events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for event in events:
        out.extend(delivery.offer(event))
    return out


def crit(name: str) -> bytes:
    return criterion_key(name)


# -- seed 001 -------------------------------------------------------------------------


def test_satisfies_the_protocol() -> None:
    assert isinstance(CausalDelivery(criteria=[crit("a")]), Delivery)


@pytest.mark.parametrize("heads_known", [False, True])
def test_two_senders_shuffled_to_a_third_process(heads_known: bool) -> None:
    # Figure 1: A multicasts, B delivers it and multicasts; C gets them shuffled.
    world = World(random.Random(1))
    a, b = world.author(), world.author()
    xa, xb = crit("A"), crit("B")
    messages = []
    for round_ in range(4):
        messages.append(world.publish(a, xa))
        world.observe(b, len(world.events) - 1)
        messages.append(world.publish(b, xb))
        if round_ % 2:
            world.observe(a, len(world.events) - 1)
    for arrival in itertools.permutations(range(len(messages)), len(messages)):
        if random.Random(hash(arrival)).random() > 0.02:
            continue
        heads = {xa: world.head_seq(xa), xb: world.head_seq(xb)} if heads_known else {}
        delivery = make_causal_delivery({"criteria": [xa, xb], "heads": heads})
        delivered = offer_all(delivery, [messages[i] for i in arrival])
        if not heads_known:  # the subscriber learns the heads after the events
            delivered += delivery.note_head(xa, world.head_seq(xa))
            delivered += delivery.note_head(xb, world.head_seq(xb))
        check_linear_extension(world, {xa, xb}, delivered)
        assert delivery.pending() == 0


def one_after_the_other(seed: int) -> tuple[bytes, bytes, Event, Event]:
    """Criteria A and B; ``m1`` on A, then ``m2`` on B by an author who saw ``m1``."""
    world = World(random.Random(seed))
    a, b = world.author(), world.author()
    xa, xb = crit("A"), crit("B")
    m1 = world.publish(a, xa)
    world.observe(b, 0)
    m2 = world.publish(b, xb)
    return xa, xb, m1, m2


def test_b_is_held_back_until_a_arrives() -> None:
    xa, xb, m1, m2 = one_after_the_other(2)
    delivery = CausalDelivery(criteria=[xa, xb])
    assert delivery.offer(m2) == []
    assert delivery.pending() == 1
    assert delivery.offer(m1) == [m1, m2]


@pytest.mark.parametrize("split", [False, True], ids=["one-chain", "two-chains"])
@pytest.mark.parametrize("arrival", list(itertools.permutations(range(3))))
def test_locally_causal_and_concurrent(split: bool, arrival: tuple[int, ...]) -> None:
    # Figure 22 left: F1 then F2 from the same process, F3 concurrently from
    # another. F1 precedes F2 everywhere; F3 is delivered as soon as it arrives.
    world = World(random.Random(3))
    a, b = world.author(), world.author()
    x1, x2, xb = crit("A1"), crit("A2") if split else crit("A1"), crit("B")
    f1 = world.publish(a, x1)
    f3 = world.publish(b, xb)
    f2 = world.publish(a, x2)
    messages = [f1, f2, f3]
    delivery = CausalDelivery(criteria=sorted({x1, x2, xb}))
    delivered: list[Event] = []
    for i in arrival:
        out = delivery.offer(messages[i])
        if i == 2:
            assert out == [f3], "a concurrent message is never held back"
        elif i == 1 and f1 not in delivered:
            assert out == [], "F2 waits for F1"
        delivered.extend(out)
    assert [m for m in delivered if m is not f3] == [f1, f2]


# -- scope ------------------------------------------------------------------------------


def test_an_author_outside_the_subscription_never_blocks() -> None:
    world = World(random.Random(4))
    k, a, b = world.author(), world.author(), world.author()
    x, y, z = crit("x"), crit("y"), crit("z")
    for _ in range(3):
        world.publish(k, z)  # z is not subscribed
    world.publish(b, y)
    world.publish(b, y)
    world.observe(a, 2)
    e = world.publish(a, x)
    assert e.seq == 0
    # Nothing known about y yet: y could hold k's events, so e waits for y.
    delivery = CausalDelivery(criteria=[x, y])
    assert delivery.offer(e) == []
    assert delivery.note_head(y, 1) == []
    # y's first event did not happen before e, so y is clear for e.
    y0, y1 = world.events[3], world.events[4]
    assert delivery.offer(y0) == [y0, e]
    assert delivery.offer(y1) == [y1]


def test_reported_heads_release_events_with_invisible_dependencies() -> None:
    world = World(random.Random(5))
    k, a = world.author(), world.author()
    x, y, z = crit("x"), crit("y"), crit("z")
    world.publish(k, z)
    world.observe(a, 0)
    e = world.publish(a, x)
    delivery = CausalDelivery(criteria=[x, y])
    assert delivery.offer(e) == []
    assert delivery.note_head(y, None) == [e]
    assert delivery.statistics().wakeups == 1


def test_an_author_writing_inside_and_outside_does_not_deadlock() -> None:
    # k writes y, then z (not subscribed); a sees that and writes x; k sees
    # a's event and writes y again. Its second y event depends on e, e depends
    # on k's z event, which the subscriber never gets.
    world = World(random.Random(6))
    k, a = world.author(), world.author()
    x, y, z = crit("x"), crit("y"), crit("z")
    k1 = world.publish(k, y)
    world.publish(k, z)
    world.observe(a, 1)
    e = world.publish(a, x)
    world.observe(k, 2)
    k3 = world.publish(k, y)
    for arrival in itertools.permutations([k1, e, k3]):
        delivery = CausalDelivery(criteria=[x, y])
        delivered = offer_all(delivery, list(arrival))
        assert delivered == [k1, e, k3]


def test_events_of_unsubscribed_criteria_are_refused() -> None:
    world = World(random.Random(7))
    a = world.author()
    event = world.publish(a, crit("other"))
    delivery = CausalDelivery(criteria=[crit("x")])
    with pytest.raises(UsageError, match="not one this queue delivers"):
        delivery.offer(event)
    with pytest.raises(UsageError):
        delivery.note_head(crit("other"), 3)


# -- random histories -------------------------------------------------------------------


def random_world(seed: int, authors: int, criteria: int, events: int) -> tuple[World, list[bytes]]:
    rng = random.Random(seed)
    world = World(rng)
    for _ in range(authors):
        world.author()
    keys = [crit(f"c{seed}-{i}") for i in range(criteria)]
    for _ in range(events):
        who = rng.randrange(authors)
        for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
            if world.events:
                world.observe(who, rng.randrange(len(world.events)))
        # authors favour a few criteria each, so chains interleave and depend
        key = keys[(who + rng.choice((0, 0, 1, rng.randrange(criteria)))) % criteria]
        world.publish(who, key)
    return world, keys


@pytest.mark.parametrize("seed", range(6))
def test_random_history_of_20_authors_is_delivered_as_a_linear_extension(seed: int) -> None:
    world, keys = random_world(seed, authors=20, criteria=10, events=1500)
    rng = random.Random(seed)
    subscribed = keys[: 4 + seed % 4]  # the rest of the criteria stay invisible
    arrivals = [e for e in world.events if e.criterion in subscribed]
    arrivals += rng.sample(arrivals, len(arrivals) // 10)  # duplicates
    rng.shuffle(arrivals)
    delivery = make_causal_delivery({
        "criteria": subscribed,
        "heads": {key: world.head_seq(key) for key in subscribed},
    })
    delivered = offer_all(delivery, arrivals)
    check_linear_extension(world, set(subscribed), delivered)
    stats = delivery.statistics()
    assert stats.held == delivery.pending() == 0
    assert stats.delivered == len(delivered)
    assert stats.duplicates == len(arrivals) - len(delivered)
    assert stats.peak_held > 0


@pytest.mark.parametrize("seed", range(4))
def test_heads_learned_late_still_deliver_everything_in_chain_order(seed: int) -> None:
    world, keys = random_world(100 + seed, authors=20, criteria=8, events=800)
    rng = random.Random(seed)
    subscribed = keys[:5]
    arrivals = [e for e in world.events if e.criterion in subscribed]
    rng.shuffle(arrivals)
    delivery = CausalDelivery(criteria=subscribed)
    delivered: list[Event] = []
    for event in arrivals:
        delivered += delivery.offer(event)
        if rng.random() < 0.2:  # a stale notification
            delivered += delivery.note_head(event.criterion, event.seq)
    for key in subscribed:
        delivered += delivery.note_head(key, world.head_seq(key))
    assert delivery.pending() == 0
    for key in subscribed:
        chain = [e for e in world.events if e.criterion == key]
        assert [e for e in delivered if e.criterion == key] == chain


# -- bound, index, odd stamps ---------------------------------------------------------------


def test_the_holdback_is_bounded_and_refusals_change_nothing() -> None:
    world, keys = random_world(42, authors=5, criteria=3, events=200)
    arrivals = list(reversed(world.events))
    delivery = make_causal_delivery({
        "criteria": keys, "max_held": 10,
        "heads": {key: world.head_seq(key) for key in keys},
    })
    refused: list[Event] = []
    delivered: list[Event] = []
    for event in arrivals:
        try:
            delivered += delivery.offer(event)
        except HoldbackFull as exc:
            assert exc.limit == 10
            refused.append(event)
        assert delivery.pending() <= 10
    assert refused
    stats = delivery.statistics()
    assert stats.refused == len(refused)
    assert stats.peak_held == 10
    while refused:  # the subscriber offers refused events again later
        retry, refused = refused, []
        for event in reversed(retry):
            try:
                delivered += delivery.offer(event)
            except HoldbackFull:
                refused.append(event)
    check_linear_extension(world, set(keys), delivered)


def test_an_event_is_woken_only_by_the_position_it_waits_for() -> None:
    world = World(random.Random(8))
    source = world.author()
    waiting_authors = [world.author() for _ in range(10)]
    x = crit("x")
    ys = [crit(f"y{i}") for i in range(10)]
    sources = [world.publish(source, x) for _ in range(10)]
    dependents = []
    for i, who in enumerate(waiting_authors):
        world.observe(who, i)
        dependents.append(world.publish(who, ys[i]))
    heads = {y: 0 for y in ys} | {x: 9}
    delivery = CausalDelivery(criteria=[x, *ys], heads=heads)
    for event in dependents:
        assert delivery.offer(event) == []
    for event in reversed(sources[1:]):  # arrivals out of order wake nobody
        assert delivery.offer(event) == []
    assert delivery.statistics().wakeups == 0
    delivered = delivery.offer(sources[0])
    expected = [e for pair in zip(sources, dependents) for e in pair]
    assert delivered == expected
    # dependent i waits behind i + 1 positions of x and is woken once for each
    assert delivery.statistics().wakeups == sum(range(1, 11))
    assert delivery.pending() == 0


def test_unstamped_events_follow_their_chain_only() -> None:
    rng = random.Random(9)
    alice = Identity.from_seed(rng.randbytes(32))
    x, y = crit("x"), crit("y")
    stamps = [b"", b"\xff", dumps({b"\x01" * 32: 1})]  # empty, garbage, not naming alice
    events = []
    prev = None
    for seq, stamp in enumerate(stamps):
        prev = Event.create(alice, criterion=x, seq=seq, prev=prev.hash if prev else None,
                            payload=b"", time=0, clock=stamp)
        events.append(prev)
    delivery = CausalDelivery(criteria=[x, y])
    assert delivery.offer(events[2]) == []
    assert offer_all(delivery, events[:2]) == events
    assert delivery.statistics().unstamped == 3


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({}, "criteria"),
        ({"criteria": []}, "at least one"),
        ({"criteria": [b"x" * 32], "heads": {b"x" * 32: -2}}, "heads"),
        ({"criteria": [b"x" * 32], "max_authors": 0}, "max_authors"),
        ({"criteria": [b"x" * 32], "order": "fifo"}, "order"),
    ],
)
def test_bad_options_are_config_errors(options: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_causal_delivery(options)


def test_a_forgotten_head_makes_later_events_wait_and_names_what_they_wait_for() -> None:
    # y's first event was published after x's first; the head noted for x (empty)
    # predates both. Once it is forgotten, the y event waits for x seq 0.
    x, y, x0, y0 = one_after_the_other(7)
    delivery = CausalDelivery(criteria=[x, y])
    assert delivery.note_head(x, None) == [] and delivery.blocked() == []
    delivery.forget_head(x)
    assert delivery.offer(y0) == []
    assert delivery.blocked() == [(x, 0)] and delivery.pending() == 1
    assert delivery.offer(x0) == [x0, y0]
    assert delivery.blocked() == [] and delivery.pending() == 0
    with pytest.raises(UsageError):
        delivery.forget_head(crit("z"))
