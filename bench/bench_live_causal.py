"""Live causal delivery through the public API, against the sans-IO plugin alone.

20 authors (nodes on the memory network, real time, vector clocks) publish
``events`` events on 4 criteria, each reading another chain now and then so
that events depend on each other across criteria. Then a node that brokers
none of them subscribes to all 4 with ``delivery="causal"`` from seq 0 and
drains them: fetched from the brokers, verified, stored, held back and
released by the feed. The baseline is the ``causal`` plugin alone, offered
the same events (in chain order per criterion, criteria interleaved) in the
same run. Best of ``rounds`` for each.

    python bench/bench_live_causal.py [events] [rounds]
"""

from __future__ import annotations

import os
import random
import sys
import time

import trio

from ketten import Event, criterion_key, plugin_manager, tune_gc
from ketten.adapters.memory import MemoryNetwork
from ketten.errors import KettenError
from ketten.plugins.causal_delivery import CausalDelivery
from ketten.testing import Cluster

AUTHORS = 20
CRITERIA = [f"live-causal-{n}" for n in range(4)]


async def publish_all(cluster: Cluster, count: int) -> dict[bytes, list[Event]]:
    rng = random.Random(1)

    async def author(index: int, share: int) -> None:
        node = cluster.nodes[index]
        for n in range(share):
            if rng.random() < 0.3:
                try:
                    await node.read(rng.choice(CRITERIA), deadline=10.0)
                except KettenError:
                    pass
            while True:
                try:
                    await node.publish(rng.choice(CRITERIA), b"%d/%d" % (index, n), command=n,
                                       deadline=10.0)
                    break
                except KettenError:
                    await trio.sleep(0.1)

    async with trio.open_nursery() as nursery:
        for index in range(AUTHORS):
            nursery.start_soon(author, index, count // AUTHORS)
    return {criterion_key(name): await cluster.nodes[0].read(name, deadline=30.0)
            for name in CRITERIA}


def plugin_alone(chains: dict[bytes, list[Event]]) -> float:
    order: list[Event] = []
    pages = [list(events) for events in chains.values()]
    while any(pages):
        for page in pages:
            order.extend(page[:16])
            del page[:16]
    delivery = CausalDelivery(criteria=list(chains))
    start = time.perf_counter()
    out = 0
    for event in order:
        out += len(delivery.offer(event))
    for key, events in chains.items():
        out += len(delivery.note_head(key, events[-1].seq if events else None))
    elapsed = time.perf_counter() - start
    assert out == len(order), (out, len(order))
    return elapsed


def verify_alone(chains: dict[bytes, list[Event]]) -> float:
    """The signature checks a reader cannot skip: every event verified once."""
    start = time.perf_counter()
    for events in chains.values():
        for event in events:
            event.verify()
    return time.perf_counter() - start


async def run(count: int, rounds: int) -> None:
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, plugin_manager(), MemoryNetwork(seed=1), request_timeout=2.0,
                          anti_entropy=2.0, options={"overlay": {"interval": 1.0}})
        for index in range(AUTHORS + rounds):
            await cluster.start(index, clock="vector")
        await trio.sleep(2.0)
        chains = await publish_all(cluster, count)
        tune_gc()  # as ``ketten serve`` does: the subscriber's node runs as a node process
        total = sum(len(e) for e in chains.values())
        best_live = best_plugin = best_verify = float("inf")
        for r in range(rounds):
            reader = cluster.nodes[AUTHORS + r]
            got = 0
            start = time.perf_counter()
            async with reader.subscribe(CRITERIA, delivery="causal") as sub:
                async for _ in sub:
                    got += 1
                    if got == total:
                        break
            best_live = min(best_live, time.perf_counter() - start)
            best_plugin = min(best_plugin, plugin_alone(chains))
            best_verify = min(best_verify, verify_alone(chains))
        nursery.cancel_scope.cancel()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {total} events "
          f"by {AUTHORS} authors on {len(CRITERIA)} criteria, best of {rounds}")
    print(f"causal plugin alone       : {total / best_plugin:>10,.0f} events/s")
    print(f"live causal subscription  : {total / best_live:>10,.0f} events/s "
          f"(fetch, verify, store, hold back, release)")
    print(f"  live / plugin alone     : {best_plugin / best_live:.3f}")
    print(f"signature checks alone    : {total / best_verify:>10,.0f} events/s")
    print(f"  live / signature checks : {best_verify / best_live:.3f}")


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    trio.run(run, count, rounds)


if __name__ == "__main__":
    main()
