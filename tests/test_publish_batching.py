"""Offers made to one broker in the same scheduler pass travel in one ``offers`` request."""

from __future__ import annotations

import attrs
import pluggy
import pytest
import trio
import trio.testing
from test_replication import cluster

from ketten import Event, criterion_key
from ketten._offers import MAX_BATCH_OFFERS
from ketten.errors import RemoteError


async def test_concurrent_publishes_share_offer_requests(
    plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster(plugins, 5) as c:
        publisher = c.nodes[0]
        keys = [criterion_key(f"batch{i}") for i in range(40)]
        remote_offers = sum(1 for key in keys for i in c.brokers(key) if i != 0)
        sent_before = publisher.transport.statistics().requests_sent
        published: dict[bytes, Event] = {}

        async def publish(key: bytes) -> None:
            published[key] = await publisher.publish(key, b"x" + key[:4])

        async with trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(publish, key)
        requests = publisher.transport.statistics().requests_sent - sent_before
        # Without batching every remote offer would be a request of its own.
        assert remote_offers >= 60
        assert requests <= 4 * len(c.nodes)
        for key in keys:
            assert await c.settle(key) == [published[key]]


async def test_a_batch_is_answered_offer_by_offer_in_order(
    plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster(plugins, 3) as c:
        key = criterion_key("answers")
        first = await c.nodes[0].publish(key, b"first")
        await c.settle(key)
        sender, broker = c.nodes[1], c.nodes[2]
        author = sender.identity
        fresh = Event.create(author, criterion=criterion_key("fresh"), seq=0, prev=None,
                             payload=b"new", time=1)
        stale = Event.create(author, criterion=key, seq=0, prev=None, payload=b"late", time=2)
        forged = Event.from_bytes(attrs.evolve(
            Event.create(author, criterion=criterion_key("forged"), seq=0, prev=None,
                         payload=b"mine", time=3), payload=b"changed").to_bytes())
        offers = [{"e": e.to_bytes(), "r": 3, "k": None} for e in (fresh, stale, forged, first)]
        reply = await sender.call(broker.address, "offers", {"o": offers})
        answers = reply["a"]
        assert [a["s"] for a in answers] == ["ack", "stale", "invalid", "ack"]
        assert Event.from_bytes(answers[1]["e"]) == first
        assert answers[2]["r"] == "bad-signature"
        assert await broker.store.range(criterion_key("fresh")) == [fresh]
        assert await broker.store.range(criterion_key("forged")) == []


@pytest.mark.parametrize("case", ["garbage", "wrong-replication", "empty", "too-many"])
async def test_a_malformed_batch_is_refused_whole(
    plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock, case: str
) -> None:
    async with cluster(plugins, 3) as c:
        sender, broker = c.nodes[1], c.nodes[2]
        good = Event.create(sender.identity, criterion=criterion_key("whole"), seq=0,
                            prev=None, payload=b"ok", time=1)
        valid = {"e": good.to_bytes(), "r": 3, "k": None}
        offers = {
            "garbage": [valid, {"e": b"\xff\x00 not an event", "r": 3, "k": None}],
            "wrong-replication": [valid, {"e": good.to_bytes(), "r": 5, "k": None}],
            "empty": [],
            "too-many": [valid] * (MAX_BATCH_OFFERS + 1),
        }[case]
        with pytest.raises(RemoteError) as caught:
            await sender.call(broker.address, "offers", {"o": offers})
        assert "offers" in str(caught.value)
        assert await broker.store.range(criterion_key("whole")) == []
        assert broker.statistics().requests_refused >= 1


async def test_an_offer_ahead_of_its_predecessor_waits_for_it_instead_of_syncing(
    plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster(plugins, 3) as c:
        sender, broker = c.nodes[1], c.nodes[2]
        key = criterion_key("ordered")
        first = Event.create(sender.identity, criterion=key, seq=0, prev=None,
                             payload=b"0", time=1)
        second = Event.create(sender.identity, criterion=key, seq=1, prev=first.hash,
                              payload=b"1", time=2)
        syncs_before = broker.replication_statistics().syncs
        answers: dict[int, str] = {}

        async def offer(event: Event) -> None:
            reply = await sender.call(broker.address, "offers",
                                      {"o": [{"e": event.to_bytes(), "r": 3, "k": None}]})
            answers[event.seq] = reply["a"][0]["s"]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(offer, second)
            await trio.sleep(0.01)  # the second offer now waits at the gap
            nursery.start_soon(offer, first)
        assert answers == {0: "ack", 1: "ack"}
        assert await broker.store.range(key) == [first, second]
        assert broker.replication_statistics().syncs == syncs_before


async def test_an_offer_whose_predecessor_does_not_come_syncs_after_a_moment(
    plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock
) -> None:
    async with cluster(plugins, 3) as c:
        key = criterion_key("behind")
        brokers = c.brokers(key)
        lagging = c.nodes[brokers[2]]
        c.cut(brokers[2])
        for i in range(3):
            await c.nodes[brokers[0]].publish(key, b"%d" % i)
        c.heal()
        head = (await c.chain(brokers[0], key))[-1]
        nxt = Event.create(c.nodes[brokers[0]].identity, criterion=key, seq=3, prev=head.hash,
                           payload=b"3", time=9)
        syncs_before = lagging.replication_statistics().syncs
        began = trio.current_time()
        reply = await c.nodes[brokers[0]].call(
            lagging.address, "offers", {"o": [{"e": nxt.to_bytes(), "r": 3, "k": None}]})
        assert reply["a"][0]["s"] == "ack"
        assert lagging.replication_statistics().syncs > syncs_before
        assert trio.current_time() - began >= 0.05
        assert [e.seq for e in await lagging.store.range(key)] == [0, 1, 2, 3]
