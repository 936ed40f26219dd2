"""A durable subscriber in its own process, killed with SIGKILL by ``test_subscriptions_crash.py``.

Usage: ``python subscriber_worker.py STORE_PATH RUN TOTAL SEED_ADDRESS... -- CRITERION...``

Opens a node (``lossy`` transport over TCP losing 10 % of frames, SQLite
store at STORE_PATH, static overlay), resumes the durable subscription
``worker`` and prints ``got <criterion hex> <seq> <hash hex>`` after every
``get()``; prints ``done`` and exits once the subscription has delivered
TOTAL events over its whole life.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).parent))

import lossy_transport

from ketten import NodeConfig, open_node, plugin_manager
from ketten.testing import deterministic_identity

SUBSCRIBER = 10


def config(path: str, run: int, seeds: list[str]) -> NodeConfig:
    return NodeConfig(
        identity=deterministic_identity(77, SUBSCRIBER), transport="lossy", store="sqlite",
        overlay="static", request_timeout=0.5,
        options={
            "transport": {"loss": 0.1, "seed": 1000 + run},
            "store": {"path": path},
            "overlay": {"seeds": seeds, "interval": 0.5},
            "replication": {"anti_entropy": 1.0},
            "subscriptions": {"ttl": 6.0, "check": 1.0},
        },
    )


async def main(path: str, run: int, total: int, seeds: list[str], criteria: list[str]) -> None:
    pm = plugin_manager(extra=(lossy_transport,))
    async with open_node(config(path, run, seeds), plugins=pm) as node:
        sub = await node.durable_subscription("worker", criteria)
        print("ready", sub.delivered, flush=True)
        while sub.delivered < total:
            event = await sub.get()
            print("got", event.criterion.hex(), event.seq, event.hash.hex(), flush=True)
        print("done", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    split = args.index("--")
    head, names = args[:split], args[split + 1:]
    trio.run(main, head[0], int(head[1]), int(head[2]), head[3:], names)
