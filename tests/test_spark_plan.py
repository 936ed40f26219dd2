"""Planning logic of the Spark source (no JVM): options, pushdown, offsets, reconciliation,
and reading live peers over real TCP."""

from __future__ import annotations

import datetime
import hashlib
import os
import shutil
import sysconfig
import threading
import zoneinfo

import hypothesis
import hypothesis.strategies as st
import pytest
import trio

import ketten
from ketten import Event, Identity, NodeConfig, criterion_key, open_node
from ketten._core.chain import scan_encoded_chain
from ketten._core.event import decode_fields
from ketten.errors import DecodeError, PeerUnreachable, UsageError

datasource = pytest.importorskip("pyspark.sql.datasource")

from ketten.spark._arrow import build_batch, run_batch  # noqa: E402
from ketten.spark._decode import COMPILED, decode_run  # noqa: E402
from ketten.spark._options import ReadOptions  # noqa: E402
from ketten.spark._plan import advance_offsets, push_filters  # noqa: E402
from ketten.spark._reconcile import reconcile  # noqa: E402

pytestmark = pytest.mark.spark


def test_options_are_case_insensitive_and_checked() -> None:
    options = ReadOptions.parse({"PATHS": '["/a", "/b"]', "Criteria": "x,y", "VERIFY": "Full",
                                 "startingSeq": "2", "endingseq": "9"})
    assert options.paths == ("/a", "/b")
    assert options.keys == {criterion_key("x"), criterion_key("y")}
    assert (options.verify, options.starting_seq, options.ending_seq) == (
        ketten.Verify.FULL, 2, 9)
    for bad in ({}, {"path": "/a", "verify": "some"}, {"path": "/a", "keys": "abc"},
                {"path": "/a", "startingSeq": "5", "endingSeq": "4"}, {"path": "/a", "pth": "x"},
                {"peers": "127.0.0.1:1"}):
        with pytest.raises(UsageError):
            ReadOptions.parse(bad)


def test_a_catalog_tables_properties_are_taken_and_no_options_are_explained() -> None:
    # What CREATE TABLE ... USING ketten OPTIONS (path '/a b') hands the source.
    table = {"owner": "root", "provider": "ketten", "location": "file:/a%20b",
             "path": "file:/a%20b"}
    assert ReadOptions.parse(table).paths == ("/a b",)
    external = {"location": "file:/c", "external": "true", "comment": "events"}
    assert ReadOptions.parse(external).paths == ("/c",)  # ... USING ketten LOCATION '/c'
    with pytest.raises(UsageError, match="unknown option"):
        ReadOptions.parse({"location": "file:/c", "pth": "x"})
    with pytest.raises(UsageError, match="CREATE TEMPORARY VIEW"):
        ReadOptions.parse({})  # what pyspark 4.3 hands it when such a table is read


def test_pushdown_keeps_only_what_it_applies_exactly() -> None:
    d = datasource
    key = "ab" * 32
    filters = [d.EqualTo(("criterion",), key), d.GreaterThanOrEqual(("seq",), 3),
               d.LessThan(("seq",), 10), d.LessThanOrEqual(("seq",), 7),
               d.IsNotNull(("seq",)), d.EqualTo(("author",), key),
               d.In(("seq",), (1, 2)), d.GreaterThan(("seq",), 2.5)]
    pushed, rejected = push_filters(filters)
    assert (pushed.criteria, pushed.seq_lo, pushed.seq_hi) == (frozenset({key}), 3, 8)
    assert pushed.authors == frozenset({key})
    assert rejected == [filters[6], filters[7]]
    pushed, rejected = push_filters([d.In(("author",), ("a", "b", None)),
                                     d.EqualTo(("author",), "b"), d.IsNotNull(("author",)),
                                     d.GreaterThan(("author",), "a")])
    assert pushed.authors == frozenset({"b"}) and len(rejected) == 1
    utc, berlin = datetime.UTC, zoneinfo.ZoneInfo("Europe/Berlin")
    t = datetime.datetime(2026, 1, 1, 0, 0, 0, 1000, tzinfo=utc)
    micros = 1_767_225_600_001_000
    pushed, rejected = push_filters([d.GreaterThan(("time",), t), d.LessThanOrEqual(
        ("time",), t.astimezone(berlin) + datetime.timedelta(seconds=1)),
        d.GreaterThanOrEqual(("time",), t.replace(tzinfo=None)), d.IsNotNull(("time",))])
    assert (pushed.time_lo, pushed.time_hi) == (micros + 1, micros + 1_000_001)
    assert len(rejected) == 2 and pushed.filters_rows  # naive datetime, IS NOT NULL
    pushed, _ = push_filters([d.EqualTo(("time",), t), d.LessThan(("time",), t)])
    assert (pushed.time_lo, pushed.time_hi) == (micros, micros)  # nothing passes
    a, b, c = ("0a" * 32, "0b" * 32, "0c" * 32)
    pushed, _ = push_filters([d.In(("criterion",), (a, b)), d.EqualTo(("criterion",), c),
                              d.LessThan(("seq",), -4)])
    assert (pushed.criteria, pushed.seq_hi) == (frozenset(), 0)


