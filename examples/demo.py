"""ketten demo: a replicated event system on a simulated network.

Seven nodes join through the static overlay on an in-process network with
latency, jitter, message loss and duplication (in virtual time, so it
finishes at once). Three sensors publish to their own criteria; every event
is acknowledged by a majority of the criterion's r = 3 brokers. Midway one
node is cut off from the rest, publishing goes on, the partition heals and
anti-entropy brings every replica set back to byte-identical chains. An
idempotent command is sent twice and applied once, and a guarded chain
refuses a writer its genesis does not allow.

    python examples/demo.py [--events 60] [--seed 1]
"""

from __future__ import annotations

import argparse

import trio
import trio.testing

import ketten
from ketten.adapters.memory import Faults, MemoryNetwork
from ketten.testing import deterministic, deterministic_identity

NODES = 7
SENSORS = ("sensor-a", "sensor-b", "sensor-c")


async def run(events: int, seed: int) -> bool:
    network = MemoryNetwork(seed=seed, faults=Faults(latency=0.02, jitter=0.01, loss=0.05,
                                                     duplicate=0.02))
    plugins = ketten.plugin_manager()
    async with trio.open_nursery() as nursery:

        async def serve(i: int, seeds: list[str], task_status: trio.TaskStatus[ketten.Node]) -> None:
            config = ketten.NodeConfig(
                identity=deterministic_identity(seed, i), overlay="static", replication=3,
                options={"transport": {"network": network},
                         "overlay": {"seeds": seeds},
                         "replication": {"time": lambda: int(trio.current_time() * 1000)}},
            )
            async with ketten.open_node(config, plugins=plugins) as node:
                task_status.started(node)
                await trio.sleep_forever()

        first = await nursery.start(serve, 0, [])
        cluster = [first] + [await nursery.start(serve, i, [first.address]) for i in range(1, NODES)]
        await trio.sleep(5)  # membership spreads
        print(f"{NODES} nodes joined: {', '.join(n.address for n in cluster)}")

        async def sensor(index: int, name: str) -> None:
            node = cluster[index]
            for n in range(events):
                await node.publish(name, b"%s reading %d" % (name.encode(), n))
                if n == events // 2 and index == 0:
                    cut = cluster[-1].address
                    network.cut({cut})
                    print(f"t={trio.current_time():.1f}s: {cut} is cut off; publishing goes on")

        start = trio.current_time()
        async with trio.open_nursery() as sensors:
            for index, name in enumerate(SENSORS):
                sensors.start_soon(sensor, index, name)
        print(f"t={trio.current_time():.1f}s: {len(SENSORS) * events} events acknowledged by "
              f"majorities in {trio.current_time() - start:.1f} s of simulated time")
        network.heal()
        await trio.sleep(15)  # anti-entropy
        print(f"t={trio.current_time():.1f}s: partition healed, replicas caught up")

        # Idempotent commands: the retry returns the event already applied.
        agent = await ketten.Agent.open(cluster[1])
        command = await agent.next_command()
        once = await agent.publish("payments", b"pay 10 EUR", command=command)
        twice = await agent.publish("payments", b"pay 10 EUR", command=command)
        print(f"command {command} sent twice, applied once: {once == twice}")
        try:
            await agent.publish("payments", b"pay 99 EUR", command=command)
        except ketten.CommandIdReused as exc:
            print(f"same command id, other content: {type(exc).__name__}")

        # A chain whose genesis allows one writer.
        owner, stranger = cluster[2], cluster[3]
        await owner.publish("audit", b"genesis", writers=[owner.identity.public_key])
        try:
            await stranger.publish("audit", b"not mine")
        except ketten.WriterNotAllowed as exc:
            print(f"foreign writer refused: {type(exc).__name__}")

        await trio.sleep(10)  # the third broker of each chain catches up by anti-entropy
        identical = True
        for name in (*SENSORS, "payments", "audit"):
            key = ketten.criterion_key(name)
            brokers = await cluster[0].overlay.closest(key, 3)  # type: ignore[union-attr]
            by_address = {n.address: n for n in cluster}
            copies = set()
            for peer in brokers:
                stored = await by_address[peer.address].store.range(key)
                copies.add(tuple(e.hash for e in stored))
            height = len(next(iter(copies)))
            identical &= len(copies) == 1
            print(f"{name:9} {height:4} events on {len(brokers)} brokers, "
                  f"{'identical' if len(copies) == 1 else 'DIFFERENT'}")
        totals = [n.replication_statistics() for n in cluster]
        print(f"elections won {sum(t.elections_won for t in totals)}, events synced "
              f"{sum(t.events_synced for t in totals)}, anti-entropy rounds "
              f"{sum(t.anti_entropy_rounds for t in totals)}; network: "
              f"{network.statistics().sent} messages, {network.statistics().lost} lost")
        nursery.cancel_scope.cancel()
    return identical


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    ok = deterministic(lambda: trio.run(run, args.events, args.seed,
                                        clock=trio.testing.MockClock(autojump_threshold=0)))
    print("every replica set holds byte-identical chains" if ok else "replicas DIFFER")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
