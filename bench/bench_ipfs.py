"""Fetching a chain from 1, 5 and 20 providers of the ``ipfs`` overlay on loopback TCP.

21 nodes (TCP on 127.0.0.1, memory stores, one process) run the ``ipfs``
overlay; 20 of them hold a chain of ``events`` events (100-byte payloads)
as blocks. The 21st fetches the whole chain with
``IpfsOverlay.fetch_chain(head=...)`` from the first 1, 5 and 20 providers:
every block checked against its CID, the chain assembled along its links,
every event checked (link, signature) and the whole against the head.
Figures: events/s of each fetch, and as a ratio to the local verify bound
measured in the same run: the same blocks checked against their CIDs, links
and signatures with no network (what the fetching node does with them, and
all it could do at best).

    python bench/bench_ipfs.py [events] [rounds]
"""

from __future__ import annotations

import os
import sys
import time

import trio

from ketten import Event, Identity, check_successor, criterion_key
from ketten.interfaces import Peer
from ketten.ipld import decode_block, event_block
from ketten.plugins.ipfs import IpfsOverlay
from ketten.testing import open_cluster

KEY = criterion_key("bench-ipfs")


def make_chain(count: int) -> list[Event]:
    identity = Identity.from_seed(b"\x09" * 32)
    events: list[Event] = []
    for seq in range(count):
        events.append(Event.create(identity, criterion=KEY, seq=seq,
                                   prev=events[-1].hash if events else None,
                                   payload=(b"%08d" % seq) * 12 + b"abcd", time=seq))
    return events


def verify_bound(events: list[Event]) -> float:
    """Seconds to check every block of the chain against its CID, link and signature,
    locally."""
    blocks = [event_block(events[0], None)]
    for event in events[1:]:
        blocks.append(event_block(event, blocks[-1].binary))
    started = time.perf_counter()
    prev = None
    for block in blocks:
        checked = decode_block(block.binary, block.data)
        check_successor(prev, checked.event)
        prev = checked.event
    return time.perf_counter() - started


async def fetch_times(events: list[Event], counts: list[int], rounds: int) -> dict[int, float]:
    head = (events[-1].seq, events[-1].hash)
    holders = max(counts)
    async with open_cluster(holders + 1, transport="tcp", overlay="ipfs", settle=1.0,
                            options={"overlay": {"rpc_timeout": 10.0}}) as cluster:
        overlays = [cluster[i].overlay for i in range(holders + 1)]
        assert all(isinstance(o, IpfsOverlay) for o in overlays)
        for overlay in overlays[:holders]:
            assert isinstance(overlay, IpfsOverlay)
            overlay.add_chain(events, pin=True, provide=False)
        reader = overlays[holders]
        assert isinstance(reader, IpfsOverlay)
        providers = [Peer(cluster[i].address, cluster.identity(i).public_key)
                     for i in range(holders)]
        best: dict[int, float] = {}
        for _ in range(rounds):
            for count in counts:
                started = time.perf_counter()
                got = await reader.fetch_chain(KEY, head=head, providers=providers[:count],
                                               timeout=600.0)
                elapsed = time.perf_counter() - started
                assert got == events
                best[count] = min(best.get(count, float("inf")), elapsed)
        return best


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    events = make_chain(count)
    bound = min(verify_bound(events) for _ in range(rounds))
    best = trio.run(fetch_times, events, [1, 5, 20], rounds)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; a chain of "
          f"{count} events, best of {rounds}")
    print(f"local verify bound      : {count / bound:>10,.0f} events/s (CID, link and "
          "signature; no network)")
    for providers, seconds in sorted(best.items()):
        rate = count / seconds
        print(f"fetch from {providers:>2} provider{'s' if providers > 1 else ' '}: "
              f"{rate:>10,.0f} events/s   {rate * bound / count:.2f} of the bound")


if __name__ == "__main__":
    main()