def test_a_name_filter_selects_its_key_and_a_criterion_filter_needs_a_key() -> None:
    d = datasource
    pushed, rejected = push_filters([d.In(("name",), ("orders", "payments", None)),
                                     d.EqualTo(("name",), "orders"), d.IsNotNull(("name",))])
    assert pushed.names == {criterion_key("orders"): "orders"}
    assert len(rejected) == 1 and isinstance(rejected[0], d.IsNotNull)
    assert pushed.allows(criterion_key("orders")) and not pushed.allows(criterion_key("payments"))
    for value in ("orders", "ab" * 31):
        with pytest.raises(UsageError, match=r"the criterion column holds keys, 64 hex digits; "
                           r"filter on the name column \(name = '" + value):
            push_filters([d.EqualTo(("criterion",), value)])
    with pytest.raises(UsageError, match="name = 'orders'"):
        push_filters([d.In(("criterion",), ("ab" * 32, "orders"))])
    assert ReadOptions.parse({"path": "/a", "criteria": "orders, Payments"}).names == {
        criterion_key("orders"): "orders", criterion_key("Payments"): "Payments"}


def test_trigger_limit_is_shared_in_proportion_and_never_goes_back() -> None:
    start = {"a": 2, "b": 0}
    available = {"a": 8, "b": 3, "c": 1}
    assert advance_offsets(start, available, None, 0) == {"a": 8, "b": 3, "c": 1}
    end = advance_offsets(start, available, 5, 0)
    assert list(end) == ["a", "b", "c"] and sum(end[k] - start.get(k, 0) for k in end) == 5
    assert end["a"] - 2 >= end["b"] >= 1
    assert advance_offsets({"a": 9}, {"a": 4}, 3, 0) == {"a": 9}


def test_reconcile_prefers_the_branch_most_replicas_hold() -> None:
    def h(branch: str, seq: int) -> bytes:
        # Branch y forks off branch x after seq 2.
        return hashlib.sha256(f"{'x' if seq < 3 else branch}{seq}".encode()).digest()

    # The longest chain is on a branch only one replica holds.
    chains = {"long": ("y", 9), "a": ("x", 6), "b": ("x", 4), "c": ("x", 6)}
    heads = {p: (seq, h(b, seq)) for p, (b, seq) in chains.items()}

    def hash_at(path: str, seq: int) -> bytes | None:
        branch, height = chains[path]
        return h(branch, seq) if seq <= height else None

    view = reconcile(b"k" * 32, heads, hash_at)
    assert (view.source, view.height, view.diverged) == ("a", 7, ("long",))
    assert set(view.replicas) == set(chains)


