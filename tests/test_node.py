"""The node skeleton: composition, services, statistics, many nodes per process."""

from __future__ import annotations

from pathlib import Path

import attrs
import pluggy
import pytest
import trio
import trio.testing

import ketten
from ketten import (
    ConfigError,
    Identity,
    NodeConfig,
    PeerUnreachable,
    RemoteError,
    UsageError,
    criterion_key,
    hookimpl,
)
from ketten.adapters.memory import Faults, MemoryNetwork
from ketten.interfaces import Peer
from ketten.plugins.memory_store import MemoryBacking


def config(net: MemoryNetwork, seed: int, **kwargs: object) -> NodeConfig:
    return NodeConfig(identity=Identity.from_seed(seed.to_bytes(32, "big")),
                      options={"transport": {"network": net}, **kwargs.pop("options", {})},  # type: ignore[dict-item]
                      **kwargs)  # type: ignore[arg-type]


async def test_two_nodes_exchange_a_chain(plugins: pluggy.PluginManager,
                                          autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=1, faults=Faults(latency=0.01, jitter=0.01))
    key = criterion_key("orders")
    async with ketten.open_node(config(net, 1), plugins=plugins) as a, \
            ketten.open_node(config(net, 2), plugins=plugins) as b:
        events = [await a.append_local(key, b"%d" % i) for i in range(50)]
        assert await b.pull(a.address, key) == 50
        assert await b.store.range(key) == events
        assert await b.pull(a.address, key) == 0
        more = await a.append_local(key, b"late")
        assert await b.pull(a.address, key) == 1
        assert (await b.store.head(key)) == more
        stats = b.statistics()
        assert stats.events_appended == 51 and stats.events_received == 51
        assert stats.invalid_events == 0
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            stats.events_appended = 0  # type: ignore[misc]


async def test_sync_is_batched_by_bytes(plugins: pluggy.PluginManager,
                                        autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=2)
    key = criterion_key("big")
    small = NodeConfig(identity=Identity.from_seed(b"\x05" * 32), sync_batch_bytes=2000,
                       options={"transport": {"network": net}})
    async with ketten.open_node(config(net, 1), plugins=plugins) as a, \
            ketten.open_node(small, plugins=plugins) as b:
        for _ in range(40):
            await a.append_local(key, bytes(300))
        assert await b.pull(a.address, key) == 40
        assert b.transport.statistics().requests_sent >= 40 * 300 // 2000


async def test_forged_events_are_refused(plugins: pluggy.PluginManager,
                                         autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=3)
    key = criterion_key("guarded")
    served = MemoryBacking()
    async with ketten.open_node(config(net, 1, options={"store": {"backing": served}}),
                                plugins=plugins) as a, \
            ketten.open_node(config(net, 2), plugins=plugins) as b:
        genesis = await a.append_local(key, b"g", writers=[a.identity.public_key])
        stranger = ketten.Event.create(b.identity, criterion=key, seq=1, prev=genesis.hash,
                                       payload=b"", time=0)
        forged = attrs.evolve(ketten.Event.create(a.identity, criterion=key, seq=1,
                                                  prev=genesis.hash, payload=b"x", time=0),
                              payload=b"forged")
        for bad in (stranger, forged):
            # What a hostile peer would serve: its own store holds the bad event.
            served.chains[key].events[1:] = [bad]
            assert await b.pull(a.address, key) == 0
            assert await b.store.range(key) == []  # nothing of a bad batch is stored
        assert b.statistics().invalid_events == 2


