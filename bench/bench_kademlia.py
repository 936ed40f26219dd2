"""Kademlia figures: lookup hops against log2(n), loopback lookups/s, memory per node.

Run: ``python bench/bench_kademlia.py``. Hops come from the deterministic
discrete-event simulation over the real routing tables and lookups (seeded);
lookups/s from 50 full nodes on the tcp transport in this process, with the
raw request round trip on the same sockets as the baseline; memory from
tracemalloc.
"""

from __future__ import annotations

import math
import random
import statistics
import time
import tracemalloc

import trio

import ketten
from ketten import NodeConfig, open_node
from ketten.adapters.memory import MemoryNetwork
from ketten.plugins.kademlia._sim import Simulation


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def simulated_hops(n: int) -> None:
    started = time.perf_counter()
    tracemalloc.start()
    sim = Simulation(seed=n)
    sim.grow(n)
    table_bytes, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    grown = time.perf_counter() - started
    alive = sim.alive()
    pairs = [(sim.rng.choice(alive), sim.rng.getrandbits(256)) for _ in range(1000)]
    started = time.perf_counter()
    lookups = sim.lookups(pairs)
    elapsed = time.perf_counter() - started
    hops = [lookup.statistics().hops for lookup in lookups]
    queries = [lookup.statistics().queries for lookup in lookups]
    exact = sum(sim.closest(src, lookup, 3) == sim.true_closest(target, 3)
                for (src, target), lookup in zip(pairs, lookups)) / len(pairs)
    contacts = statistics.mean(len(node.table) for node in alive)
    print(f"simulated n={n:>6}: hops median {statistics.median(hops):.0f}, "
          f"p99 {percentile(hops, 0.99)}, log2(n) {math.log2(n):.1f} "
          f"(median/log2 {statistics.median(hops) / math.log2(n):.2f}); "
          f"queries/lookup {statistics.mean(queries):.1f}; exact top-3 {exact:.1%}")
    print(f"{'':20}contacts/node {contacts:.0f}, routing state {table_bytes / n / 1024:.1f} KiB/node, "
          f"join {grown / n * 1000:.2f} ms/node, lookup {elapsed:.2f} ms CPU each "
          f"(simulated)".replace(f"{elapsed:.2f} ms", f"{elapsed / len(pairs) * 1000:.2f} ms"))


async def loopback(n: int, lookups: int) -> None:
    plugins = ketten.plugin_manager()
    rng = random.Random(50)
    async with trio.open_nursery() as nursery:
        nodes: list[ketten.Node] = []

        async def run(boot: list[str], task_status: trio.TaskStatus[ketten.Node]) -> None:
            config = NodeConfig(transport="tcp", overlay="kademlia",
                                options={"overlay": {"bootstrap": boot}})
            async with open_node(config, plugins=plugins) as node:
                task_status.started(node)
                await trio.sleep_forever()

        for _ in range(n):
            nodes.append(await nursery.start(run, [nodes[0].address] if nodes else []))
        keys = [rng.randbytes(32) for _ in range(lookups)]

        async def ping(node: ketten.Node, target: str) -> None:
            await node.call(target, "kad", {"op": "ping"})

        started = time.perf_counter()
        for i in range(lookups * 5):
            await ping(nodes[i % n], nodes[(i + 1) % n].address)
        rtt = (time.perf_counter() - started) / (lookups * 5)

        started = time.perf_counter()
        for i, key in enumerate(keys):
            overlay = nodes[i % n].overlay
            assert overlay is not None
            await overlay.closest(key, 3)
        sequential = lookups / (time.perf_counter() - started)

        started = time.perf_counter()
        async with trio.open_nursery() as batch:
            for i, key in enumerate(keys):
                overlay = nodes[i % n].overlay
                assert overlay is not None
                batch.start_soon(overlay.closest, key, 3)
        concurrent = lookups / (time.perf_counter() - started)
        print(f"loopback tcp, {n} nodes: {sequential:.0f} lookups/s one at a time, "
              f"{concurrent:.0f} lookups/s {lookups} at once; baseline request round trip "
              f"{rtt * 1e6:.0f} us ({1 / rtt:.0f}/s) -> one lookup costs "
              f"{1 / sequential / rtt:.1f} round trips of wall time")
        nursery.cancel_scope.cancel()


async def memory_per_node(n: int) -> None:
    plugins = ketten.plugin_manager()
    net = MemoryNetwork(seed=1)
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    async with trio.open_nursery() as nursery:
        nodes: list[ketten.Node] = []

        async def run(boot: list[str], task_status: trio.TaskStatus[ketten.Node]) -> None:
            config = NodeConfig(overlay="kademlia", options={
                "transport": {"network": net}, "overlay": {"bootstrap": boot}})
            async with open_node(config, plugins=plugins) as node:
                task_status.started(node)
                await trio.sleep_forever()

        for _ in range(n):
            nodes.append(await nursery.start(run, [nodes[0].address] if nodes else []))
        used, _ = tracemalloc.get_traced_memory()
        contacts = statistics.mean(
            node.overlay.statistics().contacts for node in nodes if node.overlay is not None)
        nursery.cancel_scope.cancel()
    tracemalloc.stop()
    print(f"memory: {(used - base) / n / 1024:.1f} KiB per full node (memory transport, store, "
          f"overlay; {contacts:.0f} contacts each, {n} nodes)")


def main() -> None:
    for n in (1000, 10_000):
        simulated_hops(n)
    trio.run(loopback, 50, 300)
    trio.run(memory_per_node, 300, clock=trio.testing.MockClock(autojump_threshold=0))


if __name__ == "__main__":
    import trio.testing

    main()
