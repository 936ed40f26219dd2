"""The sqlite store's in-memory view (heads, recent events, command index) and shared
transactions: memory always agrees with what is durable on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ketten import Event, Identity, criterion_key
from ketten.errors import StoreConflict
from ketten.plugins.sqlite_store import SqliteReader, SqliteStore

AUTHOR = Identity.from_seed(b"\x21" * 32)
A = criterion_key("cache-a")
B = criterion_key("cache-b")


def chain(criterion: bytes, length: int, *, after: Event | None = None, tag: bytes = b"",
          command_from: int | None = None) -> list[Event]:
    events: list[Event] = []
    prev = after
    for _ in range(length):
        seq = 0 if prev is None else prev.seq + 1
        command = None if command_from is None else command_from + len(events)
        prev = Event.create(AUTHOR, criterion=criterion, seq=seq,
                            prev=None if prev is None else prev.hash,
                            payload=tag + b"%d" % seq, time=seq, command=command)
        events.append(prev)
    return events


async def reopened(path: Path) -> SqliteStore:
    store = SqliteStore(path=str(path))
    await store.open()
    return store


def on_disk(path: Path, criterion: bytes) -> list[bytes]:
    reader = SqliteReader(str(path))
    try:
        return [raw for _, raw in reader.read_encoded(criterion)]
    finally:
        reader.close()


async def test_head_range_and_commands_follow_appends_and_reopen(tmp_path: Path) -> None:
    store = await reopened(tmp_path)
    events = chain(A, 100, command_from=1)
    try:
        assert await store.head(A) is None
        await store.append(events[:60])
        await store.append(events[60:])
        assert await store.head(A) == events[-1]
        assert await store.range(A, 95) == events[95:]
        assert await store.range(A, 10, 20) == events[10:20]
        assert await store.range(A, 200) == []
        assert await store.by_command(A, AUTHOR.public_key, 100) == events[99]
        assert await store.by_command(A, AUTHOR.public_key, 5) == events[4]
        assert await store.by_command(A, AUTHOR.public_key, 101) is None
        more = chain(A, 1, after=events[-1], command_from=101)
        await store.append(more)
        assert await store.by_command(A, AUTHOR.public_key, 101) == more[0]
        with pytest.raises(StoreConflict):
            await store.append(chain(A, 1, after=more[0], command_from=50))
        assert await store.head(A) == more[0]
    finally:
        await store.aclose()
    store = await reopened(tmp_path)
    try:
        assert dict(await store.heads()) == {A: (more[0].seq, more[0].hash)}
        assert await store.head(A) == more[0]
        assert await store.range(A) == events + more
        assert await store.by_command(A, AUTHOR.public_key, 7) == events[6]
        assert await store.by_command(A, AUTHOR.public_key, 102) is None
    finally:
        await store.aclose()


async def test_replace_from_and_quarantine_reset_memory(tmp_path: Path) -> None:
    store = await reopened(tmp_path)
    main = chain(A, 40, command_from=1)
    try:
        await store.append(main)
        assert await store.by_command(A, AUTHOR.public_key, 35) == main[34]
        branch = chain(A, 3, after=main[29], tag=b"branch", command_from=500)
        orphaned = await store.replace_from(A, 30, branch)
        assert orphaned == main[30:]
        assert await store.head(A) == branch[-1]
        assert await store.range(A, 28) == main[28:30] + branch
        assert await store.by_command(A, AUTHOR.public_key, 35) is None
        assert await store.by_command(A, AUTHOR.public_key, 501) == branch[1]
        assert dict(await store.heads()) == {A: (branch[-1].seq, branch[-1].hash)}

        assert await store.quarantine(A, 10) == 23
        assert await store.head(A) == main[9]
        assert await store.range(A, 5) == main[5:10]
        assert await store.by_command(A, AUTHOR.public_key, 501) is None
        assert await store.by_command(A, AUTHOR.public_key, 10) == main[9]
        await store.append(main[10:12])
        assert await store.head(A) == main[11]

        assert await store.replace_from(A, 0, []) == main[:12]
        assert await store.head(A) is None
        assert await store.range(A) == []
        assert dict(await store.heads()) == {}
    finally:
        await store.aclose()
    assert on_disk(tmp_path, A) == []


async def test_cancelled_appends_leave_store_and_memory_consistent(tmp_path: Path) -> None:
    store = await reopened(tmp_path)
    keys = [criterion_key(f"cancel-{i}") for i in range(8)]
    chains = {key: chain(key, 40) for key in keys}  # 16 rounds of 2 appends at most
    progress = dict.fromkeys(keys, 0)
    unseen = dropped = 0
    try:
        for round_ in range(16):
            before = dict(progress)
            first_done = trio.Event()
            async with trio.open_nursery() as nursery:

                async def writer(key: bytes, done: trio.Event) -> None:
                    n = progress[key]
                    await store.append(chains[key][n:n + 2])
                    progress[key] = n + 2
                    done.set()

                for key in keys:
                    nursery.start_soon(writer, key, first_done)
                # The first transaction holds one append, the next all others:
                # cancel while they wait in the queue, or at a different point
                # of the second transaction.
                if round_ % 2:
                    await first_done.wait()
                for _ in range(round_ // 2):
                    await trio.lowlevel.checkpoint()
                nursery.cancel_scope.cancel()
            for key in keys:
                head = await store.head(key)
                heads = dict(await store.heads())
                disk = on_disk(tmp_path, key)
                # Every append committed whole or not at all, whether or not
                # its caller saw it return, and memory says what the disk says.
                assert len(disk) % 2 == 0
                assert disk == [e.to_bytes() for e in chains[key][:len(disk)]]
                if disk:
                    assert head == chains[key][len(disk) - 1]
                    assert heads[key] == (head.seq, head.hash)
                else:
                    assert head is None and key not in heads
                assert progress[key] <= len(disk)
                unseen += progress[key] < len(disk)
                progress[key] = len(disk)
                dropped += len(disk) == before[key]
        assert unseen, "no cancelled caller's append was in a running transaction"
        assert dropped, "no cancelled append was taken out of the queue"
        assert any(progress.values()), "no append ever got through"
    finally:
        await store.aclose()


async def test_concurrent_writes_share_transactions_and_fail_alone(tmp_path: Path) -> None:
    store = await reopened(tmp_path)
    good = chain(A, 1)
    other = chain(B, 1)
    bad = chain(A, 1, tag=b"rival")  # a second genesis of A: refused
    outcomes: dict[str, BaseException | None] = {}
    try:
        async with trio.open_nursery() as nursery:

            async def run(name: str, events: list[Event]) -> None:
                try:
                    await store.append(events)
                    outcomes[name] = None
                except StoreConflict as exc:
                    outcomes[name] = exc

            nursery.start_soon(run, "good", good)
            nursery.start_soon(run, "bad", bad)
            nursery.start_soon(run, "other", other)
        assert outcomes["other"] is None
        assert [outcomes["good"], outcomes["bad"]].count(None) == 1
        winner = good if outcomes["good"] is None else bad
        assert await store.head(A) == winner[0]
        assert await store.head(B) == other[0]
        assert on_disk(tmp_path, A) == [winner[0].to_bytes()]
        assert on_disk(tmp_path, B) == [other[0].to_bytes()]
    finally:
        await store.aclose()


async def test_rivals_in_shared_transactions_one_wins_per_chain(tmp_path: Path) -> None:
    store = await reopened(tmp_path)
    keys = [criterion_key(f"rival-{i}") for i in range(8)]
    heads: dict[bytes, Event | None] = dict.fromkeys(keys)
    won: dict[bytes, list[list[Event]]] = {key: [] for key in keys}
    try:
        for round_ in range(10):
            offers = {key: [chain(key, 2, after=heads[key], tag=b"%d-%d" % (round_, n))
                            for n in range(3)] for key in keys}
            for winners in won.values():
                winners.clear()
            async with trio.open_nursery() as nursery:

                async def offer(key: bytes, events: list[Event]) -> None:
                    try:
                        await store.append(events)
                    except StoreConflict:
                        return
                    won[key].append(events)

                for n in range(3):
                    for key in keys:
                        nursery.start_soon(offer, key, offers[key][n])
            for key in keys:
                assert len(won[key]) == 1, f"round {round_}: {len(won[key])} rivals won"
                heads[key] = won[key][0][-1]
                assert await store.head(key) == heads[key]
                assert await store.range(key, heads[key].seq - 1) == won[key][0]
        for key in keys:
            assert on_disk(tmp_path, key) == [e.to_bytes() for e in await store.range(key)]
    finally:
        await store.aclose()
    store = await reopened(tmp_path)
    try:
        assert dict(await store.heads()) == {
            key: (event.seq, event.hash) for key, event in heads.items() if event is not None
        }
    finally:
        await store.aclose()
