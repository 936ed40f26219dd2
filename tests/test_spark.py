"""The ``ketten`` Spark source on real Spark (local[2]) over real sqlite and file stores.

Every store directory is written by real nodes replicating over the memory
network (``append_local`` + ``pull``). One Spark session serves the module.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

import ketten
from ketten import Event, NodeConfig, criterion_key, open_node
from ketten.adapters.memory import Faults, MemoryNetwork

pyspark = pytest.importorskip("pyspark")

pytestmark = pytest.mark.spark

ROW_FIELDS = ("criterion", "seq", "hash", "prev", "author", "command", "clock", "time",
              "payload", "replicas")


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from ketten.spark import local_session

    warehouse = str(tmp_path_factory.mktemp("warehouse"))  # CREATE TABLE writes there
    session = local_session("ketten-tests", config={"spark.sql.shuffle.partitions": "2",
                                                    "spark.sql.warehouse.dir": warehouse})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def node_config(store: str, path: str, net: MemoryNetwork) -> NodeConfig:
    return NodeConfig(store=store, options={"store": {"path": path}, "transport": {"network": net}})


def expected_row(event: Event, replicas: int) -> tuple[Any, ...]:
    # PySpark hands timestamps to Python as naive local datetimes.
    time = datetime.datetime.fromtimestamp(event.time // 1000).replace(
        microsecond=event.time % 1000 * 1000)
    return (
        event.criterion.hex(), event.seq, event.hash.hex(),
        event.prev.hex() if event.prev is not None else None, event.author.hex(),
        event.command, event.clock, time, event.payload, replicas,
    )


def plain(row: Any) -> tuple[Any, ...]:
    return tuple(bytes(v) if isinstance(v, bytearray) else v
                 for v in (row[field] for field in ROW_FIELDS))


def rows_of(df: Any) -> list[tuple[Any, ...]]:
    return sorted((plain(row) for row in df.collect()), key=lambda r: (r[0], r[1], r[2]))


async def write_chains(
    store: str, dirs: Sequence[str], plan: Sequence[tuple[int, str, int]],
    pulls: Sequence[tuple[int, int, str]] = (),
) -> list[Event]:
    """Open a node per directory; ``plan``: (writer node, criterion name, events) appended
    in order, then ``pulls``: (puller, source node, criterion name)."""
    net = MemoryNetwork(seed=7, faults=Faults(latency=0.0))
    plugins = ketten.plugin_manager()
    written: list[Event] = []
    async with contextlib.AsyncExitStack() as stack:
        nodes = [await stack.enter_async_context(open_node(node_config(store, d, net),
                                                           plugins=plugins)) for d in dirs]
        for writer, name, count in plan:
            for i in range(count):
                # A reopened store is the same node (the same author): command ids
                # must not repeat across calls, so they follow the seq.
                head = await nodes[writer].head(name)
                seq = 0 if head is None else head.seq + 1
                event = await nodes[writer].append_local(
                    criterion_key(name), f"{name}:{writer}:{i}:".encode() * 3,
                    command=seq if seq % 3 else None,
                )
                written.append(event)
        for puller, source, name in pulls:
            await nodes[puller].pull(nodes[source].address, criterion_key(name))
    return written


@pytest.mark.parametrize("store", ["sqlite", "file"])
def test_reads_stores_written_by_a_cluster_row_for_row(spark: Any, tmp_path: Any,
                                                       store: str) -> None:
    dirs = [str(tmp_path / f"node{i}") for i in range(3)]
    plan = [(0, "orders", 40), (1, "payments", 25), (0, "audit", 1)]
    pulls = [(1, 0, "orders"), (2, 0, "orders"), (0, 1, "payments"), (2, 1, "payments"),
             (1, 0, "audit"), (2, 0, "audit")]
    written = trio.run(write_chains, store, dirs, plan, pulls)

    df = (spark.read.format("ketten").option("paths", ",".join(dirs))
          .option("maxEventsPerPartition", 16).load())
    expected = sorted((expected_row(e, 3) for e in written), key=lambda r: (r[0], r[1], r[2]))
    assert rows_of(df) == expected
    # orders is read in 3 seq ranges, payments in 2.
    assert df.rdd.getNumPartitions() >= 5

    spark.sql(f"CREATE OR REPLACE TEMP VIEW chain_view USING ketten "
              f"OPTIONS (path '{dirs[2]}', criteria 'orders', verify 'full')")
    orders = [r for r in expected if r[0] == criterion_key("orders").hex()]
    assert rows_of(spark.sql("SELECT * FROM chain_view")) == [(*r[:9], 1) for r in orders]
    pushed = spark.sql("SELECT seq FROM chain_view WHERE seq >= 30 ORDER BY seq").collect()
    assert [r["seq"] for r in pushed] == list(range(30, 40))

    # A catalog table: created with its options; read, it gets none from pyspark 4.3.
    table = f"chain_table_{store}"
    spark.sql(f"CREATE TABLE {table} USING ketten OPTIONS (path '{dirs[2]}')")
    try:
        try:
            got = spark.sql(f"SELECT count(*) AS n FROM {table}").collect()[0]["n"]
        except Exception as exc:  # a later Spark may pass the options on
            assert "CREATE TEMPORARY VIEW" in str(exc)
        else:
            assert got == len(written)
    finally:
        spark.sql(f"DROP TABLE {table}")


def test_replicas_behind_and_forked_are_reconciled(spark: Any, tmp_path: Any) -> None:
    dirs = [str(tmp_path / f"node{i}") for i in range(4)]

    async def scenario() -> tuple[list[Event], Event]:
        first = await write_chains("sqlite", dirs, [(0, "log", 3)], [(3, 0, "log")])
        # node 3 forks: it appends its own seq 3 while node 0 goes on to seq 7.
        net = MemoryNetwork(seed=8, faults=Faults(latency=0.0))
        async with open_node(node_config("sqlite", dirs[3], net)) as forker:
            fork = await forker.append_local(criterion_key("log"), b"diverged")
        more = await write_chains("sqlite", dirs, [(0, "log", 2)], [(1, 0, "log"), (2, 0, "log")])
        rest = await write_chains("sqlite", dirs, [(0, "log", 3)], [(1, 0, "log")])
        return first + more + rest, fork

    chain, fork = trio.run(scenario)
    assert [e.seq for e in chain] == list(range(8))
    # node 0, 1: seq 0..7; node 2: behind at 0..4; node 3: 0..2 then its own seq 3.
    agreement = {0: 4, 1: 4, 2: 4, 3: 3, 4: 3, 5: 2, 6: 2, 7: 2}
    # The lagging and the forked replica are listed first: the majority branch still wins.
    paths = json.dumps([dirs[3], dirs[2], dirs[1], dirs[0]])
    df = spark.read.format("ketten").option("paths", paths).option("includeOrphans", "true").load()
    rows = sorted(df.collect(), key=lambda r: (r["orphan"], r["seq"]))
    main = [r for r in rows if not r["orphan"]]
    assert [plain(r) for r in main] == [expected_row(e, agreement[e.seq]) for e in chain]
    assert [(r["hash"], r["seq"], r["replicas"]) for r in rows if r["orphan"]] == [
        (fork.hash.hex(), 3, 1)
    ]
    # Only the lagging replica: it is read as it is.
    behind = spark.read.format("ketten").option("path", dirs[2]).load()
    assert sorted(r["seq"] for r in behind.collect()) == [0, 1, 2, 3, 4]


def test_stream_available_now_restarts_from_checkpoint_exactly_once(spark: Any,
                                                                    tmp_path: Any) -> None:
    dirs = [str(tmp_path / "node0"), str(tmp_path / "node1")]
    first = trio.run(write_chains, "file", dirs, [(0, "a", 6), (1, "b", 4)])
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run_stream() -> list[int]:
        stream = (spark.readStream.format("ketten").option("paths", ",".join(dirs))
                  .option("maxEventsPerTrigger", 4).load())
        query = (stream.writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        assert query.awaitTermination(120)
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    def output() -> list[tuple[str, int, str]]:
        return sorted((r["criterion"], r["seq"], r["hash"]) for r in spark.read.parquet(out)
                      .collect())

    def keys(events: list[Event]) -> list[tuple[str, int, str]]:
        return sorted((e.criterion.hex(), e.seq, e.hash.hex()) for e in events)

    batches = run_stream()
    assert sum(batches) == 10 and max(batches) <= 4 and len(batches) >= 3
    assert output() == keys(first)

    second = trio.run(write_chains, "file", dirs, [(0, "a", 3), (1, "c", 2)])
    batches = run_stream()
    assert sum(batches) == 5  # only the new events are read again
    assert output() == keys(first + second)  # each event exactly once

    assert run_stream() == []  # nothing new: nothing read


STREAM_SCRIPT = """
import sys
from ketten.spark import local_session

