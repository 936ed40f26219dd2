"""ketten from an asyncio program: a node alone, 100 publishes in flight at once,
a subscriber task and a durable subscription.

    python examples/asyncio_app.py
"""

from __future__ import annotations

import asyncio

import ketten
import ketten.aio


async def main() -> None:
    async with ketten.aio.open_node(ketten.NodeConfig()) as node:
        async with node.subscribe("orders") as sub:

            async def count(wanted: int) -> int:
                seen = 0
                async for _event in sub:
                    seen += 1
                    if seen == wanted:
                        return seen
                return seen

            watcher = asyncio.create_task(count(100))
            events = await asyncio.gather(*(node.publish("orders", b"order %d" % n, command=n)
                                            for n in range(100)))
            print("published", len(events), "events; seqs", min(e.seq for e in events), "to",
                  max(e.seq for e in events))
            print("the subscriber saw", await asyncio.wait_for(watcher, 60))
        billing = await node.durable_subscription("billing", ["orders"])
        first = await billing.get()
        print("durable subscription starts at seq", first.seq, first.payload.decode())
        await billing.ack()
        await billing.aclose()
    print("done")


if __name__ == "__main__":
    asyncio.run(main())
