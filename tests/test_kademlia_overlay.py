"""The kademlia overlay plugin on real nodes over the memory transport (virtual time)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import attrs
import pluggy
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import ketten
from ketten import ConfigError, DecodeError, Identity, NodeConfig, ProtocolError, open_node
from ketten.adapters.memory import MemoryNetwork
from ketten.interfaces import Overlay, Peer
from ketten.plugins.kademlia import (
    MAX_REPLY_CONTACTS,
    KademliaOptions,
    KademliaOverlay,
    decode_contacts,
)
from ketten.plugins.kademlia._ids import puzzle_ok, solve_puzzle


@attrs.define(eq=False)
class Cluster:
    """Nodes of one memory network, each in its own cancel scope so it can leave."""

    net: MemoryNetwork
    plugins: pluggy.PluginManager
    nursery: trio.Nursery
    rng: random.Random
    options: Mapping[str, Any] = attrs.field(factory=dict)
    nodes: dict[bytes, tuple[ketten.Node, trio.CancelScope]] = attrs.field(factory=dict)

    async def add(self, identity: Identity | None = None, **options: Any) -> ketten.Node:
        identity = identity or Identity.from_seed(self.rng.randbytes(32))
        boot = [self.rng.choice(list(self.nodes.values()))[0].address] if self.nodes else []
        overlay = {"bootstrap": boot, **self.options, **options}
        config = NodeConfig(identity=identity, overlay="kademlia",
                            options={"transport": {"network": self.net}, "overlay": overlay})

        async def run(task_status: trio.TaskStatus[tuple[ketten.Node, trio.CancelScope]]) -> None:
            with trio.CancelScope() as scope:
                async with open_node(config, plugins=self.plugins) as node:
                    task_status.started((node, scope))
                    await trio.sleep_forever()

        node, scope = await self.nursery.start(run)
        self.nodes[node.identity.node_id] = (node, scope)
        return node

    def remove(self, node: ketten.Node) -> None:
        self.nodes.pop(node.identity.node_id)[1].cancel()

    def live(self) -> list[ketten.Node]:
        return [node for node, _ in self.nodes.values()]

    def truth(self, key: bytes, count: int) -> list[bytes]:
        target = int.from_bytes(key, "big")
        return sorted(self.nodes, key=lambda i: int.from_bytes(i, "big") ^ target)[:count]

    async def accuracy(self, lookups: int) -> float:
        good = 0
        for _ in range(lookups):
            key = self.rng.randbytes(32)
            node = self.rng.choice(self.live())
            assert node.overlay is not None
            found = await node.overlay.closest(key, 3)
            good += [p.node_id for p in found] == self.truth(key, 3)
        return good / lookups


def overlay_of(node: ketten.Node) -> KademliaOverlay:
    assert isinstance(node.overlay, KademliaOverlay)
    return node.overlay


@pytest.mark.slow
async def test_1000_real_nodes_find_the_closest_also_under_churn(
    plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock
) -> None:
    """1,000 full nodes (transport, store, overlay) join one by one, then 20 % are replaced."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(MemoryNetwork(seed=7), plugins, nursery, random.Random(7),
                          options={"join_refresh": False})
        for _ in range(1000):
            await cluster.add()
        assert await cluster.accuracy(300) >= 0.999
        for _ in range(4):
            for victim in cluster.rng.sample(cluster.live(), 50):
                cluster.remove(victim)
            for _ in range(50):
                await cluster.add()
            assert await cluster.accuracy(50) >= 0.98
        assert len(cluster.nodes) == 1000
        nursery.cancel_scope.cancel()


async def test_small_network_hooks_siblings_and_self(
    autojump_clock: trio.testing.MockClock,
) -> None:
    joined: list[tuple[bytes, bytes]] = []

    class Recorder:
        @ketten.hookimpl
        def ketten_peer_joined(self, node: ketten.Node, peer: Peer) -> None:
            joined.append((node.identity.node_id, peer.node_id))

    plugins = ketten.plugin_manager(extra=(Recorder(),))
    async with trio.open_nursery() as nursery:
        cluster = Cluster(MemoryNetwork(seed=1), plugins, nursery, random.Random(1))
        for _ in range(30):
            await cluster.add()
        nodes = cluster.live()
        assert len(joined) == len(set(joined)), "once per new peer"
        for node in nodes:
            overlay = overlay_of(node)
            assert isinstance(overlay, Overlay)
            known = {peer for owner, peer in joined if owner == node.identity.node_id}
            assert known == {c.node_id for c in overlay.table.contacts()}
            siblings = [p.node_id for p in overlay.siblings()]
            expected = [i for i in cluster.truth(node.identity.node_id, 16)
                        if i != node.identity.node_id]
            assert siblings == expected[:15]
            own = await overlay.closest(node.identity.node_id, 4)
            assert own[0] == Peer(node.address, node.identity.public_key)
            assert [p.node_id for p in own] == cluster.truth(node.identity.node_id, 4)
        stats = overlay_of(nodes[-1]).statistics()
        assert stats.lookups > 0 and stats.requests_served > 0 and stats.contacts == 29
        gone = nodes[3]
        cluster.remove(gone)
        key = gone.identity.node_id
        found = await overlay_of(nodes[0]).closest(key, 5)
        assert gone.identity.node_id not in [p.node_id for p in found]
        assert [p.node_id for p in found] == cluster.truth(key, 5)
        nursery.cancel_scope.cancel()


