"""Writes batches to a store until killed; prints ``ok <batch>`` once each append returned.

Usage: ``python store_crash_worker.py KIND PATH RUN`` (KIND is ``sqlite`` or ``file``).
The file-store worker also fills and drops a scratch chain and compacts.
Used by ``test_store_crash.py``, which SIGKILLs it at random moments.
"""

from __future__ import annotations

import random
import sys

import trio

from ketten import Event, Identity, criterion_key
from ketten.interfaces import Store
from ketten.plugins.file_store import FileStore
from ketten.plugins.sqlite_store import SqliteStore

CRITERIA = [criterion_key(f"crash-{i}") for i in range(3)]
SCRATCH = criterion_key("crash-scratch")
"""A chain the file-store worker fills and drops, so that kills land in compactions too."""
WRITER = Identity.from_seed(b"\x31" * 32)


async def main(kind: str, path: str, run: int) -> None:
    store: Store = SqliteStore(path=path) if kind == "sqlite" else FileStore(path=path, segment_bytes=64 << 10)
    await store.open()
    heads: dict[bytes, Event | None] = {c: await store.head(c) for c in CRITERIA}
    rng = random.Random(run)
    print("ready", flush=True)
    batch = run * 1_000_000
    while True:
        batch += 1
        chosen = rng.sample(CRITERIA, rng.randint(1, 2))
        sizes = {c: rng.randint(1, 8) for c in chosen}
        count = sum(sizes.values())
        events: list[Event] = []
        index = 0
        for criterion in chosen:
            prev = heads[criterion]
            for _ in range(sizes[criterion]):
                prev = Event.create(
                    WRITER, criterion=criterion, seq=prev.seq + 1 if prev else 0,
                    prev=prev.hash if prev else None, time=batch,
                    payload=b"%d:%d:%d:" % (batch, index, count) + bytes(rng.randrange(200)),
                )
                events.append(prev)
                index += 1
            heads[criterion] = prev
        await store.append(events)
        sys.stdout.write(f"ok {batch}\n")
        if rng.random() < 0.2:
            await store.put_cursor("progress", b"%d" % batch)
            sys.stdout.write(f"cursor {batch}\n")
        sys.stdout.flush()
        if isinstance(store, FileStore):
            await _scratch(store, rng)


async def _scratch(store: FileStore, rng: random.Random) -> None:
    roll = rng.random()
    if roll < 0.3:
        head = await store.head(SCRATCH)
        events = []
        for _ in range(20):
            head = Event.create(WRITER, criterion=SCRATCH, seq=head.seq + 1 if head else 0,
                                prev=head.hash if head else None, time=0, payload=bytes(300))
            events.append(head)
        await store.append(events)
    elif roll < 0.4:
        await store.drop(SCRATCH)
    elif roll < 0.45:
        await store.compact()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