async def test_services_errors_and_unreachable(plugins: pluggy.PluginManager,
                                               autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=4)
    async with ketten.open_node(config(net, 1), plugins=plugins) as a, \
            ketten.open_node(config(net, 2), plugins=plugins) as b:
        seen: list[Peer] = []

        async def echo(peer: Peer, body: object) -> object:
            seen.append(peer)
            if body == "boom":
                raise UsageError("no booms")
            return {"echo": body}

        b.register_service("echo", echo)
        with pytest.raises(UsageError):
            b.register_service("echo", echo)
        assert await a.call(b.address, "echo", [1, b"x"]) == {"echo": [1, b"x"]}
        assert seen[0].node_id == a.identity.node_id
        with pytest.raises(RemoteError, match="UsageError"):
            await a.call(b.address, "echo", "boom")
        with pytest.raises(RemoteError, match="unknown service"):
            await a.call(b.address, "nope", None)
        with pytest.raises(RemoteError, match="DecodeError"):
            await a.transport.request(b.address, b"\xff\x00garbage")
        net.cut({b.address})
        with pytest.raises(PeerUnreachable, match="no reply"):
            await a.call(b.address, "echo", 1, timeout=2)
        net.heal()
        assert await a.call(b.address, "echo", 2) == {"echo": 2}
        assert b.statistics().decode_errors == 1


async def test_restart_with_a_kept_store(plugins: pluggy.PluginManager,
                                         autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=5)
    backing = MemoryBacking()
    key = criterion_key("kept")
    cfg = config(net, 1, options={"store": {"backing": backing}})
    async with ketten.open_node(cfg, plugins=plugins) as a:
        first = await a.append_local(key, b"1")
    async with ketten.open_node(cfg, plugins=plugins) as a:
        second = await a.append_local(key, b"2")
        assert second.prev == first.hash and second.seq == 1


async def test_observer_hooks_fire(autojump_clock: trio.testing.MockClock) -> None:
    calls: list[str] = []

    class Observer:
        @hookimpl
        def ketten_node_started(self, node: ketten.Node) -> None:
            calls.append("started")

        @hookimpl
        def ketten_event_appended(self, node: ketten.Node, event: ketten.Event) -> None:
            calls.append(f"appended {event.seq}")

        @hookimpl
        def ketten_node_stopping(self, node: ketten.Node) -> None:
            calls.append("stopping")

    pm = ketten.plugin_manager(extra=(Observer(),))
    async with ketten.open_node(config(MemoryNetwork(), 1), plugins=pm) as node:
        await node.append_local(criterion_key("o"), b"")
        await node.append_local(criterion_key("o"), b"")
    assert calls == ["started", "appended 0", "appended 1", "stopping"]


async def test_many_nodes_in_one_process(plugins: pluggy.PluginManager,
                                         autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=6, faults=Faults(latency=0.005))
    key = criterion_key("ring")
    async with trio.open_nursery() as nursery:
        nodes: list[ketten.Node] = []

        async def run(i: int, task_status: trio.TaskStatus[ketten.Node]) -> None:
            async with ketten.open_node(config(net, i + 1), plugins=plugins) as node:
                task_status.started(node)
                await trio.sleep_forever()

        for i in range(200):
            nodes.append(await nursery.start(run, i))
        await nodes[0].append_local(key, b"origin")
        for prev, node in zip(nodes, nodes[1:]):
            assert await node.pull(prev.address, key) == 1
        assert (await nodes[-1].store.head(key)).payload == b"origin"  # type: ignore[union-attr]
        assert len({n.address for n in nodes}) == 200
        nursery.cancel_scope.cancel()


async def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="replication"):
        NodeConfig(replication=0)
    with pytest.raises(ConfigError, match="options"):
        NodeConfig(options={"transport": 5})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=r"network' of the transport plugin 'memory' .* must be of "
                       r"type MemoryNetwork"):
        async with ketten.open_node(NodeConfig(options={"transport": {"network": "shared"}})):
            pass  # pragma: no cover
    with pytest.raises(UsageError, match="32-byte"):
        async with ketten.open_node(config(MemoryNetwork(), 1)) as node:
            await node.append_local(b"short", b"")


async def test_a_default_config_runs_a_node_alone(autojump_clock: object) -> None:
    async with ketten.open_node(NodeConfig()) as node:
        event = await node.publish("alone", b"hello")
        assert [e.hash for e in await node.read("alone")] == [event.hash]
    async with ketten.open_node(NodeConfig()) as other:  # a network of its own again
        assert await other.read("alone") == []


