"""A closed node (or subscription) ends the calls made on it, at once and with one error.

The calls run in tasks of the application's own, outside the node's nursery,
which leaving ``open_node`` does not cancel: without the node's help they
would wait out their whole deadline, or for ever.
"""

from __future__ import annotations

import sqlite3

import pytest
import trio

import ketten
from ketten import NodeClosed, NodeConfig, UsageError, open_node
from ketten.adapters.memory import MemoryNetwork


def config(net: MemoryNetwork, seeds: list[str], replication: int = 3) -> NodeConfig:
    return NodeConfig(overlay="static", request_timeout=1.0, replication=replication,
                      options={"transport": {"network": net}, "overlay": {"seeds": seeds}})


def alone(net: MemoryNetwork) -> NodeConfig:
    return config(net, [], replication=1)


async def test_calls_in_flight_end_with_node_closed_when_the_node_closes(
        plugins, autojump_clock) -> None:
    net = MemoryNetwork(seed=3)
    outcomes: dict[str, tuple[type[BaseException] | None, float]] = {}

    async def call(label: str, fn: object) -> None:
        began = trio.current_time()
        try:
            await fn()  # type: ignore[operator]
            outcomes[label] = (None, trio.current_time() - began)
        except ketten.KettenError as exc:
            outcomes[label] = (type(exc), trio.current_time() - began)

    async with trio.open_nursery() as outer, open_node(config(net, []), plugins=plugins) as a, \
                open_node(config(net, [a.address]), plugins=plugins) as b, \
                open_node(config(net, [a.address]), plugins=plugins) as c:
        await trio.sleep(1.5)
        await a.publish("k", b"0")
        net.cut({b.address, c.address})  # ``a`` alone: nothing it asks can finish
        outer.start_soon(call, "publish", lambda: a.publish("k", b"1", deadline=20))
        outer.start_soon(call, "read", lambda: a.read("k", deadline=20))
        outer.start_soon(call, "sync", lambda: a.sync("k", deadline=20))
        await trio.sleep(0.5)
    assert set(outcomes) == {"publish", "read", "sync"}
    for label, (error, took) in outcomes.items():
        assert error is NodeClosed, label
        assert took < 1.0, label  # not the 20 s deadline


async def test_every_call_on_a_closed_node_raises_node_closed(plugins, autojump_clock) -> None:
    net = MemoryNetwork(seed=1)
    async with open_node(alone(net), plugins=plugins) as node:
        await node.publish("k", b"0")
    calls = [
        lambda: node.publish("k", b"1"), lambda: node.read("k"), lambda: node.sync("k"),
        lambda: node.pin("k"), lambda: node.unpin("k"), lambda: node.head("k"),
        lambda: node.configuration("k"), lambda: node.local_commit("k"),
        lambda: node.orphans("k"), lambda: node.durable_subscription("d", "k"),
    ]
    for call in calls:
        with pytest.raises(NodeClosed, match="the node is closed"):
            await call()
    with pytest.raises(NodeClosed):
        async with node.subscribe("k"):
            pass  # pragma: no cover
    with pytest.raises(NodeClosed):
        async for _ in node.replay("k"):
            pass  # pragma: no cover
    assert issubclass(NodeClosed, UsageError)  # the application's doing


async def subscriber_outlives_node(plugins: object, cfg: NodeConfig) -> float:
    """A subscription iterated in a task of the application's own while the node
    closes: it must end with NodeClosed; returns how long that took."""
    seen: list[int] = []
    ended: list[BaseException] = []
    first = trio.Event()

    async def consume(node: ketten.Node) -> None:
        try:
            async with node.subscribe("c") as sub:
                async for event in sub:
                    seen.append(event.seq)
                    first.set()
        except NodeClosed as exc:
            ended.append(exc)

    async with trio.open_nursery() as outer:
        async with open_node(cfg, plugins=plugins) as node:  # type: ignore[arg-type]
            await node.publish("c", b"a")
            outer.start_soon(consume, node)
            await first.wait()
        began = trio.current_time()
    assert seen == [0]
    assert len(ended) == 1 and "closed" in str(ended[0])
    return trio.current_time() - began


