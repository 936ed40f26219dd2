"""Live causal delivery through the public API, against the sans-IO plugin alone.

20 authors (nodes with vector clocks, in one process of their own, on
loopback TCP) publish ``events`` events on 4 criteria, each reading another
chain now and then so that events depend on each other across criteria.
Then a subscriber node, in this process and brokering none of the chains,
joins, subscribes to all 4 with ``delivery="causal"`` from seq 0 and drains
them: fetched from the brokers, verified, stored, held back and released by
the feed. The subscriber runs as its own process, as in a deployment: the
figure is its work, not the 20 other nodes' background traffic. Each round
starts a new subscriber node with an empty store, once with its signature
checks on the event loop (``verify_threads`` 0) and once on worker threads
(the default on a real network).

The baseline is the ``causal`` plugin alone, offered the same events (in
chain order per criterion, criteria interleaved) in the same run, and the
signature checks alone (every event verified once). Best of ``rounds`` for
each.

    python bench/bench_live_causal.py [events] [rounds]
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import trio

from ketten import Event, Identity, NodeConfig, criterion_key, open_node, plugin_manager, tune_gc
from ketten.errors import KettenError
from ketten.plugins.causal_delivery import CausalDelivery
from ketten.testing import Cluster, deterministic_identity

AUTHORS = 20
REPLICATION = 3
CRITERIA = [f"live-causal-{n}" for n in range(4)]


# -- the authors' process ------------------------------------------------------------


async def publish_all(cluster: Cluster, count: int) -> None:
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
    for name in CRITERIA:
        await cluster.nodes[0].read(name, deadline=30.0)


async def authors(count: int) -> None:
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, plugin_manager(), transport="tcp", request_timeout=2.0,
                          anti_entropy=2.0, replication=REPLICATION,
                          options={"overlay": {"interval": 1.0}})
        for index in range(AUTHORS):
            await cluster.start(index, clock="vector")
        await trio.sleep(2.0)
        await publish_all(cluster, count)
        print("READY", cluster.nodes[0].address, flush=True)
        await trio.wrap_file(sys.stdin).readline()
        nursery.cancel_scope.cancel()


# -- the subscriber (this process) ---------------------------------------------------


def outsider(rounds: int) -> list[Identity]:
    """``rounds`` identities that none of the criteria would have as a broker."""
    keys = [int.from_bytes(criterion_key(name), "big") for name in CRITERIA]
    ids = [int.from_bytes(deterministic_identity(0, i).node_id, "big") for i in range(AUTHORS)]
    worst = [sorted(i ^ k for i in ids)[REPLICATION - 1] for k in keys]
    found: list[Identity] = []
    seed = 0
    while len(found) < rounds:
        seed += 1
        identity = Identity.from_seed(seed.to_bytes(32, "big"))
        mine = int.from_bytes(identity.node_id, "big")
        if all(mine ^ k > w for k, w in zip(keys, worst, strict=True)):
            found.append(identity)
    return found


async def drain(identity: Identity, seed: str, total: int, threads: int | None,
                ) -> tuple[float, float, dict[bytes, list[Event]]]:
    """Wall and CPU seconds a new subscriber node took to deliver all ``total``
    events, and the events per criterion in chain order (``threads``: its
    ``verify_threads``, ``None`` for the default)."""
    replication = {} if threads is None else {"verify_threads": threads}
    config = NodeConfig(identity=identity, transport="tcp", store="memory", overlay="static",
                        clock="vector", request_timeout=2.0,
                        options={"transport": {"listen": "127.0.0.1:0"},
                                 "overlay": {"seeds": [seed], "interval": 1.0},
                                 "replication": replication})
    chains: dict[bytes, list[Event]] = {criterion_key(name): [] for name in CRITERIA}
    async with open_node(config) as node:
        assert node.overlay is not None
        with trio.fail_after(30):
            while node.overlay.statistics().live < AUTHORS:
                await trio.sleep(0.05)
        got = 0
        cpu = time.process_time()
        start = time.perf_counter()
        async with node.subscribe(CRITERIA, delivery="causal") as sub:
            async for event in sub:
                chains[event.criterion].append(event)
                got += 1
                if got == total:
                    break
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    for events in chains.values():
        events.sort(key=lambda e: e.seq)
    return wall, cpu, chains


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
    """The signature checks a reader cannot skip: every event verified once (decoded
    afresh: an event that verified once is not checked again)."""
    fresh = [Event.from_bytes(event.to_bytes()) for events in chains.values()
             for event in events]
    start = time.perf_counter()
    for event in fresh:
        event.verify()
    return time.perf_counter() - start


def main() -> None:
    if sys.argv[1:2] == ["--authors"]:
        trio.run(authors, int(sys.argv[2]))
        return
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    total = count // AUTHORS * AUTHORS
    proc = subprocess.Popen([sys.executable, __file__, "--authors", str(count)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline().split()
        if line[:1] != ["READY"]:
            raise RuntimeError("the authors' process failed")
        tune_gc()  # as ``ketten serve`` does
        best_plugin = best_verify = float("inf")
        live: dict[int | None, float] = {0: float("inf"), None: float("inf")}
        cpus = dict(live)
        identities = outsider(2 * rounds)
        for _ in range(rounds):
            for threads in (0, None):
                wall, cpu, chains = trio.run(drain, identities.pop(), line[1], total, threads)
                live[threads], cpus[threads] = min(live[threads], wall), min(cpus[threads], cpu)
            best_plugin = min(best_plugin, plugin_alone(chains))
            best_verify = min(best_verify, verify_alone(chains))
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {total} events "
          f"by {AUTHORS} authors on {len(CRITERIA)} criteria, best of {rounds}")
    print(f"causal plugin alone       : {total / best_plugin:>10,.0f} events/s")
    print(f"signature checks alone    : {total / best_verify:>10,.0f} events/s (one core)")
    for threads, how in ((0, "signatures on the event loop"),
                         (None, "signatures on worker threads, the default")):
        print(f"live causal subscription  : {total / live[threads]:>10,.0f} events/s "
              f"({how}; {cpus[threads] / total * 1e6:.0f} µs CPU per event)")
        print(f"  live / plugin alone     : {best_plugin / live[threads]:.3f}")
        print(f"  live / signature checks : {best_verify / live[threads]:.3f}")


if __name__ == "__main__":
    main()
