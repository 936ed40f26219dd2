"""The ``static`` overlay: membership from seeds, liveness, eviction, restarts."""

from __future__ import annotations

import pytest
import trio

from ketten import Node, NodeConfig, open_node
from ketten.adapters.memory import MemoryNetwork
from ketten.errors import ConfigError
from ketten.plugins.memory_store import MemoryBacking
from ketten.plugins.static_overlay import StaticOverlay
from ketten.testing import deterministic_identity


def config(net: MemoryNetwork, index: int, backing: MemoryBacking | None = None,
           **overlay: object) -> NodeConfig:
    return NodeConfig(
        identity=deterministic_identity(70, index), overlay="static",
        options={"transport": {"network": net, "address": f"s:{index}"},
                 "store": {"backing": backing or MemoryBacking()},
                 "overlay": {"seeds": ["s:0"], "interval": 0.5, **overlay}})


def overlay_of(node: Node) -> StaticOverlay:
    assert isinstance(node.overlay, StaticOverlay)
    return node.overlay


async def test_membership_spreads_from_one_seed(plugins, autojump_clock) -> None:
    net = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        nodes: list[Node] = []
        for index in range(6):

            async def run(index: int = index, *, task_status: trio.TaskStatus[Node]) -> None:
                async with open_node(config(net, index), plugins=plugins) as node:
                    task_status.started(node)
                    await trio.sleep_forever()

            nodes.append(await nursery.start(run))
        await trio.sleep(2.0)
        for node in nodes:
            assert overlay_of(node).statistics().live == 5
        key = b"\x42" * 32
        answers = [await node.overlay.closest(key, 3) for node in nodes]  # type: ignore[union-attr]
        assert all(a == answers[0] for a in answers)
        distances = [int.from_bytes(p.node_id, "big") ^ int.from_bytes(key, "big")
                     for p in answers[0]]
        assert distances == sorted(distances)
        nursery.cancel_scope.cancel()


def sent(nodes: list[Node]) -> int:
    """Bytes the nodes' transports sent (requests and replies)."""
    return sum(node.statistics().transport.bytes_sent for node in nodes)


async def test_a_settled_network_greets_with_digests_and_lists_again_on_a_change(
        plugins, autojump_clock) -> None:
    net = MemoryNetwork()
    async with trio.open_nursery() as nursery:

        async def run(index: int, *, task_status: trio.TaskStatus[Node]) -> None:
            async with open_node(config(net, index), plugins=plugins) as node:
                task_status.started(node)
                await trio.sleep_forever()

        nodes: list[Node] = [await nursery.start(run, index) for index in range(8)]
        await trio.sleep(5.0)
        overlays = [overlay_of(node) for node in nodes]
        assert all(o.statistics().live == 7 for o in overlays)
        before = [o.statistics() for o in overlays]
        sent_before = sent(nodes)
        await trio.sleep(10.0)
        after = [o.statistics() for o in overlays]
        hellos = sum(a.hellos_sent - b.hellos_sent for a, b in zip(after, before))
        # Rounds come every 0.75-1.25 intervals (0.5 s): each of the 28 pairs greets at
        # least once per longest round, in one direction (a node skips the hello to a
        # member whose own hello it just answered), not twice as many.
        pairs, rounds = 8 * 7 // 2, 10.0 / (1.25 * 0.5)
        assert hellos >= pairs * rounds, "every pair still greets every interval"
        assert hellos <= 0.6 * 2 * pairs * 10.0 / 0.5, "both sides of a pair greet each other"
        assert sum(a.lists_sent for a in after) == sum(b.lists_sent for b in before), \
            "the views agree: no list is sent"
        per_hello = (sent(nodes) - sent_before) / hellos
        assert per_hello < 200, "a hello and its reply carry no member list"

        # A newcomer greets one seed; its list reaches everyone, and everyone's view
        # changes, so lists go round until the views agree again.
        nodes.append(await nursery.start(run, 8))
        await trio.sleep(5.0)
        assert all(overlay_of(node).statistics().live == 8 for node in nodes)
        settled = [overlay_of(node).statistics().lists_sent for node in nodes]
        await trio.sleep(5.0)
        assert [overlay_of(node).statistics().lists_sent for node in nodes] == settled
        nursery.cancel_scope.cancel()


async def test_a_silent_member_is_down_then_evicted_then_back(plugins, autojump_clock) -> None:
    net = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        nodes: list[Node] = []
        for index in range(3):

            async def run(index: int = index, *, task_status: trio.TaskStatus[Node]) -> None:
                async with open_node(config(net, index, evict_after=5.0), plugins=plugins) as n:
                    task_status.started(n)
                    await trio.sleep_forever()

            nodes.append(await nursery.start(run))
        await trio.sleep(2.0)
        watcher = overlay_of(nodes[0])
        everyone = await watcher.closest(b"\0" * 32, 3)
        settled = watcher.version
        net.cut(["s:2"])
        await trio.sleep(2.0)
        assert watcher.statistics().live == 1
        assert await watcher.closest(b"\0" * 32, 3) == everyone  # still in replica sets
        # Down but not evicted: replica sets are the same, and so is the version.
        assert watcher.version == settled
        await trio.sleep(5.0)
        assert len(await watcher.closest(b"\0" * 32, 3)) == 2  # evicted
        evicted = watcher.version
        assert evicted > settled
        await trio.sleep(5.0)
        assert watcher.version == evicted
        net.heal()
        await trio.sleep(2.0)
        assert await watcher.closest(b"\0" * 32, 3) == everyone
        assert watcher.version > evicted
        nursery.cancel_scope.cancel()


async def test_a_restarted_node_remembers_the_members(plugins, autojump_clock) -> None:
    net = MemoryNetwork()
    backing = MemoryBacking()
    async with trio.open_nursery() as nursery:
        for index in range(4):

            async def run(index: int = index, *, task_status: trio.TaskStatus[None]) -> None:
                async with open_node(config(net, index), plugins=plugins):
                    task_status.started()
                    await trio.sleep_forever()

            await nursery.start(run)
        async with open_node(config(net, 9, backing), plugins=plugins) as node:
            await trio.sleep(2.0)
            assert overlay_of(node).statistics().members == 4
        net.cut(["s:9"])  # it comes back cut off from everyone, seeds included
        async with open_node(config(net, 9, backing), plugins=plugins) as node:
            assert overlay_of(node).statistics().members == 4
            assert len(await node.overlay.closest(b"\1" * 32, 5)) == 5  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()


async def test_bad_options_are_config_errors(plugins, autojump_clock) -> None:
    net = MemoryNetwork()
    with pytest.raises(ConfigError, match="interval"):
        async with open_node(config(net, 0, interval=0), plugins=plugins):
            pass
    with pytest.raises(ConfigError, match="seeds"):
        async with open_node(NodeConfig(overlay="static", options={
                "transport": {"network": net}, "overlay": {"seeds": "s:0"}}), plugins=plugins):
            pass
