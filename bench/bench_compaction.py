"""Compaction of the ``file`` store against copying the bytes it keeps.

A store of ``--chains`` chains with ``--events`` events in all (100-byte
payloads) has every other chain dropped, then :meth:`FileStore.compact`
rewrites the half that stays. Baseline, in the same run: reading the kept
bytes from a file and writing them to another with one ``fsync``; and, to
say where the time goes, hashing each kept record once (the check a
compaction makes of every record it copies). Also
measured: appends to another chain while the compaction runs (a writer is
never stopped for the copy, only for the switch and for each part of the
index pointed at the base), as the longest single append against the
longest append without a compaction beside it.

    python bench/bench_compaction.py [--events N] [--chains N]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time

import trio

from ketten import Event, Identity, criterion_key
from ketten.plugins.file_store import FileStore

IDENTITY = Identity.from_seed(b"\x61" * 32)


def make_chain(name: str, count: int, head: Event | None = None) -> list[Event]:
    key = criterion_key(name)
    events = []
    for n in range(count):
        head = Event.create(IDENTITY, criterion=key, seq=head.seq + 1 if head else 0,
                            prev=head.hash if head else None, time=n,
                            payload=(b"%08d" % n) * 12 + b"abcd")
        events.append(head)
    return events


def copy_bytes(src: str, dst: str, size: int) -> float:
    start = time.perf_counter()
    with open(src, "rb") as f, open(dst, "wb") as g:
        left = size
        while left:
            chunk = f.read(min(left, 4 << 20))
            if not chunk:
                break
            g.write(chunk)
            left -= len(chunk)
        g.flush()
        os.fsync(g.fileno())
    return time.perf_counter() - start


async def worst_append(store: FileStore, events: list[Event], stop: trio.Event | None) -> float:
    worst = 0.0
    for event in events:
        start = time.perf_counter()
        await store.append([event])
        worst = max(worst, time.perf_counter() - start)
        if stop is not None and stop.is_set():
            break
    return worst


async def main(total: int, chains: int) -> None:
    per = total // chains
    data = [make_chain(f"compact-{c}", per) for c in range(chains)]
    side = make_chain("side", 2000)
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStore(path=os.path.join(tmp, "store"), segment_bytes=64 << 20)
        await store.open()
        for events in data:
            for i in range(0, per, 500):
                await store.append(events[i:i + 500])
        quiet = await worst_append(store, side[:200], None)
        for c in range(0, chains, 2):
            await store.drop(criterion_key(f"compact-{c}"))
        log, live = store.log_bytes, store.live_bytes
        worst = 0.0
        done = trio.Event()

        async def beside() -> None:
            nonlocal worst
            worst = await worst_append(store, side[200:], done)

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(beside)
            freed = await store.compact()
            elapsed = time.perf_counter() - start
            done.set()
        print(f"store: {log / 1e6:.1f} MB, {live / 1e6:.1f} MB kept, {freed / 1e6:.1f} MB freed")
        folder = os.path.join(tmp, "store")
        biggest = max((n for n in os.listdir(folder) if n.startswith("seg-")),
                      key=lambda n: os.path.getsize(os.path.join(folder, n)))
        base = min(copy_bytes(os.path.join(folder, biggest), os.path.join(tmp, "copy"), live)
                   for _ in range(3))
        await store.aclose()
    kept = [e.to_bytes() for c in range(1, chains, 2) for e in data[c]]
    start = time.perf_counter()
    for raw in kept:
        hashlib.sha256(raw).digest()
    hashing = time.perf_counter() - start
    print(f"compaction     {elapsed:7.3f} s  {live / elapsed / 1e6:7.1f} MB/s kept")
    print(f"copy baseline  {base:7.3f} s  {live / base / 1e6:7.1f} MB/s")
    print(f"ratio (compaction speed / copy speed): {base / elapsed:.2f}")
    print(f"hashing each kept record alone: {hashing:.3f} s ({len(kept):,} records)")
    print(f"longest append beside it: {worst * 1e3:.1f} ms (without: {quiet * 1e3:.1f} ms)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--chains", type=int, default=100)
    args = parser.parse_args()
    trio.run(main, args.events, args.chains)
