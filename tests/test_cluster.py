"""The simulation helpers of ketten.testing replay exactly."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import trio
import trio.testing

import ketten
from ketten import KettenError, Node, criterion_key
from ketten.adapters.memory import Faults, MemoryNetwork
from ketten.testing import deterministic, deterministic_identity, open_cluster


async def gossip(seed: int) -> list[tuple[float, str, int]]:
    net = MemoryNetwork(seed=seed, faults=Faults(latency=0.01, jitter=0.02, loss=0.1))
    key = criterion_key("replay")
    log: list[tuple[float, str, int]] = []

    async def pull(node: Node, peer: str) -> None:
        try:
            n = await node.pull(peer, key)
        except KettenError:
            n = -1
        log.append((trio.current_time(), node.address, n))

    async with open_cluster(12, seed=seed, network=net) as cluster:
        await cluster[0].append_local(key, b"x")
        for _ in range(3):
            async with trio.open_nursery() as nursery:
                size = len(cluster)
                for i, node in sorted(cluster.nodes.items()):
                    nursery.start_soon(pull, node, cluster[(i * 5 + 1) % size].address)
    return log


def run_seed(seed: int) -> list[tuple[float, str, int]]:
    return deterministic(lambda: trio.run(gossip, seed,
                                          clock=trio.testing.MockClock(autojump_threshold=0)))


def test_a_seed_replays_exactly() -> None:
    first = run_seed(21)
    assert first == run_seed(21)
    assert first != run_seed(22)


def test_identities_follow_the_seed() -> None:
    assert deterministic_identity(1, 2).node_id == deterministic_identity(1, 2).node_id
    assert deterministic_identity(1, 2).node_id != deterministic_identity(2, 1).node_id


def test_a_seed_replays_in_another_process() -> None:
    script = (
        "import hashlib, sys; sys.path.insert(0, sys.argv[1]); import test_cluster as t; "
        "print(hashlib.sha256(repr(t.run_seed(21)).encode()).hexdigest())"
    )
    here = str(Path(__file__).parent)
    outputs = {
        subprocess.run([sys.executable, "-c", script, here], check=True, capture_output=True,
                       text=True, env={**os.environ, "PYTHONHASHSEED": hashseed}).stdout.strip()
        for hashseed in ("1", "2")
    }
    assert outputs == {hashlib.sha256(repr(run_seed(21)).encode()).hexdigest()}


async def test_a_cluster_can_be_built_from_whole_configurations(autojump_clock: object) -> None:
    net = MemoryNetwork(seed=1)

    def config(index: int, identity: ketten.Identity) -> ketten.NodeConfig:
        return ketten.NodeConfig(identity=identity, replication=1,
                                 options={"transport": {"network": net, "address": f"x:{index}"}})

    async with open_cluster(2, network=net, config=config, settle=0.1) as cluster:
        assert {cluster[i].address for i in range(2)} == {"x:0", "x:1"}
        assert cluster[1].identity.public_key == cluster.identity(1).public_key
        event = await cluster[0].publish("own", b"x")
        assert [e.hash for e in await cluster[0].read("own")] == [event.hash]
