"""``check_delivery``: the conformance suite for delivery plugins."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._core.event import Event
from .._core.identity import Identity, criterion_key
from ..interfaces import Delivery

__all__ = ["DeliveryFactory", "check_delivery"]

DeliveryFactory = Callable[[Mapping[str, Any]], Delivery]
"""Builds the delivery under test from options (``criteria``, ``start``)."""


def _fail(part: str, message: str) -> None:
    raise AssertionError(f"check_delivery [{part}]: {message}")


def _chains(count: int, length: int, *, clock: Callable[[int, int], bytes] | None = None,
            ) -> dict[bytes, list[Event]]:
    authors = [Identity.from_seed(bytes([i + 90]) * 32) for i in range(count)]
    out: dict[bytes, list[Event]] = {}
    for index, author in enumerate(authors):
        key = criterion_key(f"check-delivery-{index}")
        events: list[Event] = []
        for seq in range(length):
            events.append(Event.create(
                author, criterion=key, seq=seq, prev=events[-1].hash if events else None,
                payload=b"%d:%d" % (index, seq), time=seq,
                clock=clock(index, seq) if clock is not None else b""))
        out[key] = events
    return out


def _drain(delivery: Delivery, offers: Sequence[Event], part: str) -> list[Event]:
    out: list[Event] = []
    for event in offers:
        got = delivery.offer(event)
        if not isinstance(got, list) or not all(isinstance(e, Event) for e in got):
            _fail(part, f"offer() must return a list of events, got {got!r:.80}")
        out.extend(got)
    note = getattr(delivery, "note_head", None)
    if callable(note):
        for key in sorted({e.criterion for e in offers}):
            top = max(e.seq for e in offers if e.criterion == key)
            out.extend(note(key, top))
    return out


def check_delivery(factory: DeliveryFactory, *, seed: int = 0,
                   clock: Callable[[int, int], bytes] | None = None) -> None:
    """Check a delivery plugin against what the subscription layer relies on.

    ``factory(options)`` builds a fresh delivery; the options hold
    ``criteria`` (the subscribed keys) and ``start`` (``{key: first seq}``).
    ``clock(author_index, seq)`` stamps the test events, for a delivery that
    orders by clocks (default: no stamps). Raises :class:`AssertionError`
    naming the part that failed:

    * ``order`` - offered in chain order, every event is delivered once, each
      criterion in chain order, and ``pending()`` is 0 afterwards;
    * ``shuffled`` - offered in any order, with duplicates, each event is still
      delivered exactly once and each criterion in chain order, and
      ``pending()`` counts what waits;
    * ``start`` - events before a criterion's ``start`` are never delivered.

    Call it from your own tests::

        def test_my_delivery_conforms():
            ketten.testing.check_delivery(lambda options: MyDelivery(**options))
    """
    chains = _chains(3, 12, clock=clock)
    keys = tuple(sorted(chains))
    everything = [e for key in keys for e in chains[key]]

    def check(delivered: list[Event], expected: list[Event], part: str) -> None:
        hashes = [e.hash for e in delivered]
        if len(set(hashes)) != len(hashes):
            _fail(part, "an event was delivered twice")
        if set(hashes) != {e.hash for e in expected}:
            missing = len({e.hash for e in expected} - set(hashes))
            _fail(part, f"{missing} event(s) never delivered, or foreign ones delivered")
        for key in keys:
            seqs = [e.seq for e in delivered if e.criterion == key]
            if seqs != sorted(seqs):
                _fail(part, f"criterion {key.hex()[:12]} delivered out of chain order: {seqs}")

    # In chain order, criterion by criterion interleaved.
    delivery = factory({"criteria": keys, "start": dict.fromkeys(keys, 0)})
    interleaved = [chains[key][i] for i in range(12) for key in keys]
    got = _drain(delivery, interleaved, "order")
    check(got, everything, "order")
    if delivery.pending() != 0:
        _fail("order", f"pending() is {delivery.pending()} after everything was delivered")

    # Any order, with duplicates.
    rng = random.Random(seed)
    offers = everything + rng.sample(everything, len(everything) // 3)
    rng.shuffle(offers)
    delivery = factory({"criteria": keys, "start": dict.fromkeys(keys, 0)})
    out: list[Event] = []
    for event in offers:
        out.extend(delivery.offer(event))
        waiting = delivery.pending()
        if not isinstance(waiting, int) or waiting < 0:
            _fail("shuffled", f"pending() must be a count, got {waiting!r}")
    note = getattr(delivery, "note_head", None)
    if callable(note):
        for key in keys:
            out.extend(note(key, 11))
    check(out, everything, "shuffled")
    if delivery.pending() != 0:
        _fail("shuffled", f"pending() is {delivery.pending()} after everything was delivered")

    # Resuming from a start position.
    start = {keys[0]: 5, keys[1]: 0, keys[2]: 11}
    delivery = factory({"criteria": keys, "start": start})
    resumed = [e for e in everything if e.seq >= start[e.criterion]]
    got = _drain(delivery, [e for e in interleaved if e.seq >= start[e.criterion]], "start")
    if any(e.seq < start[e.criterion] for e in got):
        _fail("start", "an event before the start position was delivered")
    check(got, resumed, "start")