async def test_puzzle_is_enforced(autojump_clock: trio.testing.MockClock) -> None:
    rng = random.Random(2)
    plugins = ketten.plugin_manager()
    async with trio.open_nursery() as nursery:
        cluster = Cluster(MemoryNetwork(seed=2), plugins, nursery, rng,
                          options={"puzzle_difficulty": 4})
        for _ in range(5):
            await cluster.add(solve_puzzle(4, rng))
        lazy = next(i for i in (Identity.from_seed(rng.randbytes(32)) for _ in range(100))
                    if not puzzle_ok(i.node_id, 4))
        with pytest.raises(ConfigError, match="puzzle"):
            await cluster.add(lazy)
        # the same identity in a network without the puzzle talks to them, but is never listed
        cluster.options = {}
        intruder = await cluster.add(lazy)
        assert intruder.overlay is not None
        await intruder.overlay.closest(lazy.node_id, 3)
        for node in cluster.live()[:5]:
            assert lazy.node_id not in {c.node_id for c in overlay_of(node).table.contacts()}
            assert overlay_of(node).statistics().refused > 0
        nursery.cancel_scope.cancel()


async def test_lone_node_and_dead_bootstrap(
    plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    net = MemoryNetwork(seed=3)
    config = NodeConfig(overlay="kademlia", options={
        "transport": {"network": net}, "overlay": {"bootstrap": ["mem:404"]}})
    async with open_node(config, plugins=plugins) as node:
        assert node.overlay is not None
        found = await node.overlay.closest(bytes(32), 3)
        assert found == [Peer(node.address, node.identity.public_key)]
    assert "no bootstrap node answered" in caplog.text


async def test_a_node_started_before_its_bootstrap_joins_it_soon(
    plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork(seed=4)

    def config(address: str, bootstrap: list[str]) -> NodeConfig:
        return NodeConfig(overlay="kademlia", options={
            "transport": {"network": net, "address": address},
            "overlay": {"bootstrap": bootstrap}})

    async with open_node(config("mem:late", ["mem:first"]), plugins=plugins) as early:
        await trio.sleep(1.0)  # its bootstrap node starts only now (a whole cluster restarts)
        async with open_node(config("mem:first", []), plugins=plugins) as first:
            started = trio.current_time()
            while first.identity.public_key not in {
                    c.peer.public_key for c in overlay_of(early).table.contacts()} or \
                    early.identity.public_key not in {
                    c.peer.public_key for c in overlay_of(first).table.contacts()}:
                await trio.sleep(0.1)
            # Well before the regular rounds (every ping_interval, 10 s) would join.
            assert trio.current_time() - started < 5.0
            found = await first.overlay.closest(early.identity.node_id, 2)  # type: ignore[union-attr]
            assert early.address in {p.address for p in found}


async def test_a_node_whose_table_emptied_joins_again_through_its_seeds(
    plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock,
) -> None:
    """Its contacts all leave (they fail their pings and are dropped); when they
    come back, the node joins them again on its own, through its bootstrap
    address and the addresses it knew, without being asked."""
    net = MemoryNetwork(seed=5)

    def config(index: int) -> NodeConfig:
        return NodeConfig(identity=Identity.from_seed(bytes([index + 40]) * 32),
                          overlay="kademlia", options={
                              "transport": {"network": net, "address": f"mem:{index}"},
                              "overlay": {"bootstrap": [] if index == 1 else ["mem:1"],
                                          "ping_interval": 2.0, "stale_after": 2}})

    async def run(index: int, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            async with open_node(config(index), plugins=plugins):
                task_status.started(scope)
                await trio.sleep_forever()

    async with trio.open_nursery() as nursery, \
            open_node(config(0), plugins=plugins) as node:
        others = {i: await nursery.start(run, i) for i in range(1, 6)}
        table = overlay_of(node).table
        with trio.fail_after(60):
            while len(table) < 5:
                await trio.sleep(0.5)
        for scope in others.values():
            scope.cancel()
        with trio.fail_after(120):
            while len(table):
                await trio.sleep(0.5)
        for i in range(1, 6):
            await nursery.start(run, i)
        with trio.fail_after(60):
            while len(table) < 5:
                await trio.sleep(0.5)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("options", [
    {"k": 0}, {"alpha": "3"}, {"bootstrap": "mem:1"}, {"paths": True}, {"refresh_interval": -1},
    {"puzzle_difficulty": 100}, {"unknown": 1}, {"join_refresh": 1},
])
def test_bad_options(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        KademliaOptions.parse(options, 3)


def test_default_options() -> None:
    options = KademliaOptions.parse({"bootstrap": ["a:1"], "paths": 4}, 3)
    assert (options.k, options.alpha, options.paths, options.siblings) == (20, 3, 4, 15)


cbor_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.binary(max_size=40)
    | st.text(max_size=10) | st.sampled_from(["ping", "find", "op", "target", "nodes"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["op", "target", "nodes", "x"]) | st.text(max_size=3), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(body=cbor_values | st.fixed_dictionaries(
    {"op": st.sampled_from(["find", "ping", "store"])},
    optional={"target": st.binary(max_size=40) | st.integers()}))
async def test_random_kad_requests_only_raise_protocol_errors(body: Any) -> None:
    net = MemoryNetwork(seed=4)
    config = NodeConfig(overlay="kademlia", options={"transport": {"network": net}})
    plugins = ketten.plugin_manager()
    async with open_node(config, plugins=plugins) as node:
        overlay = overlay_of(node)
        sender = Peer("mem:99", Identity.from_seed(bytes(32)).public_key)
        try:
            answer = await overlay._serve(sender, body)
        except (DecodeError, ProtocolError):
            pass
        else:
            assert isinstance(answer, dict)
        peer_answer = {"nodes": [["mem:1", b"\x01" * 32], ["", b"\x02" * 32]]}
        with pytest.raises(DecodeError):
            from ketten.plugins.kademlia import decode_contacts
            decode_contacts(peer_answer, 0)


class LiarOverlay(KademliaOverlay):
    """Answers every find with the most contacts it may name, none of them reachable."""

    async def _serve(self, peer: Peer, body: Any) -> Any:
        if isinstance(body, dict) and body.get("op") == "find":
            rng = random.Random(body.get("target"))
            count = max(self.options.k, body.get("count", 0))
            return {"nodes": [[f"mem:nowhere-{i}", Identity.from_seed(rng.randbytes(32)).public_key]
                              for i in range(count)]}
        return await super()._serve(peer, body)


class Liars:
    @ketten.hookimpl
    def ketten_plugin_names(self) -> Mapping[str, list[str]]:
        return {"overlay": ["liar"]}

    @ketten.hookimpl
    def ketten_make_overlay(self, name: str, options: Mapping[str, Any],
                            node: ketten.Node) -> KademliaOverlay | None:
        if name != "liar":
            return None
        return LiarOverlay(node=node, options=KademliaOptions.parse(options, 3))


async def test_a_liar_costs_a_lookup_at_most_its_deadline(
        autojump_clock: trio.testing.MockClock) -> None:
    plugins = ketten.plugin_manager(extra=(Liars(),))
    net = MemoryNetwork(seed=5)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(net, plugins, nursery, random.Random(5), {"lookup_timeout": 4.0})
        honest = [await cluster.add() for _ in range(12)]

        async def liar(task_status: trio.TaskStatus[ketten.Node]) -> None:
            config = NodeConfig(identity=Identity.from_seed(b"L" * 32), overlay="liar",
                                options={"transport": {"network": net},
                                         "overlay": {"bootstrap": [honest[0].address]}})
            async with open_node(config, plugins=plugins) as node:
                task_status.started(node)
                await trio.sleep_forever()

        lying = await nursery.start(liar)
        # The contacts it names swallow every request (a real liar's black holes).
        net.cut([f"mem:nowhere-{i}" for i in range(MAX_REPLY_CONTACTS)],
                [n.address for n in honest])
        for node in honest:  # every honest node comes to know the liar
            await overlay_of(node)._rpc(lying.address, {"op": "ping"})
        with pytest.raises(ProtocolError, match="held 21"):
            decode_contacts({"nodes": [["mem:1", bytes([i]) * 32] for i in range(21)]}, 0, 20)
        for index, node in enumerate(honest):
            key = random.Random(index).randbytes(32)
            started = trio.current_time()
            found = await overlay_of(node).closest(key, 3)
            assert trio.current_time() - started <= 4.0 + 0.01  # its lookup_timeout
            assert len(found) == 3 and all(p.address.startswith("mem:") and "nowhere" not in
                                           p.address for p in found)
        nursery.cancel_scope.cancel()
