"""1,000 nodes holding 100,000 chains idle for 10 virtual minutes: the background
messages of a node depend on its peers, not on how many chains it holds.

The chains are written into the nodes' stores before they start (a genesis
and a first configuration on the three nodes nearest each key, as a creation
leaves them), so the test measures idling, not creating. Memory network,
virtual time, the Kademlia overlay.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pytest
import trio

from ketten import Event, Identity, criterion_key
from ketten._core.membership import ChainConfig, ChainState, Member
from ketten._node.local_chains import STATE_PREFIX
from ketten.adapters.memory import MemoryNetwork
from ketten.plugins.memory_store import MemoryBacking, MemoryStore
from ketten.testing import Cluster

NODES = 1000
CHAINS = 100_000
R = 3
PING_INTERVAL = 30.0


def nearest_nodes(ids: list[int], count: int, chains: int) -> dict[bytes, list[int]]:
    """For each chain key, the ``count`` node indices whose ids are XOR-nearest."""
    # Nodes sharing more leading bits with a key are nearer than all the others: look
    # in the longest shared prefix that holds enough nodes.
    prefixes: list[dict[int, list[int]]] = []
    for bits in range(17):
        groups: dict[int, list[int]] = defaultdict(list)
        for index, node_id in enumerate(ids):
            groups[node_id >> (256 - bits)].append(index)
        prefixes.append(groups)
    out: dict[bytes, list[int]] = {}
    for n in range(chains):
        key = criterion_key(f"idle-{n}")
        target = int.from_bytes(key, "big")
        for bits in range(16, -1, -1):
            group = prefixes[bits].get(target >> (256 - bits), [])
            if len(group) >= count:
                out[key] = sorted(group, key=lambda i: ids[i] ^ target)[:count]
                break
    return out


async def preload(cluster: Cluster, placement: dict[bytes, list[int]]) -> None:
    author = Identity.from_seed(b"idle-author".ljust(32, b"\0"))
    stores = {i: MemoryStore(backing=cluster.backings.setdefault(i, MemoryBacking()))
              for i in range(NODES)}
    for store in stores.values():
        await store.open()
    for key, holders in placement.items():
        genesis = Event.create(author, criterion=key, seq=0, prev=None, payload=b"", time=1)
        members = [Member(cluster.identity(i).public_key, f"n:{i}") for i in holders]
        state = ChainState(term=1, voted_for=members[0].key, log_term=1,
                           configs=(ChainConfig(1, members, (), -1, 0),),
                           commit=(0, genesis.hash)).encode()
        for index in holders:
            await stores[index].append([genesis])
            await stores[index].put_cursor(STATE_PREFIX + key.hex(), state)


def messages(net: MemoryNetwork) -> int:
    return net.statistics().sent


@pytest.mark.slow
@pytest.mark.timeout(3000)
async def test_1000_nodes_holding_100000_chains_idle_at_a_cost_per_peer(
        plugins: Any, autojump_clock: Any) -> None:
    net = MemoryNetwork(seed=11)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, plugins, net, seed=11, overlay="kademlia",
                          anti_entropy=2.0, request_timeout=2.0,
                          options={"overlay": {"ping_interval": PING_INTERVAL}})
        ids = [int.from_bytes(cluster.identity(i).node_id, "big") for i in range(NODES)]
        started = time.process_time()
        placement = nearest_nodes(ids, R, CHAINS)
        await preload(cluster, placement)
        phases = {"preload": time.process_time() - started}
        for index in range(2):  # the others join through these two
            await cluster.start(index)
        async with trio.open_nursery() as starting:
            for index in range(2, NODES):
                starting.start_soon(cluster.start, index)
        phases["start"] = time.process_time() - started - sum(phases.values())
        await trio.sleep(60.0)  # tables fill, the first full rounds look at every chain
        phases["warm-up"] = time.process_time() - started - sum(phases.values())

        held = [cluster.nodes[i].replication_statistics().chains_held for i in range(NODES)]
        peers = [len(cluster.nodes[i]._replicator._shared()) for i in range(NODES)]
        assert sum(held) >= R * CHAINS
        before = messages(net)
        stats = [cluster.nodes[i].replication_statistics() for i in range(NODES)]
        await trio.sleep(600.0)
        sent = messages(net) - before
        after = [cluster.nodes[i].replication_statistics() for i in range(NODES)]
        phases["idle"] = time.process_time() - started - sum(phases.values())
        nursery.cancel_scope.cancel()

    minutes = 10
    rounds = sum(a.anti_entropy_rounds - b.anti_entropy_rounds for a, b in zip(after, stats))
    digests = [a.digests_sent - b.digests_sent for a, b in zip(after, stats)]
    siblings = 5 * R
    per_node_minute = sent / NODES / minutes
    # Per minute, a few messages (requests and replies) per peer the node shares chains
    # with, and a ping and its answer per sibling of the overlay and ping interval;
    # nothing per chain (a node holds about 300).
    pings = 2 * 60 / PING_INTERVAL
    bound = sum(8 * p + 2 * pings * siblings for p in peers) / NODES
    print(f"{NODES} nodes, {CHAINS} chains ({min(held)}-{max(held)} per node), "
          f"{sum(peers) / NODES:.1f} peers per node, {rounds / NODES:.0f} rounds per node: "
          f"{per_node_minute:.1f} messages per node per minute (bound {bound:.1f}), "
          f"{sum(digests) / NODES / minutes:.2f} digests sent per node per minute; cpu s "
          + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()))
    assert rounds / NODES >= 200
    assert per_node_minute <= bound
    # Anti-entropy with peers in step: each asked at most every few rounds.
    for node_digests, node_peers in zip(digests, peers, strict=True):
        assert node_digests <= minutes * 3 * node_peers, (node_digests, node_peers)