paths, out, checkpoint, trigger = sys.argv[1:5]
spark = local_session("ketten-stream-kill", config={"spark.sql.shuffle.partitions": "2"})
spark.sparkContext.setLogLevel("ERROR")
stream = (spark.readStream.format("ketten").schema("seq long, criterion string, hash string")
          .option("paths", paths).option("maxEventsPerTrigger", 7).load())
writer = (stream.writeStream.format("json").option("path", out)
          .option("checkpointLocation", checkpoint))
if trigger == "forever":
    writer = writer.trigger(processingTime="300 milliseconds")
else:
    writer = writer.trigger(availableNow=True)
writer.start().awaitTermination()
"""


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0


def test_a_stream_killed_with_sigkill_resumes_from_its_checkpoint_exactly_once(
        spark: Any, tmp_path: Path) -> None:
    """The Spark driver running a stream (declared columns, 7 events per micro-batch,
    JSON file sink) is SIGKILLed, process group and JVM, three batches in; events
    are appended and a broker is replaced (one store directory leaves, a new
    replica that pulled its chain comes in); the query restarted from its
    checkpoint delivers every event exactly once."""
    dirs = [str(tmp_path / f"node{i}") for i in range(3)]
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = trio.run(write_chains, "sqlite", dirs[:2],
                     [(0, "a", 30), (1, "b", 25), (0, "c", 9)])

    def start(paths: Sequence[str], trigger: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", STREAM_SCRIPT, ",".join(paths), str(out), str(checkpoint),
             trigger], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)

    running = start(dirs[:2], "forever")
    try:
        deadline = time.monotonic() + 300
        while committed_batches(checkpoint) < 3:
            assert running.poll() is None, running.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no three micro-batches within 300 s"
            time.sleep(0.05)
    finally:
        os.killpg(running.pid, signal.SIGKILL)
        running.wait(60)
    assert running.returncode == -signal.SIGKILL
    before = spark.read.json(str(out)).count()
    assert 21 <= before < len(first)  # killed part-way: some batches in the sink, not all

    # The chains grow, and node0 is replaced by node2, which pulls its chains.
    second = trio.run(write_chains, "sqlite", dirs,
                      [(0, "a", 6), (1, "d", 4), (1, "b", 2)],
                      [(2, 0, "a"), (2, 0, "c")])
    again = start([dirs[1], dirs[2]], "available-now")
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err.decode()[-3000:]

    sink = spark.read.json(str(out))
    assert sorted(sink.columns) == ["criterion", "hash", "seq"]  # only the declared columns
    rows = [(r["criterion"], r["seq"], r["hash"]) for r in sink.collect()]
    assert len(rows) == len(set(rows))  # nothing twice
    assert sorted(rows) == sorted((e.criterion.hex(), e.seq, e.hash.hex())
                                  for e in first + second)  # nothing lost


def corrupt(directory: str, needle: bytes) -> None:
    """Flip one byte of ``needle`` (a unique payload) wherever the store keeps it."""
    hits = 0
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "r+b") as f:
                data = f.read()
                at = data.find(needle)
                if at >= 0:
                    f.seek(at + len(needle) - 1)
                    f.write(bytes([data[at + len(needle) - 1] ^ 0x01]))
                    hits += 1
    assert hits >= 1


@pytest.mark.parametrize("store", ["sqlite", "file"])
def test_corrupted_store_names_criterion_and_seq_or_is_skipped(spark: Any, tmp_path: Any,
                                                               store: str) -> None:
    node = str(tmp_path / "node")
    written = trio.run(write_chains, store, [node], [(0, "good", 5), (0, "bad", 9)])
    bad = criterion_key("bad").hex()
    corrupt(node, b"bad:0:6:" * 3)

    with pytest.raises(Exception) as failure:
        spark.read.format("ketten").option("path", node).load().collect()
    assert f"criterion {bad} seq 6" in str(failure.value)

    reports = str(tmp_path / "damaged")
    df = (spark.read.format("ketten").option("path", node).option("skipDamaged", "true")
          .option("damagedPath", reports).load())
    got = sorted((r["criterion"], r["seq"]) for r in df.collect())
    good = [(e.criterion.hex(), e.seq) for e in written if e.criterion.hex() != bad]
    # The damaged chain stops before its damage: seq 5 is unconfirmed, seq 6 damaged.
    assert got == sorted(good + [(bad, seq) for seq in range(5)])
    records = [json.loads(Path(reports, name).read_text()) for name in os.listdir(reports)
               if name.endswith(".json")]
    assert [(r["criterion"], r["seq"]) for r in records] == [(bad, 6)]

    # verify=none checks structure only: the damaged payload is read as stored,
    # unless the store's own framing catches it (the file store checksums records).
    df = spark.read.format("ketten").option("path", node).option("verify", "none").load()
    if store == "sqlite":
        payloads = {(r["criterion"], r["seq"]): bytes(r["payload"]) for r in df.collect()}
        assert len(payloads) == len(written)
        assert payloads[(bad, 6)] != b"bad:0:6:" * 3
        assert payloads[(bad, 7)] == b"bad:0:7:" * 3
    else:
        with pytest.raises(Exception, match=f"criterion {bad} seq 6"):
            df.collect()


def test_filter_pushdown_returns_the_same_rows_as_without_it(spark: Any, tmp_path: Any) -> None:
    node = str(tmp_path / "node")
    trio.run(write_chains, "sqlite", [node], [(0, "x", 12), (0, "y", 7), (0, "z", 3)])
    queries = [
        "criterion = sha2('x', 256) AND seq >= 3 AND seq < 9",
        "criterion IN (sha2('y', 256), sha2('z', 256)) AND seq <= 2",
        "seq = 6",
        "seq > 4 AND payload LIKE 'x%'",
        "criterion = upper(sha2('x', 256))",
        "seq < 0 OR seq > 100",
        "seq > 100",
    ]

    from ketten.spark import register

    def collect(condition: str, pushdown: bool) -> list[tuple[Any, ...]]:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", str(pushdown).lower())
        register(spark)
        df = spark.read.format("ketten").option("path", node).load().where(condition)
        return rows_of(df)

    try:
        authors = sorted({r[4] for r in collect("seq >= 0", False)})
        queries += [f"author = '{authors[0]}' AND seq > 1",
                    f"author IN ('{authors[0]}', '{'0' * 64}') AND criterion = sha2('y', 256)",
                    f"author = upper('{authors[0]}')", f"author = '{authors[0]}' AND seq > 100"]
        micros = sorted(r["m"] for r in spark.read.format("ketten").option("path", node).load()
                        .selectExpr("unix_micros(time) AS m").collect())
        middle = micros[len(micros) // 2]
        queries += [f"time >= timestamp_micros({middle})",
                    f"time < timestamp_micros({middle}) AND seq > 2",
                    f"time = timestamp_micros({middle})",
                    f"time > timestamp_micros({middle + 1}) AND author = '{authors[0]}'",
                    f"time <= timestamp_micros({micros[0] - 1})"]
        for condition in queries:
            assert collect(condition, True) == collect(condition, False), condition
        assert [r[1] for r in collect(queries[0], True)] == [3, 4, 5, 6, 7, 8]
        assert len(collect(queries[-9], True)) == 22 - 2 * 3  # one writer: every chain
        assert collect(queries[-1], True) == []
        assert len(collect(queries[-5], True)) + len(collect(f"time < timestamp_micros({middle})",
                                                             True)) == 22
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
        register(spark)

    # Pushed filters really prune: a damaged chain outside them is never read.
    corrupt(node, b"z:0:1:" * 3)
    pruned = spark.read.format("ketten").option("path", node).load().where(queries[0])
    assert [r[1] for r in rows_of(pruned)] == [3, 4, 5, 6, 7, 8]


def test_a_declared_schema_reads_only_its_columns_and_the_same_rows(spark: Any,
                                                                   tmp_path: Any) -> None:
    node = str(tmp_path / "node")
    written = trio.run(write_chains, "sqlite", [node], [(0, "x", 30), (0, "y", 9), (0, "z", 1)])
    rng = random.Random(5)
    full_columns = ["criterion", "name", *ROW_FIELDS[1:]]

    def projected(df: Any, columns: list[str]) -> list[tuple[Any, ...]]:
        return sorted((tuple(bytes(v) if isinstance(v, bytearray) else v for v in row)
                       for row in df.select(*columns).collect()),
                      key=lambda r: tuple((v is None, str(v)) for v in r))

    types = {f.name: f.dataType.simpleString() for f in
             spark.read.format("ketten").option("path", node).load().schema.fields}
    subsets = [["seq"], ["criterion", "seq"], ["seq", "name", "criterion"], ["author"],
               ["payload", "seq"], ["replicas", "hash", "prev"]]
    subsets += [rng.sample(full_columns, rng.randint(1, len(full_columns))) for _ in range(6)]
    for verify in ("none", "links"):
        everything = (spark.read.format("ketten").option("path", node)
                      .option("criteria", "x,y,z").option("verify", verify).load())
        for columns in subsets:
            declared = ", ".join(f"{c} {types[c]}" for c in columns)
            pruned = (spark.read.format("ketten").schema(declared).option("path", node)
                      .option("criteria", "x,y,z").option("verify", verify).load())
            assert pruned.columns == columns
            assert projected(pruned, columns) == projected(everything, columns), (verify, columns)
            where = pruned.where("seq >= 3 AND seq < 7") if "seq" in columns else pruned
            assert where.count() == (
                sum(1 for e in written if 3 <= e.seq < 7) if "seq" in columns else len(written))

    # With verify=none, criterion, name and seq come from the chains' heads: no event
    # is read, not even one that is gone. Any other column, or verify=links, reads them.
    with contextlib.closing(sqlite3.connect(os.path.join(node, "ketten.sqlite3"))) as db:
        db.execute("DELETE FROM events WHERE criterion = ? AND seq = 5", (criterion_key("x"),))
        db.commit()

    def heads(verify: str) -> Any:
        return (spark.read.format("ketten").schema("criterion string, seq long")
                .option("path", node).option("verify", verify).load())

    assert heads("none").count() == len(written)
    x = criterion_key("x").hex()
    assert sorted(r["seq"] for r in heads("none").where(f"criterion = '{x}'").collect()
                  ) == list(range(30))
    with pytest.raises(Exception, match=f"criterion {x}"):
        heads("links").collect()
    # verify=none reads events as stored (structure only): seq 5 is simply not there.
    read = (spark.read.format("ketten").schema("seq long, author string").option("path", node)
            .option("verify", "none").load())
    assert read.count() == len(written) - 1

    for bad, message in [("seq string", r"column 'seq' of the ketten source is bigint"),
                         ("sequence long", r"no column 'sequence'"),
                         ("seq long, seq long", r"named twice")]:
        with pytest.raises(Exception, match=message):
            spark.read.format("ketten").schema(bad).option("path", node).load().collect()


def test_criteria_by_name_and_errors_instead_of_empty_frames(spark: Any, tmp_path: Any) -> None:
    node = str(tmp_path / "node")
    trio.run(write_chains, "sqlite", [node], [(0, "orders", 5), (0, "payments", 3)])
    read = spark.read.format("ketten").option("path", node)
    by_option = read.option("criteria", "orders").load()
    assert sorted((r["name"], r["seq"]) for r in by_option.collect()) == [
        ("orders", i) for i in range(5)]
    def everything() -> Any:  # a DataFrame per query: see ketten.spark.register on Spark 4.3
        return spark.read.format("ketten").option("path", node).load()

    # Stored events hold keys only: a name is known where the query gives it.
    assert {r["name"] for r in everything().collect()} == {None}
    named = everything().where("name = 'orders'")
    assert rows_of(named) == rows_of(by_option)
    assert {r["name"] for r in named.collect()} == {"orders"}
    assert everything().where("name IN ('orders', 'payments')").count() == 8
    everything().createOrReplaceTempView("named_events")
    assert spark.sql("SELECT count(*) AS n FROM named_events WHERE name = 'payments'"
                     ).collect()[0]["n"] == 3
    with pytest.raises(Exception, match=r"criterion column holds keys.*name = 'orders'"):
        everything().where("criterion = 'orders'").collect()
    with pytest.raises(Exception, match=r"criterion 'Orders' \(key [0-9a-f]{64}\) is held by "
                       r"none of the sources read"):
        spark.read.format("ketten").option("path", node).option("criteria", "Orders").load(
        ).collect()
    with pytest.raises(Exception, match="does not exist"):
        spark.read.format("ketten").option("path", str(tmp_path / "nowhere")).load()
    with pytest.raises(Exception, match=r"unknown option.*critera"):
        spark.read.format("ketten").option("path", node).option("critera", "orders").load()


def test_analytics_example_runs_and_finds_the_lagging_replica() -> None:
    """``examples/spark_analytics.py`` end to end, in its own process and Spark session."""
    example = Path(__file__).resolve().parent.parent / "examples" / "spark_analytics.py"
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|"))
            for line in done.stdout.splitlines() if line.startswith("|")}
    # name, events, % on all 3 replicas, min replicas: 30 late payments missed node 4.
    assert {("orders", "180", "100.0", "3"), ("payments", "150", "80.0", "2"),
            ("shipments", "90", "100.0", "3")} <= rows
    # Per author: the single payments writer wrote all 150.
    assert any(row[0] == "payments" and row[2:] == ("150", "149") for row in rows)
