"""Replication over the real parts: loopback TCP, SQLite files, the kademlia overlay."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pluggy
import trio

from ketten import Event, Node, NodeConfig, criterion_key, open_node
from ketten.adapters.memory import MemoryNetwork
from ketten.testing import deterministic_identity


@asynccontextmanager
async def nodes(plugins: pluggy.PluginManager, count: int,
                config: Callable[[int, list[str]], NodeConfig]) -> AsyncIterator[list[Node]]:
    """Start ``count`` nodes one after another; ``config(i, addresses so far)``."""
    started: list[Node] = []
    async with trio.open_nursery() as nursery:

        async def run(index: int, task_status: trio.TaskStatus[Node]) -> None:
            cfg = config(index, [n.address for n in started])
            async with open_node(cfg, plugins=plugins) as node:
                task_status.started(node)
                await trio.sleep_forever()

        for index in range(count):
            started.append(await nursery.start(run, index))
        yield started
        nursery.cancel_scope.cancel()



async def exercise(cluster: list[Node], *, publishes: int = 40) -> None:
    """Publish from every node on a few criteria; every broker ends with the same chain."""
    keys = [criterion_key(f"real {i}") for i in range(4)]
    acked: dict[bytes, list[Event]] = {k: [] for k in keys}
    async with trio.open_nursery() as nursery:

        async def publisher(i: int) -> None:
            node = cluster[i % len(cluster)]
            for n in range(publishes // len(cluster)):
                key = keys[(i + n) % len(keys)]
                acked[key].append(await node.publish(key, b"%d/%d" % (i, n), command=n))

        for i in range(len(cluster)):
            nursery.start_soon(publisher, i)
    by_address = {n.address: n for n in cluster}
    for key in keys:
        replicas = await cluster[0].overlay.closest(key, 3)  # type: ignore[union-attr]
        brokers = [by_address[p.address] for p in replicas]
        for broker in brokers:
            await broker.sync(key)
        chains = [await b.store.range(key) for b in brokers]
        assert chains[0] == chains[1] == chains[2]
        assert sorted(e.hash for e in acked[key]) == sorted(e.hash for e in chains[0])
        reader = next(n for n in cluster if n not in brokers)
        assert await reader.read(key) == chains[0]


async def test_five_nodes_on_loopback_tcp_with_sqlite(plugins, tmp_path: Path) -> None:
    def config(index: int, addresses: list[str]) -> NodeConfig:
        return NodeConfig(
            identity=deterministic_identity(50, index), transport="tcp", store="sqlite",
            overlay="static", request_timeout=5.0,
            options={"store": {"path": str(tmp_path / f"node{index}")},
                     "overlay": {"seeds": addresses[:1]}},
        )

    async with nodes(plugins, 5, config) as cluster:
        for node in cluster:
            assert node.overlay is not None and node.overlay.statistics().members == 4
        await exercise(cluster)


async def test_publish_over_kademlia_on_the_memory_network(plugins, autojump_clock) -> None:
    net = MemoryNetwork(seed=5)

    def config(index: int, addresses: list[str]) -> NodeConfig:
        opts: dict[str, Any] = {"bootstrap": addresses[:1]}
        return NodeConfig(identity=deterministic_identity(51, index), overlay="kademlia",
                          options={"transport": {"network": net}, "overlay": opts})

    async with nodes(plugins, 7, config) as cluster:
        await trio.sleep(5.0)
        await exercise(cluster)


async def test_publish_over_kademlia_on_loopback_tcp(plugins) -> None:
    def config(index: int, addresses: list[str]) -> NodeConfig:
        return NodeConfig(identity=deterministic_identity(52, index), transport="tcp",
                          overlay="kademlia", request_timeout=5.0,
                          options={"overlay": {"bootstrap": addresses[:1]}})

    async with nodes(plugins, 5, config) as cluster:
        await exercise(cluster, publishes=20)
