"""Benchmark of the durable stores: batched appends against raw baselines, range reads.

Run: ``python bench/bench_store.py [--events N] [--chain N]``.

Appends: the ``sqlite`` store against ``sqlite3.executemany`` of the same rows
into the same schema (WAL, ``synchronous=FULL``, one transaction per batch),
and the ``file`` store against a raw ``write`` + ``fdatasync`` of the same
framed bytes per batch. Both baselines run in the same process right before
or after the store, on the same pre-signed events; the best of a few rounds
is reported. Range reads: a chain of ``--chain`` events read through
``Store.range`` (1000 per call, decoded and checked) and through the
``StoreReader`` (raw bytes, checked).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable

import trio

from ketten import Event, Identity, criterion_key
from ketten.interfaces import Store
from ketten.plugins.file_store import FileReader, FileStore
from ketten.plugins.file_store import _format as fmt
from ketten.plugins.sqlite_store import SqliteReader, SqliteStore
from ketten.plugins.sqlite_store._schema import SCHEMA_V1

BATCH = 500
ROUNDS = 5


def make_batches(total: int, criteria: int, batch: int, payload: int = 100) -> list[list[Event]]:
    ident = Identity.from_seed(b"\x51" * 32)
    keys = [criterion_key(f"bench-{i}") for i in range(criteria)]
    heads: dict[bytes, Event | None] = dict.fromkeys(keys)
    batches = []
    for n in range(total // batch):
        key = keys[n % criteria]
        events = []
        prev = heads[key]
        for _ in range(batch):
            seq = prev.seq + 1 if prev else 0
            prev = Event.create(ident, criterion=key, seq=seq, prev=prev.hash if prev else None,
                                payload=os.urandom(payload), time=seq, command=seq)
            events.append(prev)
        heads[key] = prev
        batches.append(events)
    return batches


def sqlite_baseline(path: str, batches: list[list[Event]]) -> float:
    conn = sqlite3.connect(os.path.join(path, "raw.sqlite3"), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    for statement in SCHEMA_V1:
        conn.execute(statement)
    rows = [[(e.criterion, e.seq, e.hash, e.author, e.command, e.to_bytes()) for e in b]
            for b in batches]
    start = time.perf_counter()
    for batch, rs in zip(batches, rows):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO events (criterion, seq, hash, author, command, raw)"
            " VALUES (?, ?, ?, ?, ?, ?)", rs)
        conn.execute(
            "INSERT INTO chains VALUES (?, ?, ?) ON CONFLICT(criterion) DO UPDATE SET"
            " head_seq = excluded.head_seq, head_hash = excluded.head_hash",
            (batch[-1].criterion, batch[-1].seq, batch[-1].hash))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


def file_baseline(path: str, batches: list[list[Event]]) -> float:
    data = [
        b"".join(fmt.frame(fmt.EVENT, e.to_bytes()) for e in b)
        + fmt.frame(fmt.COMMIT, fmt.COMMIT_BODY.pack(len(b)))
        for b in batches
    ]
    fd = os.open(os.path.join(path, "raw.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    start = time.perf_counter()
    for chunk in data:
        os.write(fd, chunk)
        os.fdatasync(fd)
    elapsed = time.perf_counter() - start
    os.close(fd)
    return elapsed


async def store_appends(store: Store, batches: list[list[Event]]) -> float:
    await store.open()
    start = time.perf_counter()
    for batch in batches:
        await store.append(batch)
    elapsed = time.perf_counter() - start
    await store.aclose()
    return elapsed


def best_of(fns: list[Callable[[str], float]]) -> list[float]:
    """The best time of each function over ``ROUNDS`` rounds, run alternately (shared machines)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(ROUNDS):
        for fn, slot in zip(fns, times):
            with tempfile.TemporaryDirectory(dir=".") as path:
                slot.append(fn(path))
    return [min(slot) for slot in times]


def bench_appends(batches: list[list[Event]]) -> None:
    events = sum(len(b) for b in batches)
    print(f"batched durable appends: {events} events in batches of {len(batches[0])}, "
          f"best of {ROUNDS} alternating rounds")

    def sqlite_store(path: str) -> float:
        return trio.run(store_appends, SqliteStore(path=os.path.join(path, "s")), batches)

    def file_store(path: str) -> float:
        return trio.run(store_appends, FileStore(path=os.path.join(path, "s")), batches)

    for name, ours_fn, raw_fn in [
        ("sqlite", sqlite_store, lambda p: sqlite_baseline(p, batches)),
        ("file", file_store, lambda p: file_baseline(p, batches)),
    ]:
        raw, ours = best_of([raw_fn, ours_fn])
        print(f"  {name:6s} store {events / ours:10,.0f} ev/s   baseline {events / raw:10,.0f} ev/s"
              f"   ratio {raw / ours:6.1%}")


async def fill(store: Store, chain: list[Event]) -> None:
    await store.open()
    for i in range(0, len(chain), 1000):
        await store.append(chain[i : i + 1000])


async def store_range(store: Store, key: bytes, height: int) -> float:
    start = time.perf_counter()
    count = 0
    for low in range(0, height, 1000):
        count += len(await store.range(key, low, low + 1000))
    assert count == height
    return time.perf_counter() - start


def bench_ranges(length: int) -> None:
    [chain] = make_batches(length, 1, length)
    key = chain[0].criterion
    print(f"range reads of a {length}-event chain ({len(chain[0].to_bytes())} B per event)")
    for name, factory, opener in [
        ("sqlite", lambda p: SqliteStore(path=p), SqliteReader),
        ("file", lambda p: FileStore(path=p), FileReader),
    ]:
        with tempfile.TemporaryDirectory(dir=".") as path:
            store = factory(path)

            async def run(store: Store = store) -> float:
                await fill(store, chain)
                try:
                    return min([await store_range(store, key, length) for _ in range(ROUNDS)])
                finally:
                    await store.aclose()

            elapsed = trio.run(run)
            start = time.perf_counter()
            reader = opener(path)
            opened = time.perf_counter() - start
            reads = []
            for _ in range(ROUNDS):
                start = time.perf_counter()
                count = sum(1 for _ in reader.read_encoded(key))
                reads.append(time.perf_counter() - start)
                assert count == length
            reader.close()
            print(f"  {name:6s} Store.range {length / elapsed:10,.0f} ev/s (decoded Events)"
                  f"   StoreReader.read_encoded {length / min(reads):10,.0f} ev/s (raw bytes)"
                  f"   reader open {opened * 1000:6.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--chain", type=int, default=100_000)
    args = parser.parse_args()
    bench_appends(make_batches(args.events, 5, BATCH))
    bench_ranges(args.chain)


if __name__ == "__main__":
    main()