async def test_startup_errors_are_not_wrapped(plugins: pluggy.PluginManager) -> None:
    async with ketten.open_node(NodeConfig(transport="tcp"), plugins=plugins) as first:
        taken = NodeConfig(transport="tcp", options={"transport": {"listen": first.address}})
        with pytest.raises(ketten.KettenError) as info:
            async with ketten.open_node(taken, plugins=plugins):
                pass  # pragma: no cover
        assert first.address.rsplit(":", 1)[1] in str(info.value)


def test_which_single_error_of_the_nodes_tasks_is_raised_as_itself() -> None:
    from ketten._node.node import _alone

    refused, bug, other = (ketten.ConfigError("port in use"),
                           ketten.errors.InternalError("bug"), ValueError("x"))
    assert _alone(BaseExceptionGroup("g", [refused]), started=False) is refused
    assert _alone(BaseExceptionGroup("g", [refused]), started=True) is None
    assert _alone(BaseExceptionGroup("g", [bug]), started=True) is bug
    assert _alone(BaseExceptionGroup("g", [other]), started=False) is None
    assert _alone(BaseExceptionGroup("g", [bug, refused]), started=False) is None


@pytest.mark.parametrize("store", ["sqlite", "file"])
async def test_a_node_alone_serves_its_chains_after_a_restart(tmp_path: Path, store: str) -> None:
    config = NodeConfig(replication=1, store=store, identity=ketten.Identity.generate(),
                        options={"store": {"path": str(tmp_path)}})
    async with ketten.open_node(config) as node:
        first = await node.publish("kept", b"one")
    async with ketten.open_node(config) as node:
        with trio.fail_after(5):  # nothing but this node's own store can answer
            assert [e.hash for e in await node.read("kept")] == [first.hash]
            second = await node.publish("kept", b"two")
        assert second.seq == 1 and second.prev == first.hash


async def test_a_node_prints_short(autojump_clock) -> None:
    """A failing assertion about a node prints it: every part it holds and every node on
    the network it reaches must not go into that line (with a thousand nodes pytest
    would spend minutes on it)."""
    from ketten.testing import open_cluster

    async with open_cluster(3, overlay="static", seed=1, settle=2.0) as cluster:
        node = cluster[0]
        assert repr(node) == f"<Node {node.identity.node_id.hex()[:12]} at {node.address}>"
        for part in (node._replicator, node._rpc, node._sets, node._feeds, node._chains,
                     node._broker, node._publisher, node.transport):
            assert len(repr(part)) < 200, type(part).__name__


async def test_bad_arguments_raise_usage_errors_that_name_them(plugins, autojump_clock) -> None:
    """Every bad argument is the caller's: a UsageError (or ConfigError) naming it,
    never a TypeError, ValueError or UnicodeError from deep inside."""
    with pytest.raises(ConfigError, match=r"identity must be a ketten\.Identity"):
        ketten.NodeConfig(identity="abc")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="request_timeout"):
        ketten.NodeConfig(request_timeout=float("nan"))
    async with ketten.open_node(ketten.NodeConfig(replication=1), plugins=plugins) as node:
        await node.publish("c", b"x")
        bad = {
            "criterion name": lambda: node.publish("a\udc80", b"x"),
            "deadline": lambda: node.publish("c", b"x", deadline=float("nan")),
            "deadline ": lambda: node.read("c", deadline=-1),
            "deadline  ": lambda: node.sync("c", deadline=float("nan")),
            "since": lambda: node.read("c", since="0"),  # type: ignore[arg-type]
            "since ": lambda: node.read("c", since=-1),
        }
        for word, call in bad.items():
            with pytest.raises(UsageError, match=word.strip()):
                await call()
        with pytest.raises(UsageError, match="from_seq"):
            async for _ in node.replay("c", from_seq="1"):  # type: ignore[arg-type]
                pass  # pragma: no cover
        assert [e.payload for e in await node.read("c")] == [b"x"]
