"""The ``sqlite`` and ``file`` stores: plugin hooks, readers, bad input and corruption."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
import trio

from ketten import Event, Identity, NodeConfig, Verify, criterion_key, open_node, plugin_manager
from ketten._core.chain import scan_encoded_chain
from ketten.adapters.memory import MemoryNetwork
from ketten.errors import BrokenLink, ConfigError, StoreCorrupted, StoreError, StoreFormatError
from ketten.interfaces import Store, StoreReader
from ketten.plugins.file_store import FileReader, FileStore
from ketten.plugins.sqlite_store import SqliteReader, SqliteStore

KINDS = ["sqlite", "file"]
ALICE = Identity.from_seed(b"\x21" * 32)
CRIT = criterion_key("orders")
OTHER = criterion_key("payments")


def make(kind: str, path: Path) -> Store:
    return SqliteStore(path=str(path)) if kind == "sqlite" else FileStore(path=str(path))


def reader(kind: str, path: Path) -> StoreReader:
    return SqliteReader(str(path)) if kind == "sqlite" else FileReader(str(path))


def chain(n: int, criterion: bytes = CRIT, after: Event | None = None) -> list[Event]:
    events: list[Event] = []
    prev = after
    for _ in range(n):
        seq = prev.seq + 1 if prev else 0
        prev = Event.create(ALICE, criterion=criterion, seq=seq, prev=prev.hash if prev else None,
                            payload=b"payload-%06d-" % seq + b"z" * 40, time=1000 + seq,
                            command=seq)
        events.append(prev)
    return events


def snapshot(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(path.rglob("*"))}


async def filled(kind: str, path: Path, events: list[Event], batch: int = 10) -> None:
    store = make(kind, path)
    await store.open()
    for i in range(0, len(events), batch):
        await store.append(events[i : i + batch])
    await store.aclose()


def flip(path: Path, offset: int, mask: int = 0x04) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def data_file(kind: str, path: Path) -> Path:
    return path / ("ketten.sqlite3" if kind == "sqlite" else "seg-00000000.log")


# -- plugin hooks and node integration ------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_plugin_builds_store_and_node_uses_it(kind: str, tmp_path: Path) -> None:
    pm = plugin_manager()
    net = MemoryNetwork(seed=1)
    config = NodeConfig(store=kind, identity=ALICE,
                        options={"store": {"path": str(tmp_path / "node")},
                                 "transport": {"network": net}})
    events = chain(3)
    async with open_node(config, plugins=pm) as node:
        assert type(node.store) is (SqliteStore if kind == "sqlite" else FileStore)
        await node.store.append(events)
    async with open_node(config, plugins=pm) as node:
        assert await node.store.range(CRIT) == events
    found = pm.hook.ketten_open_store_reader(path=str(tmp_path / "node"))
    assert type(found) is (SqliteReader if kind == "sqlite" else FileReader)
    assert [raw for _, raw in found.read_encoded(CRIT)] == [e.to_bytes() for e in events]
    found.close()


def test_reader_hook_ignores_foreign_directories(tmp_path: Path) -> None:
    pm = plugin_manager()
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    assert pm.hook.ketten_open_store_reader(path=str(tmp_path / "empty")) is None
    assert pm.hook.ketten_open_store_reader(path=str(tmp_path / "junk")) is None
    assert pm.hook.ketten_open_store_reader(path=str(tmp_path / "missing")) is None


@pytest.mark.parametrize("kind", KINDS)
def test_store_needs_a_path(kind: str) -> None:
    pm = plugin_manager()
    with pytest.raises(ConfigError, match="path"):
        pm.hook.ketten_make_store(name=kind, options={}, node=None)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_store_directory_has_one_writer(kind: str, tmp_path: Path) -> None:
    first = make(kind, tmp_path / "s")
    await first.open()
    second = make(kind, tmp_path / "s")
    with pytest.raises(StoreError, match="open in another"):
        await second.open()
    await first.aclose()
    await second.open()
    await second.aclose()


# -- readers ----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_reader_reads_while_the_node_writes(kind: str, tmp_path: Path) -> None:
    store = make(kind, tmp_path / "s")
    await store.open()
    try:
        events = chain(40)
        other = chain(5, OTHER)
        await store.append(events[:30] + other)
        fork = chain(3, CRIT, after=events[24])
        orphaned = await store.replace_from(CRIT, 25, fork)
        main = events[:25] + fork
        rd = reader(kind, tmp_path / "s")
        try:
            assert rd.criteria() == sorted([CRIT, OTHER])
            assert dict(rd.heads()) == {CRIT: (27, fork[-1].hash), OTHER: (4, other[-1].hash)}
            got = list(rd.read_encoded(CRIT))
            assert got == [(e.seq, e.to_bytes()) for e in main]
            assert list(rd.read_encoded(CRIT, 10, 13)) == [(e.seq, e.to_bytes()) for e in main[10:13]]
            assert list(rd.read_encoded(CRIT, 27, 100)) == [(27, main[27].to_bytes())]
            assert list(rd.read_encoded(CRIT, 30)) == []
            assert list(rd.orphans_encoded(CRIT)) == [e.to_bytes() for e in orphaned]
            scanned = list(scan_encoded_chain((raw for _, raw in got), verify=Verify.FULL))
            assert [h for _, h, _ in scanned] == [e.hash for e in main]
            await store.append(chain(2, CRIT, after=fork[-1]))
            assert list(rd.read_encoded(CRIT, 0, 28)) == [(e.seq, e.to_bytes()) for e in main]
        finally:
            rd.close()
    finally:
        await store.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_reader_changes_nothing_in_the_data(kind: str, tmp_path: Path) -> None:
    await filled(kind, tmp_path / "s", chain(20))
    before = data_file(kind, tmp_path / "s").read_bytes()
    rd = reader(kind, tmp_path / "s")
    assert len(list(rd.read_encoded(CRIT))) == 20
    rd.close()
    assert data_file(kind, tmp_path / "s").read_bytes() == before


# -- bad input --------------------------------------------------------------


async def _make_newer(kind: str, path: Path) -> None:
    await filled(kind, path, chain(3))
    if kind == "sqlite":
        conn = sqlite3.connect(path / "ketten.sqlite3")
        conn.execute("PRAGMA user_version = 99")
        conn.commit()
        conn.close()
        for suffix in ("-wal", "-shm"):
            (path / f"ketten.sqlite3{suffix}").unlink(missing_ok=True)
    else:
        (path / "KETTEN-FILE-STORE").write_bytes(b"ketten file store\nformat 99\n")


async def _make_case(case: str, kind: str, path: Path) -> None:
    if case == "newer version":
        await _make_newer(kind, path)
    elif case == "other store format":
        await filled("file" if kind == "sqlite" else "sqlite", path, chain(3))
    elif case == "foreign sqlite database":
        path.mkdir()
        conn = sqlite3.connect(path / "ketten.sqlite3")
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
        conn.close()
    elif case == "garbage":
        path.mkdir()
        name = "ketten.sqlite3" if kind == "sqlite" else "KETTEN-FILE-STORE"
        (path / name).write_bytes(os.urandom(4096))
    elif case == "unrelated files":
        path.mkdir()
        (path / "photo.jpg").write_bytes(b"\xff\xd8\xff" + os.urandom(100))
    elif case == "a file, not a directory":
        path.write_bytes(b"hello")


BAD_CASES = ["newer version", "other store format", "foreign sqlite database", "garbage",
             "unrelated files", "a file, not a directory"]


@pytest.mark.parametrize("case", BAD_CASES)
@pytest.mark.parametrize("kind", KINDS)
async def test_bad_path_is_refused_and_left_unchanged(kind: str, case: str, tmp_path: Path) -> None:
    path = tmp_path / "s"
    await _make_case(case, kind, path)
    before = snapshot(path)
    store = make(kind, path)
    with pytest.raises(StoreFormatError) as info:
        await store.open()
    assert str(path) in str(info.value)
    assert snapshot(path) == before
    pm = plugin_manager()
    if case in ("newer version", "garbage") and not (kind == "sqlite" and case == "garbage"):
        with pytest.raises(StoreFormatError):
            pm.hook.ketten_open_store_reader(path=str(path))
    else:
        found = pm.hook.ketten_open_store_reader(path=str(path))
        assert found is None or type(found) is not (SqliteReader if kind == "sqlite" else FileReader)
        if found is not None:
            found.close()
    assert snapshot(path) == before


# -- corruption -------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_flipped_bit_is_refused_then_quarantined_and_repaired(
    kind: str, tmp_path: Path
) -> None:
    path = tmp_path / "s"
    events = chain(50)
    await filled(kind, path, events)
    target = data_file(kind, path)
    marker = b"payload-000020-"
    at = target.read_bytes().find(marker)
    assert at > 0
    flip(target, at + len(marker) + 5)

    store = make(kind, path)
    await store.open()
    try:
        with pytest.raises(StoreCorrupted) as info:
            await store.range(CRIT)
        assert info.value.path == str(target)
        assert info.value.offset is not None and at - 200 <= info.value.offset <= at
        assert str(target) in str(info.value) and f"offset {info.value.offset}" in str(info.value)
        with pytest.raises(StoreCorrupted):
            await store.get(events[20].hash)
        with pytest.raises(StoreCorrupted):
            await store.range(CRIT, 15, 25)
        assert await store.range(CRIT, 0, 20) == events[:20]
        assert await store.range(CRIT, 21) == events[21:]

        rd = reader(kind, path)
        with pytest.raises(StoreCorrupted):
            list(rd.read_encoded(CRIT))
        rd.close()

        assert await store.quarantine(CRIT, 20) == 30  # type: ignore[attr-defined]
        assert await store.quarantined() == {CRIT: (20, 50)}  # type: ignore[attr-defined]
        assert await store.head(CRIT) == events[19]
        assert await store.range(CRIT) == events[:20]
        assert await store.get(events[20].hash) is None
    finally:
        await store.aclose()

    store = make(kind, path)
    await store.open()
    try:
        assert await store.range(CRIT) == events[:20]
        assert await store.quarantined() == {CRIT: (20, 50)}  # type: ignore[attr-defined]
        await store.append(events[20:])
        assert await store.quarantined() == {}  # type: ignore[attr-defined]
        assert await store.range(CRIT) == events
    finally:
        await store.aclose()
    rd = reader(kind, path)
    assert [raw for _, raw in rd.read_encoded(CRIT)] == [e.to_bytes() for e in events]
    rd.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_damaged_orphan_is_refused_and_dropped_by_quarantine(
    kind: str, tmp_path: Path
) -> None:
    path = tmp_path / "s"
    events = chain(10)
    store = make(kind, path)
    await store.open()
    await store.append(events)
    fork = chain(2, CRIT, after=events[5])
    await store.replace_from(CRIT, 6, fork)
    await store.aclose()
    target = data_file(kind, path)
    at = target.read_bytes().find(b"payload-000008-")
    flip(target, at + 20)
    store = make(kind, path)
    await store.open()
    try:
        with pytest.raises(StoreCorrupted):
            await store.orphans(CRIT)
        assert await store.range(CRIT) == [*events[:6], *fork]
        assert await store.quarantine(CRIT, 8) == 0  # type: ignore[attr-defined]
        assert await store.orphans(CRIT) == [events[6], events[7], events[9]]
    finally:
        await store.aclose()


async def test_sqlite_truncated_file_is_detected_at_open(tmp_path: Path) -> None:
    path = tmp_path / "s"
    await filled("sqlite", path, chain(300))
    target = data_file("sqlite", path)
    size = target.stat().st_size
    os.truncate(target, size // 2)
    with pytest.raises(StoreCorrupted) as info:
        await make("sqlite", path).open()
    assert info.value.path == str(target)


async def test_sqlite_damaged_page_is_detected_at_open(tmp_path: Path) -> None:
    path = tmp_path / "s"
    await filled("sqlite", path, chain(300))
    target = data_file("sqlite", path)
    data = bytearray(target.read_bytes())
    page = 4096
    for number in range(2, len(data) // page):
        if data[(number - 1) * page] == 0x0D:  # a table b-tree leaf page
            data[(number - 1) * page + 3 : (number - 1) * page + 5] = b"\xff\xff"
            break
    target.write_bytes(bytes(data))
    with pytest.raises(StoreCorrupted) as info:
        await make("sqlite", path).open()
    assert info.value.path == str(target)


async def test_file_damaged_frame_header_is_detected_at_open_without_changes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s"
    await filled("file", path, chain(50))
    target = data_file("file", path)
    at = target.read_bytes().find(b"payload-000020-")
    header = target.read_bytes().rfind(b"\x45\x4b\x01\x00", 0, at)
    flip(target, header + 6, 0x40)  # the length field
    before = snapshot(path)
    with pytest.raises(StoreCorrupted) as info:
        await make("file", path).open()
    assert info.value.path == str(target) and info.value.offset == header
    assert snapshot(path) == before
    with pytest.raises(StoreCorrupted):
        FileReader(str(path))


@pytest.mark.parametrize("kind", ["sqlite", "file"])
async def test_a_dropped_chain_stays_dropped_for_offline_readers(kind: str,
                                                                  tmp_path: Path) -> None:
    path = tmp_path / "s"
    await filled(kind, path, chain(30) + chain(5, OTHER))
    store = make(kind, path)
    await store.open()
    assert await store.drop(CRIT) == 30
    await store.aclose()
    rd = reader(kind, path)
    try:
        assert rd.criteria() == [OTHER]
        assert list(rd.read_encoded(CRIT)) == []
        assert len(list(rd.read_encoded(OTHER))) == 5
    finally:
        rd.close()


async def test_file_cursor_writes_in_progress_or_left_by_a_crash_are_no_cursors(
        tmp_path: Path) -> None:
    path = tmp_path / "s"
    store = make("file", path)
    await store.open()
    await store.put_cursor("ketten/x", b"kept")
    folder = path / "cursors"
    (name,) = os.listdir(folder)
    # What a write looks like between its temporary file and the rename: half written.
    (folder / f"{name}.1a2b3c4d5e6f.tmp").write_bytes(b"KC")
    (folder / "README").write_bytes(b"not ours")
    assert await store.cursors("ketten/") == {"ketten/x": b"kept"}
    await store.aclose()
    await store.open()  # a crash's leftovers are removed when the store opens
    assert sorted(os.listdir(folder)) == sorted([name, "README"])
    assert await store.cursors("") == {"ketten/x": b"kept"}

    async def write(n: int) -> None:
        for _ in range(20):
            await store.put_cursor("ketten/x", b"%d" % n)

    async with trio.open_nursery() as nursery:  # one name written by many threads at once
        for n in range(4):
            nursery.start_soon(write, n)
        for _ in range(20):
            assert (await store.cursors("ketten/")).keys() == {"ketten/x"}
    assert await store.get_cursor("ketten/x") in {b"0", b"1", b"2", b"3"}
    assert not [e for e in os.listdir(folder) if e.endswith(".tmp")]
    await store.aclose()


async def test_file_drop_frame_of_the_wrong_size_is_named_as_damage(tmp_path: Path) -> None:
    from ketten.plugins.file_store import _format as fmt

    path = tmp_path / "s"
    await filled("file", path, chain(3))
    target = data_file("file", path)
    with target.open("ab") as out:
        out.write(fmt.frame(fmt.DROP, CRIT[:31]) + fmt.frame(fmt.COMMIT,
                                                             fmt.COMMIT_BODY.pack(1)))
    with pytest.raises(StoreCorrupted, match="control frame of type 5 holds 31 bytes") as info:
        await make("file", path).open()
    assert info.value.path == str(target)


async def test_file_torn_tail_is_cut_off_at_open(tmp_path: Path) -> None:
    path = tmp_path / "s"
    events = chain(30)
    await filled("file", path, events)
    target = data_file("file", path)
    size = target.stat().st_size
    os.truncate(target, size - 7)
    rd = FileReader(str(path))
    assert len(list(rd.read_encoded(CRIT))) == 20
    rd.close()
    assert target.stat().st_size == size - 7
    store = make("file", path)
    await store.open()
    try:
        assert await store.range(CRIT) == events[:20]
        await store.append(events[20:])
    finally:
        await store.aclose()
    store = make("file", path)
    await store.open()
    assert await store.range(CRIT) == events
    await store.aclose()


async def test_file_missing_segment_and_damaged_cursor_are_detected(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store = FileStore(path=str(path), segment_bytes=2000)
    await store.open()
    events = chain(40)
    for i in range(0, 40, 5):
        await store.append(events[i : i + 5])
    await store.put_cursor("sub", b"position-17")
    await store.aclose()
    segments = sorted(path.glob("seg-*.log"))
    assert len(segments) > 2
    store = FileStore(path=str(path))
    await store.open()
    assert await store.range(CRIT) == events
    [cursor_file] = list((path / "cursors").iterdir())
    flip(cursor_file, len(cursor_file.read_bytes()) - 2)
    with pytest.raises(StoreCorrupted) as info:
        await store.get_cursor("sub")
    assert info.value.path == str(cursor_file)
    await store.aclose()
    segments[1].unlink()
    with pytest.raises(StoreCorrupted, match="missing"):
        await FileStore(path=str(path)).open()


@pytest.mark.parametrize("kind", KINDS)
async def test_unchecked_read_is_a_snapshot_and_links_still_catch_damage(
    kind: str, tmp_path: Path
) -> None:
    path = tmp_path / "s"
    events = chain(40)
    other = chain(4, OTHER)
    store = make(kind, path)
    await store.open()
    try:
        await store.append(events[:30] + other)
        fork = chain(3, CRIT, after=events[24])
        await store.replace_from(CRIT, 25, fork)
        main = events[:25] + fork
        expected = [(e.seq, e.to_bytes()) for e in main]
        rd = reader(kind, path)
        try:
            assert list(rd.read_encoded(CRIT, check=False)) == expected
            assert list(rd.read_encoded(CRIT, 10, 13, check=False)) == expected[10:13]
            assert list(rd.read_encoded(CRIT, 27, 100, check=False)) == expected[27:]
            assert list(rd.read_encoded(CRIT, 28, check=False)) == []
            assert list(rd.read_encoded(CRIT, 5, 5, check=False)) == []
            assert list(rd.read_encoded(criterion_key("none"), check=False)) == []
            # A read under way keeps its snapshot while the node appends.
            running = rd.read_encoded(CRIT, check=False)
            assert next(running) == expected[0]
            later = chain(2, CRIT, after=fork[-1])
            await store.append(later)
            assert [expected[0], *running] == expected
            main += later
        finally:
            rd.close()
    finally:
        await store.aclose()

    target = data_file(kind, path)
    marker = b"payload-000012-"
    at = target.read_bytes().find(marker)
    assert at > 0
    flip(target, at + len(marker) + 5)
    rd = reader(kind, path)
    try:
        with pytest.raises(StoreCorrupted) as info:
            list(rd.read_encoded(CRIT))
        assert info.value.path == str(target)
        if kind == "file":
            # Frame checksums are checked on every read.
            with pytest.raises(StoreCorrupted) as info:
                list(rd.read_encoded(CRIT, check=False))
            assert info.value.path == str(target)
        else:
            assert info.value.seq == 12
            # Unchecked rows come as stored; the damaged one breaks the next link.
            raws = [raw for _, raw in rd.read_encoded(CRIT, check=False)]
            assert len(raws) == 30 and raws[12] != main[12].to_bytes()
            assert raws[:12] + raws[13:] == [e.to_bytes() for e in main[:12] + main[13:]]
            with pytest.raises(BrokenLink, match="seq 13 does not link"):
                list(scan_encoded_chain(raws, verify=Verify.LINKS))
    finally:
        rd.close()


@pytest.mark.parametrize(("damage", "hole", "head"), [
    ("UPDATE chains SET head_seq = head_seq + 4", None, 49),
    ("UPDATE chains SET head_seq = head_seq - 7", None, 49),
    ("UPDATE chains SET head_hash = zeroblob(32)", None, 49),
    ("DELETE FROM chains", None, 49),
    ("DELETE FROM events WHERE seq = 30", 30, 29),
    ("DELETE FROM events WHERE seq >= 45", None, 44),
])
async def test_sqlite_chain_rows_are_checked_against_the_events_at_open(
    tmp_path: Path, damage: str, hole: int | None, head: int
) -> None:
    """The ``chains`` row is derived from the events: a changed row is repaired from
    them, and a hole below the head is quarantined so the range is fetched again.
    Either way the chain can be read and extended at once."""
    path = tmp_path / "s"
    events = chain(50)
    await filled("sqlite", path, events)
    conn = sqlite3.connect(path / "ketten.sqlite3")
    conn.execute(damage)
    conn.commit()
    conn.close()

    store = SqliteStore(path=str(path))
    await store.open()
    try:
        repairs = store.head_repairs()
        assert [r.criterion for r in repairs] == [CRIT]
        assert repairs[0].hole == hole
        assert await store.head(CRIT) == events[head]
        assert await store.range(CRIT) == events[:head + 1]
        assert await store.quarantined() == ({} if head == 49 else {CRIT: (head + 1, 50)})
        await store.append(events[head + 1:])  # the refill the node's sync would do
        assert await store.range(CRIT) == events
        assert await store.quarantined() == {}
    finally:
        await store.aclose()
    store = SqliteStore(path=str(path))
    await store.open()
    try:
        assert store.head_repairs() == []
    finally:
        await store.aclose()