def test_peers_are_copied_over_tcp_and_read(tmp_path: object) -> None:
    from ketten.spark._source import KettenDataSource

    ready = threading.Event()
    box: dict[str, object] = {}

    async def serve() -> None:
        config = NodeConfig(transport="tcp", store="sqlite",
                            options={"store": {"path": f"{tmp_path}/peer"}})
        async with open_node(config) as node:
            for i in range(5):
                await node.append_local(criterion_key("live"), f"e{i}".encode())
            stop = trio.Event()
            box.update(address=node.address, stop=stop, token=trio.lowlevel.current_trio_token())
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=trio.run, args=(serve,))
    thread.start()
    try:
        assert ready.wait(30)
        source = KettenDataSource({"peers": str(box["address"]), "criteria": "live",
                                   "peerDirectory": f"{tmp_path}/copies"})
        reader = source.reader(source.schema())
        rows = [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
        assert [(r["seq"], r["payload"], r["replicas"]) for r in rows] == [
            (i, f"e{i}".encode(), 1) for i in range(5)]
    finally:
        if ready.is_set():
            stop = box["stop"]
            assert isinstance(stop, trio.Event)
            trio.from_thread.run_sync(stop.set, trio_token=box["token"])  # type: ignore[arg-type]
        thread.join()
    with pytest.raises(PeerUnreachable, match=r"peer 127\.0\.0\.1:1"):
        KettenDataSource({"peers": "127.0.0.1:1", "criteria": "live",
                          "peerTimeout": "2"}).schema()


def _events(shapes: list[tuple[int | None, bytes, int, bytes]]) -> list[Event]:
    """A chain whose events have the given (command, clock, time, payload)."""
    author = Identity.from_seed(b"\x05" * 32)
    events: list[Event] = []
    for seq, (command, clock, time, payload) in enumerate(shapes):
        events.append(Event.create(
            author, criterion=criterion_key("shapes"), seq=seq,
            prev=events[-1].hash if events else None, payload=payload, time=time,
            command=command, clock=clock,
        ))
    return events


_DECODERS = [
    pytest.param(False, id="numpy"),
    pytest.param(True, id="compiled", marks=pytest.mark.skipif(
        not COMPILED, reason="compiled decoder not built (no C compiler at install)")),
]


@pytest.mark.parametrize("compiled", _DECODERS)
def test_column_decoding_equals_event_decoding(compiled: bool) -> None:
    sizes = [0, 1, 12, 13, 23, 24, 255, 256, 70_000]
    shapes = [
        (None if i % 4 == 0 else [0, 23, 24, 255, 256, 65_535, 65_536, 2**32, 2**63 - 1][i % 9],
         bytes([i]) * sizes[(i + 3) % len(sizes)],
         [0, 23, 24, 2**32 - 1, 2**32, 2**63 - 1][i % 6],
         bytes([255 - i]) * sizes[i % len(sizes)])
        for i in range(40)
    ]
    events = _events(shapes)
    raws = [e.to_bytes() for e in events]
    key = events[0].criterion
    for first in (0, 1, 17):
        run = decode_run(raws[first:], max_size=1 << 20, check_links=True, criterion=key,
                         link=events[first - 1].hash if first else None, first_seq=first,
                         compiled=compiled)
        assert run is not None
        batch = run_batch(key.hex(), run, 2)
        scanned = list(scan_encoded_chain(raws[first:], criterion=key, first_seq=first,
                                          prev_hash=events[first - 1].hash if first else None))
        expected = build_batch(key.hex(), [f for _, _, f in scanned],  # type: ignore[misc]
                               [d for _, d, _ in scanned], 2)
        assert batch.equals(expected)
        assert batch.column("payload").to_pylist() == [e.payload for e in events[first:]]
    # Wrong links, seqs or criterion, and any non-canonical or damaged encoding,
    # are left to event-by-event decoding (which names the error).
    other = criterion_key("other")
    assert decode_run(raws[1:], max_size=1 << 20, check_links=True, criterion=key,
                      link=events[1].hash, first_seq=1, compiled=compiled) is None
    assert decode_run(raws[1:], max_size=1 << 20, check_links=True, criterion=key,
                      link=events[0].hash, first_seq=2, compiled=compiled) is None
    assert decode_run(raws, max_size=1 << 20, check_links=True, criterion=other,
                      link=None, first_seq=0, compiled=compiled) is None
    assert decode_run(raws, max_size=1 << 20, check_links=False, criterion=other,
                      link=None, first_seq=0, compiled=compiled) is not None
    assert decode_run(raws, max_size=1000, check_links=False, criterion=key,
                      link=None, first_seq=0, compiled=compiled) is None
    small = raws[2]
    command_at = 4 + 32 + 1 + 34 + 34
    assert small[command_at] == 0x18  # command 24 in its shortest form
    wide = small[:command_at] + b"\x19\x00\x18" + small[command_at + 2:]
    truncated, extended = small[:-1], small + b"\x00"
    writers = Event.create(Identity.from_seed(b"\x05" * 32), criterion=key, seq=0, prev=None,
                           payload=b"", time=0, writers=[b"\x01" * 32]).to_bytes()
    for bad in (wide, truncated, extended, small[:40], b"\xa0" * 200):
        with pytest.raises(DecodeError):
            decode_fields(bad)
    decode_fields(writers)  # valid, but not the common shape
    for unusual in (wide, truncated, extended, small[:40], b"\xa0" * 200, writers):
        assert decode_run([raws[1], unusual], max_size=1 << 20, check_links=False,
                          criterion=key, link=None, first_seq=1,
                          compiled=compiled) is None


def _same_run(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    for field in ("seqs", "prev", "prev_null", "author", "command", "command_null", "time"):
        left, right = getattr(a, field), getattr(b, field)
        if left.shape != right.shape or not (left == right).all():
            return False
    return bool(a.digests == b.digests and a.clock.equals(b.clock)  # type: ignore[attr-defined]
                and a.payload.equals(b.payload))  # type: ignore[attr-defined]


@pytest.mark.skipif(not COMPILED, reason="compiled decoder not built (no C compiler at install)")
@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    shapes=st.lists(st.tuples(
        st.one_of(st.none(), st.integers(0, 2**63 - 1)),
        st.binary(max_size=40),
        st.integers(0, 2**63 - 1),
        st.binary(max_size=300),
    ), min_size=1, max_size=4),
    damage=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2000), st.binary(max_size=3)),
                    max_size=3),
)
def test_compiled_and_numpy_decoders_agree_on_any_bytes(
    shapes: list[tuple[int | None, bytes, int, bytes]],
    damage: list[tuple[int, int, bytes]],
) -> None:
    """Both decoders accept the same encodings (damaged or not) with the same columns,
    and what they accept decodes event by event to the same fields."""
    events = _events(shapes)
    raws = [e.to_bytes() for e in events]
    for which, at, data in damage:
        raw = raws[which % len(raws)]
        at %= len(raw) + 1
        kind = at % 3
        raw = (raw[:at] + data + raw[at + len(data):] if kind == 0
               else raw[:at] + data + raw[at:] if kind == 1 else raw[:at])
        raws[which % len(raws)] = raw
    key = events[0].criterion
    for check_links in (True, False):
        kwargs = dict(max_size=1 << 20, check_links=check_links, criterion=key, link=None,
                      first_seq=0)
        compiled = decode_run(raws, compiled=True, **kwargs)  # type: ignore[arg-type]
        reference = decode_run(raws, compiled=False, **kwargs)  # type: ignore[arg-type]
        assert _same_run(compiled, reference)
        others = [bytearray(raw) for raw in raws]  # bytes-like, not bytes: numpy decodes
        assert _same_run(decode_run(others, compiled=True, **kwargs), reference)  # type: ignore[arg-type]
        if compiled is not None:
            for i, raw in enumerate(raws):
                fields, _ = decode_fields(raw)
                assert fields[2] == compiled.seqs[i]
                assert fields[8] == compiled.payload[i].as_py()
                assert hashlib.sha256(raw).digest() == compiled.digest(i)


def test_compiled_decoder_is_built_where_a_compiler_is() -> None:
    """The install builds the compiled decoder whenever it can; a build that failed
    silently would leave the reader on its (slower) numpy decoder."""
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if shutil.which("cc") is None or not os.path.exists(headers):
        pytest.skip("no C compiler or no Python headers here: the numpy decoder is the one")
    assert COMPILED
