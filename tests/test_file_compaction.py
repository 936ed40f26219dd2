"""Compaction of the ``file`` store: dropped chains give their disk space back,
nothing the store serves changes, and a crash at any step leaves a store that opens."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
import trio

from ketten import Event, Identity, criterion_key
from ketten.errors import StoreCorrupted, StoreError
from ketten.plugins import file_store
from ketten.plugins.file_store import FileReader, FileStore
from ketten.plugins.file_store import _format as fmt
from ketten.plugins.memory_store import MemoryStore

WRITER = Identity.from_seed(b"\x42" * 32)
OTHER = Identity.from_seed(b"\x43" * 32)


def _key(n: int) -> bytes:
    return criterion_key(f"compact-{n}")


def _events(criterion: bytes, head: Event | None, count: int, tag: bytes, *,
            command: int | None = None, size: int = 60) -> list[Event]:
    out = []
    for i in range(count):
        head = Event.create(
            WRITER if i % 2 else OTHER, criterion=criterion,
            seq=head.seq + 1 if head else 0, prev=head.hash if head else None, time=i,
            payload=tag + b"-%d-" % i + bytes(size),
            command=None if command is None else command + i,
        )
        out.append(head)
    return out


async def _dump(store: FileStore | MemoryStore, criteria: list[bytes]) -> dict[str, object]:
    """Everything a caller can see of the chains and cursors."""
    out: dict[str, object] = {"heads": dict(await store.heads()),
                              "cursors": await store.cursors("")}
    for criterion in criteria:
        main = await store.range(criterion)
        orphans = await store.orphans(criterion)
        out[criterion.hex()] = ([e.hash for e in main], [e.hash for e in orphans])
        for event in main + orphans:
            got = await store.get(event.hash)
            assert got is not None and got.hash == event.hash
        for event in main:
            if event.command is not None:
                found = await store.by_command(criterion, event.author, event.command)
                assert found is not None and found.hash == event.hash
    if isinstance(store, FileStore):
        out["quarantined"] = await store.quarantined()
    return out


async def _filled(path: Path, segment_bytes: int, chains: int, events: int,
                  tag: bytes) -> tuple[FileStore, list[bytes]]:
    """An open store with ``chains`` chains of ``events`` events each."""
    store = FileStore(path=str(path), segment_bytes=segment_bytes)
    await store.open()
    keys = [_key(n) for n in range(chains)]
    for criterion in keys:
        await store.append(_events(criterion, None, events, tag))
    return store, keys


def _segments(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith("seg-"))


async def test_compaction_gives_back_dropped_chains_and_keeps_everything_else(
        tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = FileStore(path=str(path), segment_bytes=4000)
    await store.open()
    keys = [_key(n) for n in range(4)]
    heads: dict[bytes, Event | None] = dict.fromkeys(keys)
    for round_ in range(6):
        for n, criterion in enumerate(keys):
            batch = _events(criterion, heads[criterion], 5, b"r%d" % round_,
                            command=round_ * 10 if n == 1 else None)
            await store.append(batch)
            heads[criterion] = batch[-1]
    # A fork: chain 2 keeps its lost branch as orphans; chain 3 has a quarantined range.
    main2 = await store.range(keys[2])
    replacement = _events(keys[2], main2[19], 4, b"fork")
    await store.replace_from(keys[2], 20, replacement)
    assert await store.quarantine(keys[3], 25) == 5
    await store.put_cursor("reader", b"17")
    before = await _dump(store, keys)
    orphans_before = len(await store.orphans(keys[2]))
    assert orphans_before == 10

    assert await store.drop(keys[0]) == 30
    expected = await _dump(store, keys)
    log_before = store.log_bytes
    freed = await store.compact()
    assert freed > 0 and store.log_bytes == log_before - freed
    assert store.log_bytes < log_before * 0.85  # a quarter of the records was dropped
    assert store.log_bytes - store.live_bytes < 2000  # framing of the base only
    assert await _dump(store, keys) == expected
    assert before["cursors"] == expected["cursors"]
    # Appends, forks and drops go on after the switch, on the base.
    more = _events(keys[1], heads[keys[1]], 3, b"after", command=900)
    await store.append(more)
    await store.drop(keys[2])
    expected = await _dump(store, keys)
    await store.aclose()

    assert (path / fmt.MARKER).read_bytes() == fmt.marker_bytes(2)
    first = _segments(path)[0]
    assert first != fmt.segment_name(0)  # the old segments are gone
    store = FileStore(path=str(path), segment_bytes=4000)
    await store.open()
    assert await _dump(store, keys) == expected
    assert await store.quarantined() == {keys[3]: (25, 30)}
    # Command ids of the dropped chain are free again; a new chain starts at seq 0.
    await store.append(_events(keys[0], None, 2, b"anew"))
    assert (await store.head(keys[0])).seq == 1
    await store.aclose()


@pytest.mark.parametrize("seed", range(12))
async def test_random_histories_with_compactions_match_a_memory_store(
        seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Compactions run in the background: appends, forks, drops, reads and reopens
    # (which wait for a compaction to finish) go on beside their copying and
    # between the parts of their index switch.
    rng = random.Random(seed)
    monkeypatch.setattr(file_store, "_RELOCATE_PART", rng.choice([3, 20_000]))
    path = tmp_path / "store"
    segment_bytes = rng.choice([600, 3000, 1 << 20])
    store = FileStore(path=str(path), segment_bytes=segment_bytes)
    await store.open()
    model = MemoryStore()
    await model.open()
    keys = [_key(n) for n in range(5)]
    freed: list[int] = []

    async def compact(target: FileStore) -> None:
        freed.append(await target.compact())

    async with trio.open_nursery() as nursery:
        for step in range(80):
            criterion = rng.choice(keys)
            head = await model.head(criterion)
            roll = rng.random()
            if roll < 0.5:
                batch = _events(criterion, head, rng.randint(1, 6), b"s%d" % step,
                                size=rng.randrange(200))
                for s in (model, store):
                    await s.append(batch)
            elif roll < 0.65 and head is not None:
                at = rng.randint(0, head.seq + 1)
                prev = (await model.range(criterion, at - 1, at))[0] if at else None
                batch = _events(criterion, prev, rng.randint(0, 4), b"f%d" % step)
                for s in (model, store):
                    await s.replace_from(criterion, at, batch)
            elif roll < 0.8:
                assert await store.drop(criterion) == await model.drop(criterion)
            elif roll < 0.93:
                nursery.start_soon(compact, store)
                await trio.sleep(0)
            else:
                await store.aclose()
                store = FileStore(path=str(path), segment_bytes=segment_bytes)
                await store.open()
            assert await _dump(store, keys) == {**await _dump(model, keys),
                                                 "quarantined": {}}, f"step {step}"
    await store.aclose()
    assert freed
    store = FileStore(path=str(path))
    await store.open()
    assert await _dump(store, keys) == {**await _dump(model, keys), "quarantined": {}}
    await store.aclose()


async def test_drops_compact_by_themselves_once_most_of_the_log_is_garbage(
        tmp_path: Path) -> None:
    store = FileStore(path=str(tmp_path / "s"), segment_bytes=20_000)
    await store.open()
    kept = _events(_key(0), None, 10, b"kept")
    await store.append(kept)
    for n in range(1, 8):
        await store.append(_events(_key(n), None, 40, b"big", size=200))
    assert store.log_bytes > 70_000
    for n in range(1, 8):
        await store.drop(_key(n))
    assert store.log_bytes < 20_000 + store.live_bytes
    assert [e.hash for e in await store.range(_key(0))] == [e.hash for e in kept]
    await store.aclose()
    assert len(_segments(tmp_path / "s")) <= 3


async def test_appends_and_reads_go_on_while_a_compaction_copies(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store, keys = await _filled(path, 1 << 16, 6, 600, b"base")
    await store.drop(keys[5])
    reader = FileReader(str(path))  # an offline reader, opened before the switch
    offline = {c: list(reader.read_encoded(c)) for c in keys[:2]}
    head = await store.head(keys[0])
    reads = 0

    async def writer() -> None:
        nonlocal head
        for n in range(40):
            batch = _events(keys[0], head, 3, b"during-%d" % n)
            await store.append(batch)
            head = batch[-1]

    async def read() -> None:
        nonlocal reads
        for _ in range(40):
            for criterion in keys[1:5]:
                assert len(await store.range(criterion, 100, 300)) == 200
                reads += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        nursery.start_soon(read)
        assert await store.compact() > 0
    assert reads == 160
    expected = await _dump(store, keys)
    assert len(expected[keys[0].hex()][0]) == 720  # type: ignore[index]
    # The offline reader still reads its snapshot, though its segments were unlinked.
    assert {c: list(reader.read_encoded(c)) for c in keys[:2]} == offline
    reader.close()
    await store.aclose()
    store = FileStore(path=str(path))
    await store.open()
    assert await _dump(store, keys) == expected
    await store.aclose()


async def test_a_crash_at_any_step_of_a_compaction_leaves_a_store_that_opens(
        tmp_path: Path) -> None:
    path = tmp_path / "store"
    store, keys = await _filled(path, 3000, 3, 50, b"x")
    await store.drop(keys[2])
    expected = await _dump(store, keys)
    await store.aclose()
    before = tmp_path / "before"
    shutil.copytree(path, before)

    store = FileStore(path=str(path), segment_bytes=3000)
    await store.open()
    await store.compact()
    await store.aclose()
    after = tmp_path / "after"
    shutil.copytree(path, after)
    base = _segments(after)[0]

    def crashed(stage: str) -> Path:
        where = tmp_path / stage
        shutil.rmtree(where, ignore_errors=True)
        if stage == "base being written":  # placeholder segments and a partial base
            shutil.copytree(before, where)
            last = len(_segments(before))
            (where / fmt.segment_name(last)).write_bytes(b"")
            (where / fmt.segment_name(last + 1)).write_bytes(b"")
            data = (after / base).read_bytes()
            (where / f"{base}.compact.tmp").write_bytes(data[: len(data) // 2])
        elif stage == "old segments not yet unlinked":
            shutil.copytree(before, where)
            for name in _segments(after):
                shutil.copy(after / name, where / name)
            shutil.copy(after / fmt.MARKER, where / fmt.MARKER)
        else:  # "half of them unlinked"
            shutil.copytree(after, where)
            for name in _segments(before)[len(_segments(before)) // 2:]:
                shutil.copy(before / name, where / name)
        return where

    for stage in ("base being written", "old segments not yet unlinked",
                  "half of them unlinked"):
        where = crashed(stage)
        reader = FileReader(str(where))
        assert sorted(reader.criteria()) == sorted(keys[:2]), stage
        reader.close()
        store = FileStore(path=str(where))
        await store.open()
        assert await _dump(store, keys) == expected, stage
        await store.append(_events(keys[0], await store.head(keys[0]), 2, b"on"))
        await store.aclose()
        names = set(os.listdir(where))
        assert not any(n.endswith(".tmp") for n in names), stage
        if stage != "base being written":
            assert _segments(where)[0] == base, stage  # garbage removed at open


async def test_damage_stops_a_compaction_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store, keys = await _filled(path, 1 << 20, 2, 20, b"d")
    await store.drop(keys[1])
    victim = (await store.range(keys[0], 7, 8))[0]
    segment = path / fmt.segment_name(0)
    data = bytearray(segment.read_bytes())
    at = data.find(victim.payload)
    data[at] ^= 0xFF
    segment.write_bytes(bytes(data))
    size = store.log_bytes
    with pytest.raises(StoreCorrupted) as info:
        await store.compact()
    assert info.value.path == str(segment)
    assert not any(p.name.endswith(".tmp") for p in path.iterdir())
    # Reopened, the store knows the damaged position: compaction waits for the
    # quarantine, and drops do not try again and again.
    await store.aclose()
    store = FileStore(path=str(path), segment_bytes=500)
    await store.open()
    assert await store.compact() == 0
    segments = _segments(path)
    for n in range(2, 6):
        await store.append(_events(_key(n), None, 5, b"e"))
        await store.drop(_key(n))
    assert len(_segments(path)) == len(segments) + 4  # rolled by the appends only
    # The damage is found by a read and quarantined as always; then compaction works.
    with pytest.raises(StoreCorrupted) as info:
        await store.range(keys[0])
    assert info.value.seq == 7
    await store.quarantine(keys[0], 7)
    assert await store.compact() > 0
    assert store.log_bytes < size
    assert len(await store.range(keys[0])) == 7
    await store.aclose()
    store = FileStore(path=str(path))
    await store.open()
    assert len(await store.range(keys[0])) == 7
    assert await store.quarantined() == {keys[0]: (7, 20)}
    await store.aclose()


async def test_a_compaction_that_cannot_finish_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "store"
    store, keys = await _filled(path, 2000, 3, 30, b"y")
    real_replace = os.replace

    def full_disk(src: str, dst: str) -> None:
        if src.endswith(".compact.tmp"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(StoreError, match="No space left"):
        await store.compact()
    # Drops that set off a compaction stand even though the compaction fails.
    assert await store.drop(keys[1]) == 30
    assert await store.drop(keys[2]) == 30
    assert "compaction failed" in caplog.text
    more = _events(keys[0], await store.head(keys[0]), 2, b"z")
    await store.append(more)
    monkeypatch.setattr(os, "replace", real_replace)
    assert not any(p.name.endswith(".tmp") for p in path.iterdir())
    assert await store.head(keys[1]) is None and len(await store.range(keys[0])) == 32
    expected = await _dump(store, keys)
    await store.aclose()
    store = FileStore(path=str(path))
    await store.open()
    assert await _dump(store, keys) == expected
    assert await store.compact() > 0
    assert await _dump(store, keys) == expected
    await store.aclose()
