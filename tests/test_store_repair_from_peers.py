"""A broker whose SQLite file lost committed events gets them back from its peers.

The store finds the damage when it opens (a hole below the head, or a chain
row that names events that are gone), quarantines the range, and the chain's
leader sends the missing events as to any broker that is behind.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from ketten import criterion_key
from ketten.errors import KettenError, StoreCorrupted
from ketten.testing import Cluster, open_cluster


async def _committed_everywhere(cluster: Cluster, key: bytes, seq: int) -> int:
    """Wait until all three brokers know ``seq`` committed; the leader's index."""
    with trio.fail_after(30):
        while True:
            replicas = [cluster[i]._replicator.loaded(key) for i in range(3)]
            leaders = [i for i, r in enumerate(replicas) if r is not None and r.is_leader]
            if leaders and all(r is not None and r.commit is not None and r.commit[0] == seq
                               for r in replicas):
                return leaders[0]
            await trio.sleep(0.1)


@pytest.mark.parametrize("damage", ["DELETE FROM events WHERE seq = 7",
                                    "DELETE FROM events WHERE seq >= 12"])
async def test_committed_events_lost_on_disk_are_fetched_again(tmp_path: Path,
                                                               damage: str) -> None:
    async with open_cluster(3, store="sqlite", path=str(tmp_path), seed=41,
                            settle=1.0) as cluster:
        key = criterion_key("repaired")
        events = [await cluster[0].publish(key, b"event %d" % n, deadline=20)
                  for n in range(20)]
        with trio.fail_after(30):
            while True:
                heads = [await cluster[i].store.head(key) for i in range(3)]
                if all(h is not None and h.seq == 19 for h in heads):
                    break
                await trio.sleep(0.1)
        victim = 2
        await cluster.stop(victim)
        conn = sqlite3.connect(tmp_path / f"node{victim}" / "ketten.sqlite3")
        conn.execute(damage)
        conn.commit()
        conn.close()
        node = await cluster.start(victim)
        assert node.store.head_repairs()  # type: ignore[attr-defined]
        with trio.fail_after(60):
            while (await node.store.quarantined()  # type: ignore[attr-defined]
                   or (await node.store.head(key)) != events[-1]):
                await trio.sleep(0.2)
        assert await node.store.range(key) == events
        await cluster[0].publish(key, b"after the repair", deadline=20)


async def test_a_file_store_cut_below_its_commit_mark_is_refilled(tmp_path: Path) -> None:
    """The file store cuts a last batch whose COMMIT record is damaged or missing;
    when that batch was committed, the broker's commit mark (kept apart from the
    segments) is above its head, and the leader refills it."""
    async with open_cluster(3, store="file", path=str(tmp_path), seed=42,
                            settle=1.0) as cluster:
        key = criterion_key("cut")
        events = [await cluster[0].publish(key, b"event %d" % n, deadline=20)
                  for n in range(12)]
        leader = await _committed_everywhere(cluster, key, 11)
        victim = (leader + 1) % 3
        await cluster.stop(victim)
        segment = tmp_path / f"node{victim}" / "seg-00000000.log"
        segment.write_bytes(segment.read_bytes()[:-7])
        node = await cluster.start(victim)
        with trio.fail_after(60):
            while (await node.store.head(key)) != events[-1]:
                await trio.sleep(0.2)
        assert await node.store.range(key) == events


@pytest.mark.parametrize("role", ["leader", "follower"])
async def test_a_broker_that_finds_a_damaged_event_quarantines_and_refills_it(
        tmp_path: Path, role: str) -> None:
    """A bit flips in a running broker's segment file. The next read that meets it
    fails with StoreCorrupted; the broker (a leader steps down first) gives the chain
    up from there and fetches it again from the other members; nothing committed is
    lost and the chain goes on."""
    async with open_cluster(3, store="file", path=str(tmp_path), seed=43,
                            settle=1.0) as cluster:
        key = criterion_key("flipped")
        events = [await cluster[0].publish(key, b"payload-%06d-" % n + b"x" * 40,
                                           deadline=20) for n in range(30)]
        leader = await _committed_everywhere(cluster, key, 29)
        victim = leader if role == "leader" else (leader + 1) % 3
        node = cluster[victim]
        segment = tmp_path / f"node{victim}" / "seg-00000000.log"
        data = bytearray(segment.read_bytes())
        at = data.find(b"payload-000012-") + 20
        data[at] ^= 0x04
        with open(segment, "r+b") as f:
            f.seek(at)
            f.write(bytes([data[at]]))
        with pytest.raises(StoreCorrupted):
            await node.store.range(key)
        with trio.fail_after(60):
            while True:
                try:
                    # A read may be served from the other members before this
                    # broker's own copy is refilled: wait for both.
                    if (await node.read(key) == events
                            and await node.store.range(key) == events):
                        break
                except KettenError:
                    pass  # the first read meets the damage; the refill follows
                await trio.sleep(0.3)
        assert node.replication_statistics().quarantines == 1
        assert await node.store.quarantined() == {}  # type: ignore[attr-defined]
        more = await cluster[(victim + 1) % 3].publish(key, b"and on", deadline=20)
        assert more.seq == 30
