"""SIGKILL a process in the middle of writing batches, many times; nothing reported is lost."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from ketten import Chain, Verify, criterion_key
from ketten.interfaces import Store
from ketten.plugins.file_store import FileStore
from ketten.plugins.sqlite_store import SqliteStore

WORKER = Path(__file__).with_name("store_crash_worker.py")
SCRATCH = criterion_key("crash-scratch")
ROUNDS = 12


def _run_and_kill(kind: str, path: Path, run: int, rng: random.Random) -> list[str]:
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), kind, str(path), str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def collect() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("ready"):
                ready.set()

    thread = threading.Thread(target=collect)
    thread.start()
    if run % 4 == 3:
        time.sleep(rng.uniform(0.05, 0.6))  # may land while the store opens or recovers
    else:
        assert ready.wait(30), "the worker did not start"
        time.sleep(rng.uniform(0.01, 0.3))
    proc.kill()
    proc.wait()
    thread.join()
    assert proc.stderr is not None
    errors = proc.stderr.read()
    proc.stderr.close()
    assert proc.returncode == -9, f"the worker died on its own: {errors}"
    return lines


async def _verify(store: Store, reported: set[int], cursors: set[int]) -> int:
    await store.open()
    try:
        batches: dict[int, list[tuple[int, int]]] = {}
        heads = await store.heads()
        total = 0
        for criterion in heads:
            if criterion == SCRATCH:
                continue
            events = await store.range(criterion)
            Chain(criterion, verify=Verify.FULL, events=events)
            total += len(events)
            for event in events:
                batch, index, count = (int(x) for x in event.payload.split(b":")[:3])
                batches.setdefault(batch, []).append((index, count))
        for batch, parts in batches.items():
            count = parts[0][1]
            assert sorted(i for i, _ in parts) == list(range(count)), (
                f"batch {batch} is only partly visible: {sorted(parts)}"
            )
        lost = reported - set(batches)
        assert not lost, f"{len(lost)} batches reported durable are missing, e.g. {min(lost)}"
        cursor = await store.get_cursor("progress")
        if cursors:
            assert cursor is not None and int(cursor) >= max(cursors)
        return total
    finally:
        await store.aclose()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_sigkill_while_writing_loses_no_reported_batch(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "store"
    rng = random.Random(f"crash-{kind}")
    reported: set[int] = set()
    cursors: set[int] = set()
    totals = []
    for run in range(ROUNDS):
        for line in _run_and_kill(kind, path, run, rng):
            word, _, number = line.partition(" ")
            if word == "ok":
                reported.add(int(number))
            elif word == "cursor":
                cursors.add(int(number))
        store: Store = SqliteStore(path=str(path)) if kind == "sqlite" else FileStore(path=str(path))
        totals.append(trio.run(_verify, store, reported, cursors))
    assert reported, "no batch was ever reported durable"
    assert totals == sorted(totals)
    if kind == "file":  # the worker compacted, and kills landed in compactions too
        assert (path / "KETTEN-FILE-STORE").read_bytes().endswith(b"format 2\n")
