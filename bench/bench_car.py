"""CAR export and import of one chain, against writing the same bytes to a file.

A chain of ``events`` events (100-byte payloads) in a SQLite store directory
is exported with ``ketten export --car``, checked with ``ketten verify`` on
the CAR, and imported with ``ketten import`` into a fresh store directory.
Figures: seconds and MB/s (CAR bytes over time) of each, and of the
baseline, writing the CAR's bytes to a file and fsyncing it, in the same
run. Block building and checking alone (no files, no store) are shown too,
to say where the time goes.

    python bench/bench_car.py [events]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import trio

from ketten import Event, Identity, criterion_key
from ketten._cli import main
from ketten._core.car import read_car_header, read_car_sections
from ketten._core.chain_car import chain_blocks, chain_from_car
from ketten.plugins.sqlite_store import SqliteStore

CRITERION = "bench-car"


def make_chain(count: int) -> list[Event]:
    identity = Identity.from_seed(b"\x07" * 32)
    key = criterion_key(CRITERION)
    events: list[Event] = []
    for seq in range(count):
        events.append(Event.create(identity, criterion=key, seq=seq,
                                   prev=events[-1].hash if events else None,
                                   payload=(b"%08d" % seq) * 12 + b"abcd", time=seq,
                                   command=seq))
    return events


async def fill(path: Path, events: list[Event]) -> None:
    store = SqliteStore(path=str(path))
    await store.open()
    for i in range(0, len(events), 1000):
        await store.append(events[i:i + 1000])
    await store.aclose()


def timed(label: str, size: int, action: object) -> float:
    start = time.perf_counter()
    result = action() if callable(action) else None
    elapsed = time.perf_counter() - start
    if result not in (None, 0):
        raise SystemExit(f"{label}: exit status {result}")
    print(f"{label:<34} {elapsed:8.3f} s  {size / elapsed / 1e6:8.2f} MB/s", flush=True)
    return elapsed


def run(count: int) -> None:
    events = make_chain(count)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        trio.run(fill, root / "src", events)
        car = root / "chain.car"
        main(["export", CRITERION, "--car", str(car), "--data", str(root / "src")])
        data = car.read_bytes()
        size = len(data)
        raw = sum(len(e.to_bytes()) for e in events)
        print(f"{count} events, {raw / 1e6:.2f} MB of events, CAR {size / 1e6:.2f} MB")

        def write_file() -> None:
            with open(root / "plain.bin", "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())

        def blocks_only() -> None:
            for _ in chain_blocks(events):
                pass

        def check_only() -> None:
            roots, offset = read_car_header(data)
            chain_from_car(roots, read_car_sections(data, offset))

        base = timed("baseline: write the bytes + fsync", size, write_file)
        export = timed("ketten export --car", size,
                       lambda: main(["export", CRITERION, "--car", str(car),
                                     "--data", str(root / "src")]))
        timed("  of which: build the blocks", size, blocks_only)
        verify = timed("ketten verify FILE.car", size, lambda: main(["verify", str(car)]))
        imported = timed("ketten import", size,
                         lambda: main(["import", str(car), "--data", str(root / "dst")]))
        timed("  of which: check the CAR", size, check_only)
        print(f"export {export / base:.0f}x, verify {verify / base:.0f}x, "
              f"import {imported / base:.0f}x the baseline's time")


if __name__ == "__main__":
    run(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
