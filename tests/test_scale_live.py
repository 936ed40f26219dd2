"""Fifty nodes on loopback TCP in one process, 1,000 publishes in flight."""

from __future__ import annotations

import random

import pytest
import trio

import ketten
from ketten import Identity, NodeConfig, open_node

pytestmark = pytest.mark.slow


async def test_fifty_kademlia_nodes_acknowledge_and_read_a_thousand_publishes_in_flight(
        plugins) -> None:
    rng = random.Random(50)
    nodes: list[ketten.Node] = []
    async with trio.open_nursery() as nursery:

        async def run(index: int, task_status: trio.TaskStatus[ketten.Node]) -> None:
            boot = [nodes[0].address] if nodes else []
            config = NodeConfig(identity=Identity.from_seed(bytes([index + 1]) * 32),
                                transport="tcp", overlay="kademlia",
                                options={"overlay": {"bootstrap": boot},
                                         # Fifty nodes share one process's CPU: each
                                         # works on few calls at once, the rest wait.
                                         "replication": {"max_publishing": 4}})
            async with open_node(config, plugins=plugins) as node:
                task_status.started(node)
                await trio.sleep_forever()

        for index in range(50):
            nodes.append(await nursery.start(run, index))
        names = [f"live-{i}" for i in range(100)]
        for index, name in enumerate(names):
            await nodes[index % 50].publish(name, b"first", deadline=60.0)

        acked: dict[str, set[bytes]] = {}
        failures: list[str] = []

        async def one(number: int) -> None:
            name = rng.choice(names)
            try:
                event = await rng.choice(nodes).publish(name, b"%d" % number, deadline=60.0)
            except ketten.KettenError as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                return
            acked.setdefault(name, set()).add(event.hash)

        async with trio.open_nursery() as publishing:
            for number in range(1000):
                publishing.start_soon(one, number)
        assert failures == [], (len(failures), failures[:3])
        assert sum(len(h) for h in acked.values()) == 1000
        for name, hashes in acked.items():
            chain = await rng.choice(nodes).read(name)
            assert hashes <= {e.hash for e in chain}, name
        nursery.cancel_scope.cancel()
