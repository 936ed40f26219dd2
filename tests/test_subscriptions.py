"""Push and durable subscriptions on simulated clusters (memory network, virtual time)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pluggy
import pytest
import trio
from test_replication import Cluster

from ketten import Event, Node, criterion_key
from ketten._core.leases import CursorState, Lease, LeaseTable, confirmed_seq
from ketten.adapters.memory import Faults, MemoryNetwork
from ketten.errors import (
    ConfigError,
    DecodeError,
    DependencyUnavailable,
    EventsDropped,
    KettenError,
    StoreCorrupted,
    UsageError,
)


@asynccontextmanager
async def sub_cluster(plugins: pluggy.PluginManager, count: int, *, seed: int = 0,
                      faults: Faults | None = None, clock: str | None = None,
                      subscriptions: dict[str, Any] | None = None) -> AsyncIterator[Cluster]:
    net = MemoryNetwork(seed=seed, faults=faults or Faults())
    async with trio.open_nursery() as nursery:
        c = Cluster(nursery, plugins, net, seed=seed)
        for index in range(count):
            base = c.config(index)
            options = {**base.options, "subscriptions": subscriptions or {"ttl": 9.0}}
            await c.start(index, options=options, clock=clock)
        await trio.sleep(2.0)
        yield c
        nursery.cancel_scope.cancel()


def two_criteria(c: Cluster) -> tuple[str, str, int]:
    """Two criterion names and a node that brokers neither."""
    for n in range(100):
        x, y = f"x{n}", f"y{n}"
        common = [i for i in c.others(criterion_key(x)) if i in c.others(criterion_key(y))]
        if common:
            return x, y, common[0]
    raise AssertionError("no node outside both replica sets")


def outsider(c: Cluster, key: bytes) -> int:
    """A running node that is not a broker of ``key``."""
    return c.others(key)[-1]


def reader_and_writers(c: Cluster, readers: list[int]) -> tuple[int, list[int], Node]:
    """The first of ``readers`` and the two lowest other nodes, to write."""
    index = readers[0]
    return index, [i for i in sorted(c.nodes) if i != index][:2], c.nodes[index]


async def publish(node: Node, key: bytes, payload: bytes, command: int) -> Event:
    """Publish until acknowledged (same command id, so at most once in the chain)."""
    while True:
        try:
            return await node.publish(key, payload, command=command, deadline=5.0)
        except KettenError:
            await trio.sleep(0.5)


async def published(c: Cluster, name: str, count: int) -> tuple[bytes, int]:
    """Publish ``count`` events (payloads 0, 1, ...) on ``name``; its key and a node that
    is not one of its brokers."""
    key = criterion_key(name)
    for n in range(count):
        await publish(c.nodes[0], key, b"%d" % n, n)
    return key, outsider(c, key)


async def collect(sub: Any, count: int, into: list[Event]) -> None:
    async for event in sub:
        into.append(event)
        if len(into) == count:
            return


# -- sans-IO parts -------------------------------------------------------------


def lease(sid: bytes, version: int, expires: int, live: bool = True) -> Lease:
    return Lease(sid, b"\1" * 32, "n:9", version, expires, live)


def test_lease_table_is_last_writer_wins_and_expires() -> None:
    key = criterion_key("t")
    table = LeaseTable()
    assert table.put(key, lease(b"a" * 16, 5, 100), now=0) == "new"
    assert table.put(key, lease(b"a" * 16, 4, 200), now=0) is None
    assert table.put(key, lease(b"a" * 16, 6, 200), now=0) == "renewed"
    assert [x.expires for x in table.live(key, now=150)] == [200]
    assert table.put(key, lease(b"a" * 16, 7, 300, live=False), now=0) == "new"
    assert table.live(key, now=150) == [] and len(table) == 1
    copy = LeaseTable.decode(table.encode())
    assert copy.entries(key) == table.entries(key)
    assert table.expire(now=300) and len(table) == 0 and table.criteria() == []
    assert table.put(key, lease(b"b" * 16, 1, 10), now=10) is None


def test_lease_table_merge_converges_in_any_order() -> None:
    key = criterion_key("m")
    updates = [lease(b"a" * 16, v, 1000 + v, live=v % 3 != 0) for v in range(1, 10)]
    forward, backward = LeaseTable(), LeaseTable()
    forward.merge(key, updates, now=0)
    backward.merge(key, list(reversed(updates)), now=0)
    assert forward.entries(key) == backward.entries(key) == [updates[-1]]


def test_lease_table_bound_and_bad_bytes() -> None:
    table = LeaseTable(max_leases=1)
    key = criterion_key("b")
    table.put(key, lease(b"a" * 16, 1, 10), now=0)
    assert table.put(key, lease(b"b" * 16, 1, 10), now=0) is None and table.refused == 1
    with pytest.raises(DecodeError):
        LeaseTable.decode(b"\xa1\x41x\x80")
    with pytest.raises(DecodeError):
        Lease.decode([b"short", b"\1" * 32, "a", 1, 1, True], where="test")


def test_one_subscriber_holds_a_bounded_share_and_cannot_take_others_leases() -> None:
    table = LeaseTable(max_leases=100, max_per_subscriber=3, max_per_chain=3)
    key = criterion_key("share")
    greedy = [Lease(bytes([i]) * 16, b"\2" * 32, "n:2", 1, 50) for i in range(10)]
    assert [table.put(key, x, now=0) for x in greedy] == ["new"] * 3 + [None] * 7
    assert table.refused == 7
    honest = lease(b"h" * 16, 1, 50)
    assert table.put(key, honest, now=0) == "new"
    # Another key may not renew, move or drop the honest subscription.
    stolen = Lease(b"h" * 16, b"\2" * 32, "n:2", 9, 60, live=False)
    assert table.put(key, stolen, now=0) is None and table.refused == 8
    assert table.live(key, now=10)[-1] == honest
    # Expired entries give the subscriber its share back (also after a reload).
    assert table.expire(now=50) and len(table) == 0
    again = LeaseTable.decode(table.encode(), max_per_subscriber=3)
    later = [attrs.evolve(x, version=2, expires=100) for x in greedy[:4]]
    assert [again.put(key, x, now=60) for x in later] == ["new"] * 3 + [None]
    # On one criterion a subscriber holds at most max_per_chain entries.
    narrow = LeaseTable(max_per_chain=2)
    assert [narrow.put(key, x, now=0) for x in greedy[:3]] == ["new", "new", None]
    assert narrow.put(criterion_key("other"), greedy[2], now=0) == "new"
    assert narrow.expire(now=50) and narrow.put(key, later[0], now=60) == "new"


def test_confirmed_seq_needs_a_majority() -> None:
    assert confirmed_seq([5, 3, 9], 2) == 5
    assert confirmed_seq([5], 2) is None
    assert confirmed_seq([-1, -1], 2) == -1


def test_cursor_state_round_trip() -> None:
    keys = [criterion_key("x"), criterion_key("y")]
    state = CursorState.fresh(keys).advance(keys[1], 0, b"\7" * 32)
    again = CursorState.decode(state.encode(), where="t")
    assert again == state and again.next == {keys[0]: 0, keys[1]: 1} and again.delivered == 1
    with pytest.raises(DecodeError):
        CursorState.decode(b"\xa1\x61v\x02", where="t")


# -- push subscriptions --------------------------------------------------------


async def test_push_subscription_end_to_end_under_loss(plugins, autojump_clock) -> None:
    faults = Faults(latency=0.005, jitter=0.005, loss=0.10, duplicate=0.05, reorder=0.1)
    async with sub_cluster(plugins, 6, seed=11, faults=faults) as c:
        key = criterion_key("push")
        reader = c.nodes[outsider(c, key)]
        got: list[Event] = []
        async with reader.subscribe("push") as sub:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect, sub, 30, got)
                for n in range(30):
                    await publish(c.nodes[0], key, b"e%d" % n, n)
            with trio.fail_after(60):
                while len(got) < 30:
                    await trio.sleep(0.1)
            stats = sub.statistics()
        chain = await c.settle(key)
        assert [e.hash for e in got] == [e.hash for e in chain]
        assert [e.payload for e in got] == [b"e%d" % n for n in range(30)]
        assert stats.notified > 0 and stats.stored > 0
        await trio.sleep(1.0)
        for i in c.brokers(key):
            assert c.nodes[i]._feeds.live_leases(key) == []


async def test_a_lost_notification_is_healed_by_the_gap(plugins, autojump_clock) -> None:
    async with sub_cluster(plugins, 5, subscriptions={"ttl": 300.0}) as c:
        key = criterion_key("gap")
        index = outsider(c, key)
        reader = c.nodes[index]
        async with reader.subscribe(key) as sub:
            await publish(c.nodes[0], key, b"a", 1)
            assert (await sub.__anext__()).payload == b"a"
            c.cut(index)
            await publish(c.nodes[0], key, b"b", 2)
            c.heal()
            await publish(c.nodes[0], key, b"c", 3)
            with trio.fail_after(5):
                assert [(await sub.__anext__()).payload for _ in range(2)] == [b"b", b"c"]


async def test_the_last_event_of_a_burst_arrives_by_the_head_check(plugins,
                                                                   autojump_clock) -> None:
    async with sub_cluster(plugins, 5, subscriptions={"ttl": 30.0, "check": 3.0}) as c:
        key = criterion_key("burst")
        index = outsider(c, key)
        reader = c.nodes[index]
        async with reader.subscribe(key) as sub:
            for n in range(3):
                await publish(c.nodes[0], key, b"%d" % n, n)
            c.cut(index)
            await publish(c.nodes[0], key, b"last", 9)
            c.heal()
            started = trio.current_time()
            with trio.fail_after(10):
                got = [(await sub.__anext__()).payload for _ in range(4)]
            assert got == [b"0", b"1", b"2", b"last"]
            assert trio.current_time() - started <= 3.0 * 1.25 + 2.0


async def test_causal_delivery_across_two_criteria(plugins, autojump_clock) -> None:
    async with sub_cluster(plugins, 6, clock="vector",
                           subscriptions={"ttl": 300.0}) as c:
        xn, yn, index = two_criteria(c)
        x, y = criterion_key(xn), criterion_key(yn)
        writers = [i for i in sorted(c.nodes) if i != index][:2]
        reader = c.nodes[index]
        async with reader.subscribe([xn, yn], delivery="causal") as sub:
            await publish(c.nodes[writers[0]], x, b"x0", 1)
            await publish(c.nodes[writers[1]], y, b"y0", 1)
            with trio.fail_after(10):
                first = [(await sub.__anext__()).payload for _ in range(2)]
            assert sorted(first) == [b"x0", b"y0"]
            # x1 happens before y1 (the second writer reads it first), but the
            # reader misses the notification of x1 and receives y1's first.
            c.cut(index)
            await publish(c.nodes[writers[0]], x, b"x1", 2)
            c.heal()
            await c.nodes[writers[1]].read(x)
            await publish(c.nodes[writers[1]], y, b"y1", 2)
            with trio.fail_after(10):
                second = [(await sub.__anext__()).payload for _ in range(2)]
            assert second == [b"x1", b"y1"]


async def test_chain_delivery_does_not_wait_across_criteria(plugins, autojump_clock) -> None:
    async with sub_cluster(plugins, 7, clock="vector", subscriptions={"ttl": 300.0}) as c:
        for n in range(200):
            xn, yn = f"x{n}", f"y{n}"
            x, y = criterion_key(xn), criterion_key(yn)
            only_y = [i for i in c.brokers(y) if i not in c.brokers(x)]
            readers = [i for i in c.others(x) if i in c.others(y)]
            if only_y and readers:
                break
        index, writers, reader = reader_and_writers(c, readers)
        async with reader.subscribe([xn, yn], delivery="chain") as sub:
            await trio.sleep(1.0)
            assert all(c.nodes[i]._feeds.live_leases(y) for i in c.brokers(y))
            # The reader cannot reach x's brokers: x0 cannot reach it at all.
            c.network.cut([f"n:{index}"], [f"n:{i}" for i in c.brokers(x)])
            await publish(c.nodes[writers[0]], x, b"x0", 1)
            await c.nodes[writers[1]].read(x)
            await publish(c.nodes[writers[1]], y, b"y0", 1)  # causally after x0
            with trio.fail_after(5):
                assert (await sub.__anext__()).payload == b"y0"
            c.heal()
            # The lost notification is made up by the next renewal (every ttl / 3).
            with trio.fail_after(300.0 / 3 * 1.25 + 10):
                assert (await sub.__anext__()).payload == b"x0"


async def test_bad_criteria_are_usage_errors(plugins, autojump_clock) -> None:
    async with sub_cluster(plugins, 3) as c:
        node = c.nodes[0]
        for bad in ([], [b"short"], ["a", "a"], [3]):
            with pytest.raises(UsageError):
                async with node.subscribe(bad):
                    pass
        with pytest.raises(UsageError):
            await node.durable_subscription("", "a")
        with pytest.raises(UsageError):
            async with node.subscribe("a", start=-1):
                pass
        with pytest.raises(UsageError, match=r"'latest'.*got 'newest'"):
            async with node.subscribe("a", start="newest"):
                pass


async def test_start_latest_and_earliest_as_kafka_names_them(plugins, autojump_clock) -> None:
    async with sub_cluster(plugins, 4) as c:
        key, index = await published(c, "ends", 3)
        node = c.nodes[index]
        got: dict[str, list[int]] = {"latest": [], "earliest": []}
        async with node.subscribe("ends", start="latest") as latest, \
                node.subscribe("ends", start="earliest") as earliest:
            await publish(node, key, b"after", 3)
            with trio.fail_after(30):
                async for event in latest:
                    got["latest"].append(event.seq)
                    break
                async for event in earliest:
                    got["earliest"].append(event.seq)
                    if event.seq == 3:
                        break
        assert got == {"latest": [3], "earliest": [0, 1, 2, 3]}


# -- durable subscriptions in simulation -----------------------------------


async def test_durable_subscription_resumes_and_unsubscribes(plugins, autojump_clock) -> None:
    async with sub_cluster(plugins, 5, subscriptions={"ttl": 6.0}) as c:
        key, index = await published(c, "durable", 5)
        sub = await c.nodes[index].durable_subscription("d", ["durable"])
        assert (await sub.get()).payload == b"0"
        with pytest.raises(RuntimeError):
            async with sub.next() as event:
                assert event.payload == b"1"
                raise RuntimeError("processing failed")
        async with sub.next() as event:
            assert event.payload == b"1"
        await sub.aclose()
        await c.stop(index)
        await c.start(index, options={**c.config(index).options,
                                      "subscriptions": {"ttl": 6.0}})
        again = await c.nodes[index].durable_subscription("d", ["durable"])
        assert again.position == {key: 2} and again.delivered == 2
        assert [(await again.get()).payload for _ in range(3)] == [b"2", b"3", b"4"]
        with pytest.raises(UsageError):
            await c.nodes[index].durable_subscription("d", ["other"])
        await trio.sleep(1.0)
        assert all(c.nodes[i]._feeds.live_leases(key) for i in c.brokers(key))
        await again.unsubscribe()
        with pytest.raises(UsageError):
            await again.get()
        await trio.sleep(3.0)
        assert not any(c.nodes[i]._feeds.live_leases(key) for i in c.brokers(key))
        await trio.sleep(10.0)
        assert not any(c.nodes[i]._feeds.entries(key) for i in c.brokers(key))
        fresh = await c.nodes[index].durable_subscription("d", ["durable"])
        assert fresh.position == {key: 0}


async def restart(c: Cluster, index: int) -> Node:
    await c.stop(index)
    return await c.start(index, options={**c.config(index).options, "subscriptions": {"ttl": 6.0}})


async def test_get_acknowledges_by_the_next_get_so_a_crash_repeats_only_that_event(
        plugins, autojump_clock) -> None:
    async with sub_cluster(plugins, 5, subscriptions={"ttl": 6.0}) as c:
        key, index = await published(c, "acked", 4)
        sub = await c.nodes[index].durable_subscription("a", ["acked"])
        first = await sub.get()
        assert first.payload == b"0" and sub.pending == first and sub.position == {key: 0}
        assert (await sub.get()).payload == b"1"
        assert sub.position == {key: 1} and sub.delivered == 1
        node = await restart(c, index)  # a crash: event 1 was returned, never acknowledged
        again = await node.durable_subscription("a", ["acked"])
        assert again.position == {key: 1} and again.pending is None
        assert (await again.get()).payload == b"1"
        await again.ack()
        await again.ack()  # nothing pending: a no-op
        assert again.position == {key: 2} and again.pending is None
        await again.aclose()
        node = await restart(c, index)
        third = await node.durable_subscription("a", ["acked"])
        assert [(await third.get()).payload for _ in range(2)] == [b"2", b"3"]
        assert third.delivered == 3


async def test_cursor_in_the_applications_transaction_commits_with_the_effect(
        plugins, autojump_clock, tmp_path) -> None:
    app = tmp_path / "app.sqlite"

    def connect() -> sqlite3.Connection:
        db = sqlite3.connect(app)
        db.execute("CREATE TABLE IF NOT EXISTS effects (seq INTEGER)")
        db.commit()
        return db

    def effects(db: sqlite3.Connection) -> list[int]:
        return [row[0] for row in db.execute("SELECT seq FROM effects ORDER BY rowid")]

    async with sub_cluster(plugins, 5, subscriptions={"ttl": 6.0}) as c:
        key, index = await published(c, "effects", 4)
        db = connect()
        sub = await c.nodes[index].durable_subscription("t", ["effects"], cursor_in=db)
        async with sub.next() as event:
            db.execute("INSERT INTO effects VALUES (?)", (event.seq,))
        with pytest.raises(RuntimeError):
            async with sub.next() as event:
                db.execute("INSERT INTO effects VALUES (?)", (event.seq,))
                raise RuntimeError("processing failed")
        assert effects(db) == [0]  # rolled back with its cursor
        async with sub.next() as event:
            assert event.seq == 1
            db.execute("INSERT INTO effects VALUES (?)", (event.seq,))
        with pytest.raises(UsageError, match="cursor_in"):
            await sub.get()
        db.close()
        # The node crashes; its own store knows nothing of this cursor.
        node = await restart(c, index)
        assert await node._feeds.chains.store.get_cursor("ketten/durable/t") is None
        db = connect()
        again = await node.durable_subscription("t", ["effects"], cursor_in=db)
        assert again.position == {key: 2} and again.delivered == 2
        for _ in range(2):
            async with again.next() as event:
                db.execute("INSERT INTO effects VALUES (?)", (event.seq,))
        assert effects(db) == [0, 1, 2, 3]
        (raw,) = db.execute("SELECT state FROM ketten_cursors WHERE name = 't'").fetchone()
        assert CursorState.decode(raw, where="test").next == {key: 4}

        db.execute("UPDATE ketten_cursors SET state = x'00ff' WHERE name = 't'")
        db.commit()
        await again.aclose()
        with pytest.raises(StoreCorrupted, match="ketten_cursors"):
            await node.durable_subscription("t", ["effects"], cursor_in=db)
        db.execute("UPDATE ketten_cursors SET state = 'not bytes' WHERE name = 't'")
        db.commit()
        with pytest.raises(StoreCorrupted, match="holds str"):
            await node.durable_subscription("t", ["effects"], cursor_in=db)
        assert db.execute("SELECT state FROM ketten_cursors WHERE name = 't'").fetchone() == (
            "not bytes",)  # reported, not overwritten
        db.close()


async def test_cursor_in_refuses_what_cannot_commit_with_the_effect(
        plugins, autojump_clock, tmp_path) -> None:
    async with sub_cluster(plugins, 3, subscriptions={"ttl": 6.0}) as c:
        node = c.nodes[0]
        with pytest.raises(UsageError, match="autocommit"):
            await node.durable_subscription(
                "x", ["a"], cursor_in=sqlite3.connect(tmp_path / "a.sqlite", isolation_level=None))
        with pytest.raises(UsageError, match="DB-API connection"):
            await node.durable_subscription("x", ["a"], cursor_in=object())


async def test_a_subscriber_reads_no_further_ahead_than_its_buffer(plugins, autojump_clock) -> None:
    async with sub_cluster(plugins, 4, subscriptions={"ttl": 9.0, "buffer": 40}) as c:
        key = criterion_key("long")
        index = outsider(c, key)
        published = [await publish(c.nodes[0], key, b"%d" % n, n) for n in range(300)]
        got: list[Event] = []
        async with c.nodes[index].subscribe(["long"]) as sub:
            async for event in sub:
                got.append(event)
                assert sub.statistics().buffered <= 40
                if len(got) == len(published):
                    break
            stats = sub.statistics()
        assert [e.hash for e in got] == [e.hash for e in published]
        assert 1 <= stats.peak_buffered <= 40 and stats.delivered == 300


async def test_a_slow_subscriber_that_drops_is_told_exactly_what_it_missed(
        plugins, autojump_clock) -> None:
    async with sub_cluster(plugins, 4, subscriptions={"ttl": 9.0, "buffer": 8}) as c:
        key, index = await published(c, "fast", 60)
        node = c.nodes[index]
        delivered: list[Event] = []
        gaps: list[EventsDropped] = []
        stream: list[tuple[int, int]] = []  # (first, last) of each event or gap, in order

        async def take(count: int) -> None:
            while len(delivered) < count:
                try:
                    event = await sub.__anext__()
                except EventsDropped as gap:
                    gaps.append(gap)
                    stream.append((gap.first, gap.last))
                    continue
                delivered.append(event)
                stream.append((event.seq, event.seq))
                assert sub.statistics().buffered <= 8

        async with node.subscribe("fast", overflow="drop") as sub:
            await take(3)
            # The application stalls while 40 more events commit.
            for n in range(60, 100):
                await publish(c.nodes[0], key, b"%d" % n, n)
            await trio.sleep(25.0)
            await take(len(delivered) + 10)
            stats = sub.statistics()

        # The stream covers the chain once, in order: events and gaps, nothing twice.
        covered = [seq for first, last in stream for seq in range(first, last + 1)]
        assert covered == list(range(len(covered))) and len(covered) >= 60
        assert len(gaps) >= 2 and all(g.criterion == key for g in gaps)
        assert stats.dropped == sum(g.count for g in gaps)
        assert stats.peak_buffered <= 9  # the buffer plus the notice in front of it
        # Each gap is repaired by reading: the chain's own events at those seqs.
        chain = await node.read("fast")
        assert [e.payload for e in delivered] == [chain[e.seq].payload for e in delivered]
        for gap in gaps:
            repaired = await node.read("fast", since=gap.first)
            assert [e.seq for e in repaired[:gap.count]] == list(range(gap.first, gap.last + 1))
            assert "node.read(criterion, since=" in str(gap)


async def test_overflow_policy_is_checked_when_subscribing(plugins, autojump_clock) -> None:
    async with sub_cluster(plugins, 3, clock="vector") as c:
        node = c.nodes[0]
        with pytest.raises(UsageError, match="overflow must be"):
            async with node.subscribe("a", overflow="discard"):
                pass
        with pytest.raises(ConfigError, match="cannot skip"):
            async with node.subscribe(["a", "b"], delivery="causal", overflow="drop"):
                pass


@pytest.mark.parametrize("seed", [0, 1])
async def test_subscribers_miss_nothing_while_brokers_crash_return_and_are_replaced(
        plugins, autojump_clock, seed: int) -> None:
    total = 60
    async with sub_cluster(plugins, 7, seed=seed, faults=Faults(loss=0.02, jitter=0.02),
                           subscriptions={"ttl": 6.0, "check": 1.0}) as c:
        # A criterion whose replica set the not yet started node 7 will join.
        newcomer = 7
        for n in range(500):
            name = f"moving-{n}"
            key = criterion_key(name)
            target = int.from_bytes(key, "big")
            ranked = sorted(range(8), key=lambda i: int.from_bytes(
                c.identity(i).node_id, "big") ^ target)
            if newcomer in ranked[:2] and 0 not in ranked[:4] and 6 not in ranked[:4]:
                break
        old = c.brokers(key)
        subscriber, publisher = 6, 0
        node = c.nodes[subscriber]
        live: list[Event] = []
        durable: list[Event] = []
        published: list[Event] = []

        async def publish_all() -> None:
            for n in range(total):
                published.append(await publish(c.nodes[publisher], key, b"%d" % n, n))
                await trio.sleep(0.3)

        async def churn() -> None:
            await trio.sleep(3.0)
            await c.stop(old[0])                 # a broker crashes ...
            await trio.sleep(4.0)
            await c.start(old[0], options={**c.config(old[0]).options,
                                           "subscriptions": {"ttl": 6.0, "check": 1.0}})
            await trio.sleep(3.0)                # ... and returns
            await c.start(newcomer, options={**c.config(newcomer).options,
                                             "subscriptions": {"ttl": 6.0, "check": 1.0}})
            await trio.sleep(3.0)                # a closer node joins ...
            await c.stop(old[1])                 # ... and another broker leaves for good

        async def pull(sub: Any) -> None:
            while len(durable) < total:
                durable.append(await sub.get())
            await sub.ack()

        async with node.subscribe([name]) as push:
            sub = await node.durable_subscription("moving", [name])
            with trio.fail_after(300):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(publish_all)
                    nursery.start_soon(churn)
                    nursery.start_soon(collect, push, total, live)
                    nursery.start_soon(pull, sub)
        assert newcomer in c.brokers(key) and old[1] not in c.brokers(key)
        chain = [e.hash for e in published]
        # The replica set did move: the newcomer became a broker of the chain (it holds
        # the chain first as a learner, then a configuration makes it a voter).
        def voter() -> bool:
            replica = c.nodes[newcomer]._replicator.loaded(key)
            return replica is not None and replica.is_voter()

        with trio.fail_after(120):
            while [e.hash for e in await c.chain(newcomer, key)] != chain or not voter():
                await trio.sleep(1.0)
        assert [e.hash for e in live] == chain
        assert [e.hash for e in durable] == chain
        assert sub.delivered == total


async def test_a_causal_subscriber_is_told_which_event_it_waits_for(plugins, autojump_clock) -> None:
    async with sub_cluster(plugins, 7, clock="vector",
                           subscriptions={"ttl": 30.0, "check": 2.0, "patience": 20.0}) as c:
        for n in range(200):
            xn, yn = f"x{n}", f"y{n}"
            x, y = criterion_key(xn), criterion_key(yn)
            readers = [i for i in c.others(x) if i in c.others(y)]
            if readers and not set(c.brokers(x)) & set(c.brokers(y)):
                break
        index, writers, reader = reader_and_writers(c, readers)
        async with reader.subscribe([xn, yn], delivery="causal") as sub:
            await trio.sleep(1.0)
            # The reader cannot reach x's brokers; y0 happens after x0.
            c.network.cut([f"n:{index}"], [f"n:{i}" for i in c.brokers(x)])
            x0 = await publish(c.nodes[writers[0]], x, b"x0", 1)
            await c.nodes[writers[1]].read(x)
            y0 = await publish(c.nodes[writers[1]], y, b"y0", 1)
            started = trio.current_time()
            with pytest.raises(DependencyUnavailable) as raised:
                await sub.__anext__()
            assert (raised.value.criterion, raised.value.seq, raised.value.held) == (x, 0, 1)
            assert 20.0 <= trio.current_time() - started <= 20.0 + 2 * 2.0 + 1.0
            assert "seq 0 of criterion" in str(raised.value)
            c.heal()
            with trio.fail_after(30):
                got = [await sub.__anext__() for _ in range(2)]
            assert [e.hash for e in got] == [x0.hash, y0.hash]


async def _catch_up_time(count: int, delivery: str) -> float:
    """Virtual seconds a node that brokers none of ``count`` criteria (50 events each,
    100 ms one way on every link) takes to deliver them all from a new subscription."""
    from ketten import plugin_manager
    from ketten.testing import Cluster as Harness

    async with trio.open_nursery() as nursery:
        c = Harness(nursery, plugin_manager(), MemoryNetwork(seed=3, faults=Faults(latency=0.1)))
        for index in range(8):
            await c.start(index, clock="vector")
        await trio.sleep(2.0)
        names = [name for name in (f"catch-up-{n}" for n in range(40))
                 if 0 not in c.brokers(criterion_key(name))][:count]
        for name in names:
            broker = c.brokers(criterion_key(name))[0]
            for n in range(50):
                await c.nodes[broker].publish(name, b"%d" % n)
        start = trio.current_time()
        got = 0
        async with c.nodes[0].subscribe(names, delivery=delivery) as sub:
            async for _ in sub:
                got += 1
                if got == 50 * count:
                    break
        nursery.cancel_scope.cancel()
    return trio.current_time() - start


@pytest.mark.parametrize("delivery", ["chain", "causal"])
async def test_a_subscription_to_many_criteria_catches_up_on_all_at_once(
        autojump_clock: trio.testing.MockClock, delivery: str) -> None:
    # Finding the brokers and fetching the events are round trips: made one criterion
    # after the other, six criteria took about six times as long as one.
    one = await _catch_up_time(1, delivery)
    six = await _catch_up_time(6, delivery)
    assert six <= one + 0.25, (one, six)