async def test_a_subscription_iterated_outside_the_node_ends_when_the_node_closes(
        plugins, autojump_clock) -> None:
    assert await subscriber_outlives_node(plugins, alone(MemoryNetwork(seed=2))) < 0.1


async def test_the_same_with_a_sqlite_store_in_real_time(plugins, tmp_path) -> None:
    """No store error escapes from leaving the block (the store closes meanwhile)."""
    cfg = NodeConfig(store="sqlite", overlay="static", request_timeout=1.0, replication=1,
                     options={"transport": {"network": MemoryNetwork(seed=2)},
                              "store": {"path": str(tmp_path / "node")}})
    with trio.fail_after(20):
        assert await subscriber_outlives_node(plugins, cfg) < 5


async def test_a_subscription_used_after_its_block_raises(plugins, autojump_clock) -> None:
    net = MemoryNetwork(seed=2)
    async with open_node(alone(net), plugins=plugins) as node:
        await node.publish("c", b"a")
        async with node.subscribe("c") as sub:
            assert (await sub.__anext__()).seq == 0
        with pytest.raises(NodeClosed, match="subscription is closed"):
            await sub.__anext__()


async def test_durable_waiters_end_when_the_node_or_the_subscription_closes(
        plugins, autojump_clock) -> None:
    net = MemoryNetwork(seed=4)
    results: list[object] = []

    async def wait(sub: ketten.DurableSubscription) -> None:
        try:
            results.append(await sub.get())
        except NodeClosed as exc:
            results.append(exc)

    async with trio.open_nursery() as outer:
        async with open_node(alone(net), plugins=plugins) as node:
            await node.publish("c", b"a")
            first = await node.durable_subscription("first", "c")
            assert (await first.get()).seq == 0
            outer.start_soon(wait, first)  # nothing more will come
            await trio.sleep(1)
            # Closed from another task: the waiter wakes, and unsubscribing
            # does not wait for it.
            began = trio.current_time()
            await first.aclose()
            await trio.sleep(0)
            await first.unsubscribe()
            assert trio.current_time() - began < 0.1
            assert isinstance(results.pop(), NodeClosed)
            with pytest.raises(NodeClosed, match="durable subscription 'first' is closed"):
                await first.get()

            second = await node.durable_subscription("second", "c")
            assert (await second.get()).seq == 0
            outer.start_soon(wait, second)
            await trio.sleep(1)
        began = trio.current_time()
    assert trio.current_time() - began < 0.1
    assert isinstance(results.pop(), NodeClosed)
    for call in (second.get, second.ack, second.unsubscribe):
        with pytest.raises(NodeClosed):
            await call()


async def test_a_cursor_in_block_still_commits_the_application_transaction(
        plugins, autojump_clock, tmp_path) -> None:
    """The application's connection is its own: an event handled in a ``next()`` block
    is committed with its cursor even when the node closes during the block."""
    net = MemoryNetwork(seed=5)
    db = sqlite3.connect(tmp_path / "app.db")
    db.execute("CREATE TABLE seen (seq INTEGER)")
    db.commit()
    handling = trio.Event()

    async def handle(sub: ketten.DurableSubscription) -> None:
        async with sub.next() as event:
            handling.set()
            await trio.sleep(5)  # the node closes meanwhile
            db.execute("INSERT INTO seen VALUES (?)", (event.seq,))

    async with trio.open_nursery() as outer, open_node(alone(net), plugins=plugins) as node:
        await node.publish("c", b"a")
        sub = await node.durable_subscription("app", "c", cursor_in=db)
        outer.start_soon(handle, sub)
        await handling.wait()
    assert db.execute("SELECT seq FROM seen").fetchall() == [(0,)]
    assert db.execute("SELECT count(*) FROM ketten_cursors").fetchone() == (1,)
    assert not db.in_transaction
    db.close()
