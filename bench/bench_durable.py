"""Durable subscriptions: events/s acknowledged, against raw SQLite commits.

A cluster of 5 nodes (memory network, real time, SQLite stores) holds
``events`` events of one criterion; a node outside its replica set drains
them through a durable subscription in two routes, and the baseline does in
a plain SQLite file what the transactional route must do at the least:

* ``cursor_in``: ``async with sub.next() as event:`` inserting one row per
  event into the application's database, the cursor committed in the same
  transaction;
* ``get()``: acknowledged by the next ``get()``, the cursor in the node's
  SQLite store;
* baseline: one transaction per event holding the same row and an update of
  a cursor blob of the same size.

Each route is run ``rounds`` times with a fresh subscription, interleaved
with the baseline; the best time of each is reported.

    python bench/bench_durable.py [events] [rounds]
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import trio

from ketten import criterion_key
from ketten.testing import open_cluster

CRITERION = "bench-durable"


def connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS effects (seq INTEGER, payload BLOB)")
    db.commit()
    return db


def raw_sqlite(path: Path, events: list[tuple[int, bytes]], cursor_size: int) -> float:
    db = connect(path)
    db.execute("CREATE TABLE cursor (name TEXT PRIMARY KEY, state BLOB)")
    db.execute("INSERT INTO cursor VALUES ('c', ?)", (bytes(cursor_size),))
    db.commit()
    start = time.perf_counter()
    for seq, payload in events:
        db.execute("INSERT INTO effects VALUES (?, ?)", (seq, payload))
        db.execute("UPDATE cursor SET state = ? WHERE name = 'c'",
                   (seq.to_bytes(8, "big") + bytes(cursor_size - 8),))
        db.commit()
    elapsed = time.perf_counter() - start
    db.close()
    return elapsed


async def run(count: int, rounds: int, root: Path) -> None:
    key = criterion_key(CRITERION)
    async with open_cluster(5, store="sqlite", path=str(root / "nodes"),
                            request_timeout=2.0) as cluster:
        publisher = cluster.nodes[0]
        outside = max(i for i in cluster.nodes if i not in cluster.brokers(key))
        for n in range(count):
            await publisher.publish(CRITERION, b"payload %06d" % n, command=n)
        node = cluster.nodes[outside]
        rows = [(n, b"payload %06d" % n) for n in range(count)]
        best = {"cursor_in": float("inf"), "get": float("inf"), "raw": float("inf")}
        for r in range(rounds):
            db = connect(root / f"app{r}.sqlite")
            sub = await node.durable_subscription(f"txn{r}", [CRITERION], cursor_in=db)
            start = time.perf_counter()
            for _ in range(count):
                async with sub.next() as event:
                    db.execute("INSERT INTO effects VALUES (?, ?)", (event.seq, event.payload))
            best["cursor_in"] = min(best["cursor_in"], time.perf_counter() - start)
            (state,) = db.execute("SELECT state FROM ketten_cursors").fetchone()
            await sub.aclose()
            db.close()

            sub = await node.durable_subscription(f"get{r}", [CRITERION])
            start = time.perf_counter()
            for _ in range(count):
                await sub.get()
            await sub.ack()
            best["get"] = min(best["get"], time.perf_counter() - start)
            assert sub.delivered == count
            await sub.aclose()

            best["raw"] = min(best["raw"], raw_sqlite(root / f"raw{r}.sqlite", rows, len(state)))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, "
          f"{count} events, best of {rounds}")
    for name, label in (("raw", "raw SQLite commits  "), ("cursor_in", "cursor_in next()    "),
                        ("get", "get() (node store)  ")):
        print(f"{label}: {count / best[name]:>8,.0f} events/s")
    print(f"  cursor_in / raw SQLite: {best['raw'] / best['cursor_in']:.2f}")
    print(f"  get()     / raw SQLite: {best['raw'] / best['get']:.2f}")


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with tempfile.TemporaryDirectory() as root:
        trio.run(run, count, rounds, Path(root))


if __name__ == "__main__":
    main()
