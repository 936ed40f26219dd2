"""ketten demo: a small cluster on the simulated network.

Starts several nodes on an in-process network with latency, jitter and
message loss (in virtual time, so it finishes at once), lets each node build
a signed chain, spreads the chains between the nodes, and shows that every
node ends up with byte-identical, verified copies.

    python examples/demo.py [--nodes 5] [--events 200] [--seed 1]
"""

from __future__ import annotations

import argparse
import hashlib

import trio
import trio.testing

import ketten
from ketten.adapters.memory import Faults, MemoryNetwork


async def run(nodes: int, events: int, seed: int) -> bool:
    network = MemoryNetwork(seed=seed, faults=Faults(latency=0.02, jitter=0.01, duplicate=0.05))
    plugins = ketten.plugin_manager()
    criteria = [ketten.criterion_key(f"sensor-{i}") for i in range(nodes)]
    async with trio.open_nursery() as nursery:

        async def serve(i: int, task_status: trio.TaskStatus[ketten.Node]) -> None:
            identity = ketten.Identity.from_seed(hashlib.sha256(b"demo%d-%d" % (seed, i)).digest())
            config = ketten.NodeConfig(identity=identity, options={"transport": {"network": network}})
            async with ketten.open_node(config, plugins=plugins) as node:
                task_status.started(node)
                await trio.sleep_forever()

        cluster = [await nursery.start(serve, i) for i in range(nodes)]
        print(f"started {nodes} nodes: {', '.join(n.address for n in cluster)}")

        # Every node writes its own chain, the first one with a writer policy.
        for i, node in enumerate(cluster):
            writers = [node.identity.public_key] if i == 0 else None
            await node.append_local(criteria[i], b"genesis of sensor-%d" % i, writers=writers)
            for n in range(1, events):
                await node.append_local(criteria[i], b"reading %d" % n, command=n)
        print(f"each node signed a chain of {events} events")

        # Spread: every node pulls every other node's chain (verifying each event).
        start = trio.current_time()
        for node in cluster:
            for owner, key in zip(cluster, criteria):
                if owner is not node:
                    await node.pull(owner.address, key)
        elapsed = trio.current_time() - start
        print(f"all chains replicated in {elapsed:.2f} s of simulated time")

        # A stranger may not write to the guarded chain.
        intruder = cluster[-1]
        head = await intruder.store.head(criteria[0])
        assert head is not None
        forged = ketten.Event.create(intruder.identity, criterion=criteria[0], seq=head.seq + 1,
                                     prev=head.hash, payload=b"not mine", time=0)
        try:
            await cluster[1].store_events([forged])
        except ketten.WriterNotAllowed as exc:
            print(f"refused a foreign writer: {exc}")

        identical = True
        for key in criteria:
            copies = {tuple(e.to_bytes() for e in await n.store.range(key)) for n in cluster}
            identical &= len(copies) == 1
        for node in cluster:
            stats = node.statistics()
            print(f"{stats.address}: {stats.events_appended} events stored, "
                  f"{stats.transport.requests_sent} requests sent, {stats.invalid_events} refused")
        net = network.statistics()
        print(f"network: {net.sent} messages, {net.duplicated} duplicated")
        print("every node holds byte-identical chains" if identical else "chains DIFFER")
        nursery.cancel_scope.cancel()
    return identical


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    ok = trio.run(run, args.nodes, args.events, args.seed,
                  clock=trio.testing.MockClock(autojump_threshold=0))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
