"""A durable subscriber in its own process, killed with SIGKILL by ``test_subscriptions_crash.py``.

Usage: ``python subscriber_worker.py ROUTE IDENTITY STORE_PATH RUN TOTAL SEED_ADDRESS... -- CRITERION...``

Opens a node (``lossy`` transport over TCP losing 10 % of frames, SQLite
store at STORE_PATH, static overlay) and resumes the durable subscription
``worker``. ROUTE ``get``: prints ``got <criterion hex> <seq> <hash hex>``
after every ``get()`` (which acknowledges the event before). ROUTE ``txn``:
the application's own SQLite database ``STORE_PATH.app`` gets one row per
event in ``effects``, written in the ``next()`` block, whose transaction
also holds the cursor (``cursor_in``). Prints ``done`` and exits once
TOTAL events are acknowledged over the subscription's whole life.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).parent))

import lossy_transport

from ketten import NodeConfig, open_node, plugin_manager
from ketten.testing import deterministic_identity


def config(identity: int, path: str, run: int, seeds: list[str]) -> NodeConfig:
    return NodeConfig(
        identity=deterministic_identity(77, identity), transport="lossy", store="sqlite",
        overlay="static", request_timeout=0.5,
        options={
            "transport": {"loss": 0.1, "seed": 1000 * identity + run},
            "store": {"path": path},
            "overlay": {"seeds": seeds, "interval": 0.5},
            "replication": {"anti_entropy": 1.0},
            "subscriptions": {"ttl": 6.0, "check": 1.0},
        },
    )


def app_database(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path + ".app")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS effects (criterion TEXT, seq INTEGER, hash TEXT)")
    db.commit()
    return db


async def main(route: str, identity: int, path: str, run: int, total: int, seeds: list[str],
               criteria: list[str]) -> None:
    pm = plugin_manager(extra=(lossy_transport,))
    async with open_node(config(identity, path, run, seeds), plugins=pm) as node:
        if route == "get":
            sub = await node.durable_subscription("worker", criteria)
            print("ready", sub.delivered, flush=True)
            while sub.delivered < total:
                if sub.delivered + (sub.pending is not None) == total:
                    await sub.ack()
                    break
                event = await sub.get()
                print("got", event.criterion.hex(), event.seq, event.hash.hex(), flush=True)
        else:
            db = app_database(path)
            sub = await node.durable_subscription("worker", criteria, cursor_in=db)
            print("ready", sub.delivered, flush=True)
            while sub.delivered < total:
                async with sub.next() as event:
                    db.execute("INSERT INTO effects VALUES (?, ?, ?)",
                               (event.criterion.hex(), event.seq, event.hash.hex()))
            db.close()
        print("done", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    split = args.index("--")
    head, names = args[:split], args[split + 1:]
    trio.run(main, head[0], int(head[1]), head[2], int(head[3]), int(head[4]), head[5:], names)
