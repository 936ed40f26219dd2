"""Background cost of an idle node: per peer, not per chain (memory network, virtual time)."""

from __future__ import annotations

import trio

from ketten import criterion_key
from ketten.testing import open_cluster


def totals(cluster, field: str) -> int:
    return sum(getattr(cluster[i].replication_statistics(), field) for i in range(len(cluster)))


async def test_an_idle_cluster_digests_per_peer_and_rarely(autojump_clock) -> None:
    async with open_cluster(8, overlay="kademlia", seed=6, settle=5.0) as cluster:
        for n in range(60):
            await cluster[n % 8].publish(f"idle-{n}", b"x")
        await trio.sleep(30.0)  # commit marks told, moves settled
        rounds, full = totals(cluster, "anti_entropy_rounds"), totals(cluster, "full_rounds")
        digests = totals(cluster, "digests_sent")
        await trio.sleep(300.0)
        rounds, full = (totals(cluster, "anti_entropy_rounds") - rounds,
                        totals(cluster, "full_rounds") - full)
        digests = totals(cluster, "digests_sent") - digests
        peers = sum(len(cluster[i]._replicator._shared()) for i in range(8))
        # Without changes, rounds look at every chain only as a safety net, and each peer
        # hears at most every 16th round once its digests kept matching.
        assert full <= rounds / 8 + 8, (full, rounds)
        assert digests <= peers * (rounds / 8 / 16 + 6), (digests, peers, rounds)
        # Nothing was lost by slowing down: news travels at once again.
        event = await cluster[1].publish("idle-5", b"after")
        key = criterion_key("idle-5")
        with trio.fail_after(10):
            while True:
                held = [await cluster.chain(i, key) for i in cluster.brokers(key)]
                if all(chain and chain[-1].hash == event.hash for chain in held):
                    break
                await trio.sleep(0.5)
