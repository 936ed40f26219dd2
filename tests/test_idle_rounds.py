"""Background cost of an idle node: per peer, not per chain (memory network, virtual time)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from ketten import criterion_key
from ketten._node.local_chains import STATE_PREFIX, LocalChains
from ketten.testing import open_cluster


def totals(cluster, field: str) -> int:
    return sum(getattr(cluster[i].replication_statistics(), field) for i in range(len(cluster)))


@pytest.mark.parametrize("overlay", ["kademlia", "static"])
async def test_an_idle_cluster_digests_per_peer_and_rarely(autojump_clock, overlay: str) -> None:
    async with open_cluster(8, overlay=overlay, seed=6, settle=5.0) as cluster:
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
        assert full <= rounds / 32 + 8, (full, rounds)
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


async def test_what_a_node_learns_is_stored_within_the_flush_period(autojump_clock) -> None:
    """The flush loop sleeps until something is to be stored, then writes it within
    ``commit_flush`` (1 s): a chain learned of by a node that holds no copy, and
    the commit marks its brokers learn."""
    async with open_cluster(4, overlay="static", seed=3, settle=3.0) as cluster:
        key = criterion_key("learned")
        outsider = cluster.others(key)[0]
        node = cluster[outsider]
        assert await node.store.get_cursor("ketten/known") is None
        await trio.sleep(30.0)  # idle: nothing is written
        assert await node.store.get_cursor("ketten/known") is None
        await node.publish("learned", b"first")
        await trio.sleep(1.5)
        known = await node.store.get_cursor("ketten/known")
        assert known is not None and key in [known[i:i + 32] for i in range(0, len(known), 32)]
        event = await node.publish("learned", b"second")
        await trio.sleep(1.5)
        for index in cluster.brokers(key):
            replica = await cluster[index]._replicator.replica(key)
            assert replica is not None and replica.commit == (1, event.hash)
            stored = await cluster[index].store.get_cursor(STATE_PREFIX + key.hex())
            assert stored is not None and event.hash in stored


async def test_a_commit_mark_alone_travels_one_way(autojump_clock) -> None:
    """Once a follower holds the events, the leader tells it of their commit in a
    one-way notice: one request per publish and follower, not two."""
    async with open_cluster(3, overlay="static", seed=4, settle=3.0) as cluster:
        key = criterion_key("told")
        await cluster[0].publish("told", b"first")
        await trio.sleep(2.0)
        requests, notices = totals(cluster, "append_requests"), totals(cluster, "commit_notices")
        for n in range(10):
            event = await cluster[n % 3].publish("told", b"%d" % n)
        await trio.sleep(0.5)
        requests = totals(cluster, "append_requests") - requests
        notices = totals(cluster, "commit_notices") - notices
        assert requests <= 2 * 10 + 2, requests
        assert notices >= 2 * 10 - 2, notices
        for index in cluster.brokers(key):
            replica = await cluster[index]._replicator.replica(key)
            assert replica is not None and replica.commit == (10, event.hash)


async def test_a_restarted_node_reads_no_chain_state_again_in_its_rounds(
        autojump_clock, monkeypatch) -> None:
    """A node loads every chain's replication state once, at start: its background
    rounds (which look at every chain now and then) never read one from the store."""
    reads: list[int] = []
    real = LocalChains.state

    async def counting(self: LocalChains, criterion: bytes) -> Any:
        reads.append(id(self))
        return await real(self, criterion)

    monkeypatch.setattr(LocalChains, "state", counting)
    async with open_cluster(4, overlay="static", seed=5, settle=3.0) as cluster:
        for n in range(40):
            await cluster[n % 4].publish(f"held-{n}", b"x")
        await trio.sleep(10.0)
        await cluster.stop(2)
        node = await cluster.start(2)
        held = node.replication_statistics().chains_held
        assert held >= 20
        rounds = node.replication_statistics().full_rounds
        await trio.sleep(400.0)  # a full round (every chain) every 64th round, ~2 minutes
        assert node.replication_statistics().full_rounds - rounds >= 3
        assert reads.count(id(node._chains)) == 0
