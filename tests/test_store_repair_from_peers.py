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
from ketten.testing import open_cluster


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
