"""Foundation benchmarks: chain validation and the footprint of idle nodes.

Every figure is a ratio against a baseline measured in the same run (the
machine is shared and noisy); each side is timed several times, interleaved,
and the best run counts.

    python bench/bench_foundation.py [--events 100000] [--nodes 10000]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import time
from collections.abc import Callable

import cbor2
import trio
import trio.testing

import ketten
from ketten import Chain, Event, Identity, Verify, criterion_key, scan_encoded_chain
from ketten.adapters.memory import MemoryNetwork


def build_chain(n: int, payload: int = 200) -> list[bytes]:
    identity = Identity.from_seed(b"\x42" * 32)
    key = criterion_key("bench")
    out: list[bytes] = []
    prev = None
    for seq in range(n):
        event = Event.create(identity, criterion=key, seq=seq, prev=prev, payload=os.urandom(payload),
                             time=1_700_000_000_000 + seq, command=seq)
        prev = event.hash
        out.append(event.to_bytes())
    return out


def best_rate(n: int, fns: dict[str, Callable[[], object]], rounds: int = 5) -> dict[str, float]:
    best = dict.fromkeys(fns, 0.0)
    for _ in range(rounds):
        for name, fn in fns.items():
            gc.collect()
            start = time.perf_counter()
            fn()
            best[name] = max(best[name], n / (time.perf_counter() - start))
    return best


def bench_links(encoded: list[bytes]) -> None:
    sha = hashlib.sha256
    loads = cbor2.loads

    def raw() -> None:
        for data in encoded:
            loads(data)
            sha(data).digest()

    def scan() -> None:
        for _ in scan_encoded_chain(encoded, verify=Verify.LINKS):
            pass

    def events() -> None:
        chain = Chain(criterion_key("bench"), verify=Verify.LINKS)
        for data in encoded:
            chain.append(Event.from_bytes(data))

    rates = best_rate(len(encoded), {"raw": raw, "scan": scan, "events": events})
    print(f"hash-link validation, {len(encoded)} events of ~{len(encoded[0])} bytes")
    print(f"  baseline CBOR decode + SHA-256   {rates['raw']:12,.0f} events/s")
    print(f"  scan_encoded_chain(verify=links) {rates['scan']:12,.0f} events/s  "
          f"ratio {rates['scan'] / rates['raw']:.2f}  (target >= 0.50)")
    print(f"  Chain.append(Event.from_bytes)   {rates['events']:12,.0f} events/s  "
          f"ratio {rates['events'] / rates['raw']:.2f}")


def bench_full(encoded: list[bytes]) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from nacl.bindings import crypto_sign_open

    decoded = [Event.from_bytes(d) for d in encoded]
    signed = [(e.sig, e.signed_bytes()) for e in decoded]
    joined = [sig + data for sig, data in signed]
    author = decoded[0].author
    key = Ed25519PublicKey.from_public_bytes(author)

    def raw() -> None:
        for message in joined:
            crypto_sign_open(message, author)

    def openssl() -> None:
        for sig, data in signed:
            key.verify(sig, data)

    def scan() -> None:
        for _ in scan_encoded_chain(encoded, verify=Verify.FULL):
            pass

    rates = best_rate(len(encoded), {"raw": raw, "openssl": openssl, "scan": scan}, rounds=3)
    print(f"full validation (signatures), {len(encoded)} events")
    print(f"  baseline raw Ed25519 verify      {rates['raw']:12,.0f} events/s  (libsodium, "
          "which ketten uses)")
    print(f"  raw Ed25519 verify, OpenSSL      {rates['openssl']:12,.0f} events/s  (for reference)")
    print(f"  scan_encoded_chain(verify=full)  {rates['scan']:12,.0f} events/s  "
          f"ratio {rates['scan'] / rates['raw']:.2f}  (target >= 0.80)")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bench_idle_nodes(count: int) -> None:
    async def main() -> tuple[int, int]:
        network = MemoryNetwork(seed=1)
        plugins = ketten.plugin_manager()
        gc.collect()
        before = rss_bytes()
        async with trio.open_nursery() as nursery:

            async def node(i: int, task_status: trio.TaskStatus[None]) -> None:
                config = ketten.NodeConfig(
                    identity=Identity.from_seed(hashlib.sha256(b"%d" % i).digest()),
                    options={"transport": {"network": network}},
                )
                async with ketten.open_node(config, plugins=plugins):
                    task_status.started()
                    await trio.sleep_forever()

            for i in range(count):
                await nursery.start(node, i)
            gc.collect()
            after = rss_bytes()
            nursery.cancel_scope.cancel()
        return before, after

    before, after = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    used = after - before
    print(f"{count} idle nodes (memory transport, memory store, identity)")
    print(f"  resident memory {used / 2**20:,.0f} MiB, {used / count / 1024:.1f} KiB per node "
          f"(budget 2048 MiB: {'ok' if used < 2 * 2**30 else 'OVER'})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--signed", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    encoded = build_chain(args.events)
    bench_links(encoded)
    bench_full(encoded[: args.signed])
    bench_idle_nodes(args.nodes)


if __name__ == "__main__":
    main()
