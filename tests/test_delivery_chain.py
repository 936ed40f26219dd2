"""The ``chain`` delivery: per-criterion chain order, exactly once, bounded."""

from __future__ import annotations

import random

import pytest

from ketten import Event, Identity, criterion_key
from ketten.errors import ConfigError, HoldbackFull, UsageError
from ketten.interfaces import Delivery
from ketten.plugins.chain_delivery import ChainDelivery, make_chain_delivery

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)


def chain(criterion: bytes, length: int, *, payload: bytes = b"") -> list[Event]:
    events: list[Event] = []
    for seq in range(length):
        events.append(
            Event.create(
                ALICE if seq % 2 else BOB,
                criterion=criterion,
                seq=seq,
                prev=events[-1].hash if events else None,
                payload=payload + seq.to_bytes(4, "big"),
                time=seq,
            )
        )
    return events


X = criterion_key("x")
Y = criterion_key("y")


def offer_all(delivery: Delivery, events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for event in events:
        out.extend(delivery.offer(event))
    return out


def test_satisfies_the_protocol() -> None:
    assert isinstance(ChainDelivery(), Delivery)


def test_in_order_events_pass_straight_through() -> None:
    delivery = ChainDelivery()
    events = chain(X, 5)
    for event in events:
        assert delivery.offer(event) == [event]
    assert delivery.pending() == 0


def test_a_late_event_releases_the_run_behind_it() -> None:
    delivery = ChainDelivery()
    events = chain(X, 6)
    for event in reversed(events[1:]):
        assert delivery.offer(event) == []
    assert delivery.pending() == 5
    assert delivery.offer(events[0]) == events
    stats = delivery.statistics()
    assert (stats.delivered, stats.held, stats.peak_held) == (6, 0, 5)


@pytest.mark.parametrize("seed", range(5))
def test_shuffled_duplicated_criteria_come_out_in_chain_order(seed: int) -> None:
    rng = random.Random(seed)
    xs, ys = chain(X, 40), chain(Y, 30)
    arrivals = xs + ys + rng.sample(xs, 10) + rng.sample(ys, 10)
    rng.shuffle(arrivals)
    delivery = ChainDelivery()
    out = offer_all(delivery, arrivals)
    assert [e for e in out if e.criterion == X] == xs
    assert [e for e in out if e.criterion == Y] == ys
    stats = delivery.statistics()
    assert (stats.offered, stats.delivered, stats.duplicates, stats.held) == (90, 70, 20, 0)


def test_start_skips_what_was_already_delivered() -> None:
    events = chain(X, 5)
    delivery = ChainDelivery(start={X: 3})
    assert offer_all(delivery, events) == events[3:]
    assert delivery.statistics().duplicates == 3
    assert delivery.next_seq(X) == 5
    assert delivery.next_seq(Y) == 0


def test_skip_drops_what_is_held_before_it_and_releases_the_run_after() -> None:
    events = chain(X, 10)
    delivery = ChainDelivery()
    assert offer_all(delivery, [events[0], events[2], events[5], events[6], events[8]]) == \
        [events[0]]
    assert delivery.pending() == 4
    assert delivery.skip(X, 5) == events[5:7]
    assert delivery.pending() == 1 and delivery.next_seq(X) == 7
    assert delivery.skip(X, 3) == []  # behind the next seq: nothing changes
    assert delivery.offer(events[4]) == []  # given up: never delivered
    assert offer_all(delivery, events[7:]) == events[7:]
    assert delivery.skip(Y, 4) == [] and delivery.next_seq(Y) == 4
    with pytest.raises(UsageError):
        ChainDelivery(criteria=frozenset([X])).skip(Y, 1)


def test_other_criteria_are_refused_when_restricted() -> None:
    delivery = make_chain_delivery({"criteria": [X]})
    with pytest.raises(UsageError, match="not one this queue delivers"):
        delivery.offer(chain(Y, 1)[0])


def test_a_fork_in_the_holdback_is_counted_and_the_first_kept() -> None:
    events = chain(X, 3)
    fork = chain(X, 3, payload=b"fork")
    delivery = ChainDelivery()
    delivery.offer(events[2])
    assert delivery.offer(fork[2]) == []
    assert delivery.statistics().conflicts == 1
    assert offer_all(delivery, events[:2]) == events


def test_the_holdback_is_bounded() -> None:
    events = chain(X, 6)
    delivery = ChainDelivery(max_held=2)
    delivery.offer(events[2])
    delivery.offer(events[3])
    with pytest.raises(HoldbackFull, match="refused seq 4") as info:
        delivery.offer(events[4])
    assert (info.value.seq, info.value.limit) == (4, 2)
    assert delivery.pending() == 2
    assert delivery.statistics().refused == 1
    # the next event is always taken, and after it the refused one fits
    assert delivery.offer(events[0]) == [events[0]]
    assert offer_all(delivery, [events[1], events[4], events[5]]) == events[1:]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"criteria": b"x" * 32}, "iterable"),
        ({"criteria": [b"short"]}, "32-byte"),
        ({"criteria": [X, X]}, "twice"),
        ({"start": {X: -1}}, "start"),
        ({"start": [X]}, "start"),
        ({"max_held": 0}, "max_held"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_options_are_config_errors(options: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_chain_delivery(options)
