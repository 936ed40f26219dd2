"""What each flood of a hostile peer costs a node, on loopback TCP.

    python bench/bench_floods.py [--requests 5000]

Four nodes (static overlay, memory stores, a creation burst of 200 chains
per author and broker, then one per second) run in this process; one hostile peer floods one
broker. For each flood the figures are the growth of the process's resident
memory, the time the flood took, and how long an honest publish took after
it against one on the idle cluster measured in the same run:

* mutated bodies to every service (tests/adversarial/hostile.py);
* subscription leases with fresh ids (bounded per subscriber);
* silent connections from one address (bounded per source);
* new chains from one author (bounded per broker; last, since the chains stay).
"""

from __future__ import annotations

import argparse
import gc
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "adversarial"))

from hostile import HostilePeer, mutations

import ketten
from ketten import Node, QuotaExceeded, criterion_key
from ketten.adapters.tcp import parse_address
from ketten.testing import open_cluster
from ketten.wire import decode_message


def heap() -> int:
    """Resident memory of this process, in bytes."""
    gc.collect()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def honest_publish(node: Node, key: bytes, n: int) -> float:
    began = time.perf_counter()
    await node.publish(key, b"honest %d" % n, deadline=20.0)
    return time.perf_counter() - began


async def main(requests: int) -> None:
    recorded: list[tuple[str, Any]] = []
    handle = Node.handle_request

    async def record(self: Node, peer: Any, data: bytes) -> bytes:
        if len(recorded) < 2000:
            recorded.append(decode_message(data))
        return await handle(self, peer, data)

    Node.handle_request = record  # type: ignore[method-assign]
    async with open_cluster(4, plugins=ketten.plugin_manager(), transport="tcp",
                            overlay="static", settle=1.0, request_timeout=2.0,
                            options={"replication": {"creation_burst": 200,
                                                     "creations_per_second": 1}}) as c:
        key = criterion_key("floods")
        victim = c.nodes[c.brokers(key)[0]]
        writer = c.nodes[c.others(key)[0]]
        for i in range(20):
            await writer.publish(key, b"warm %d" % i)
        Node.handle_request = handle  # type: ignore[method-assign]
        by_service: dict[str, list[tuple[str, Any]]] = {}
        for service, body in recorded:
            by_service.setdefault(service, []).append((service, body))
        sample = [pair for pairs in by_service.values() for pair in pairs[:40]]
        idle = min([await honest_publish(writer, key, i) for i in range(5)])
        print(f"4 nodes in one process, loopback TCP; honest publish on the idle cluster "
              f"{idle * 1e3:.1f} ms; resident memory {heap() / 2**20:.1f} MiB")

        async def bodies() -> str:
            peer = HostilePeer(victim.address)
            kinds: dict[str, int] = {}
            for service, body in mutations(sample, requests, 1):
                kind, _ = await peer.request(service, body, timeout=10.0)
                kinds[kind] = kinds.get(kind, 0) + 1
            await peer.aclose()
            return f"{requests} requests: {kinds}"

        async def leases() -> str:
            peer = HostilePeer(victim.address)
            for version in range(1, requests + 1):
                await peer.request("sub", {"op": "lease", "s": secrets.token_bytes(16),
                                           "c": [key], "v": version, "t": 60_000,
                                           "live": True}, timeout=10.0)
            await peer.aclose()
            stats = victim.subscription_statistics()
            return f"{requests} leases: {stats.leases} kept, {stats.leases_refused} refused"

        async def chains() -> str:
            started = refused = failed = 0
            for i in range(min(requests, 2000)):
                try:
                    await victim.publish(criterion_key(f"flood {i}"), b"x")
                    started += 1
                except QuotaExceeded:
                    refused += 1
                except ketten.KettenError:
                    failed += 1
            return (f"{started + refused + failed} new chains of one author: {started} "
                    f"started, {refused} refused, {failed} failed otherwise")

        async def connections() -> str:
            host, port = parse_address(victim.address)
            streams = []
            for _ in range(200):
                streams.append(await trio.open_tcp_stream(host, port, local_address="127.0.0.9"))
            await trio.sleep(0.5)
            stats = victim.transport.statistics()
            for stream in streams:
                await trio.aclose_forcefully(stream)
            return f"200 silent connections: {stats.refused_per_source} refused at once"

        floods: list[tuple[str, Callable[[], Awaitable[str]]]] = [
            ("mutated bodies", bodies), ("lease flood", leases),
            ("silent connections", connections), ("chain creations", chains)]
        for n, (name, flood) in enumerate(floods):
            before = heap()
            began = time.perf_counter()
            what = await flood()
            took = time.perf_counter() - began
            grown = heap() - before
            after = await honest_publish(writer, key, 100 + n)
            print(f"  {name:20s} {what}; {took:.1f} s; memory +{grown / 2**20:.1f} MiB; "
                  f"honest publish after it {after * 1e3:.1f} ms "
                  f"({after / idle:.1f} x idle)", flush=True)
        stats = victim.statistics()
        print(f"victim: internal errors {stats.internal_errors}, decode errors "
              f"{stats.decode_errors}, requests refused {stats.requests_refused}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    trio.run(main, parser.parse_args().requests)
