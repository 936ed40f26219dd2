"""Spark reading ketten chains against Spark reading the same rows from Parquet.

    python bench/bench_spark.py [--events 1000000] [--chains 100] [--data DIR]

Writes ``--events`` signed events (``--chains`` chains) straight through the
``sqlite`` store plugin (batched appends), then, in one local[2] Spark
session, times on the ``ketten`` source and on a Parquet copy of the same
DataFrame, in interleaved rounds: ``count()`` (also with the declared schema
``seq long`` and ``verify=none``, answered from the chains' heads),
``groupBy(criterion).count()``, ``groupBy(author).count()`` (also with the
declared schema ``author string``), a full scan (every column materialised,
``format("noop")``), one author's events (pushed down) and a range query on
one chain (pushed down); beside the
range query, the heads count, the groupBy(author) and the full scan, the floor of any Python
data source: one that hands Spark as many constant rows and reads nothing. Every
DataFrame is loaded once, before the rounds, on both sides: the rounds time
the queries. Reports
events/s of the best round, the ratio of the best times (Parquet / ketten:
above 1, ketten is faster) and the median of the rounds' ratios.
``--data`` keeps the generated store to reuse it in the next run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import trio

from ketten import Event, Identity, criterion_key
from ketten.plugins.sqlite_store import SqliteStore

PAYLOAD = 96
BATCH = 5000


def _constant_source(name: str, rows: int, parts: int, schema: object | None = None,
                     batch: int = 8192) -> type:
    """A Python data source that reads nothing and hands Spark ``rows`` rows in
    ``parts`` partitions of ``batch``-row Arrow batches, built from constants without a
    Python loop: the ``author`` column alone, or every column of ``schema`` (the
    ``ketten`` source's) with values of the same widths. What any Python source
    pays for the rows it hands Spark, whatever it reads."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    full = schema is not None
    fields = ([(f.name, f.nullable) for f in schema.fields] if full  # type: ignore[attr-defined]
              else [("author", True)])

    class ConstantReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            share = -(-rows // parts)
            return [InputPartition((i * share, min(rows, (i + 1) * share))) for i in range(parts)]

        def read(self, partition: object) -> object:
            import numpy as np
            import pyarrow as pa

            def text(width: int, n: int, kinds: int = 3) -> pa.Array:
                cycle = b"".join(bytes([97 + k]) * width for k in range(kinds))
                data = (cycle * (-(-n // kinds)))[: width * n]
                offsets = np.arange(0, width * (n + 1), width, dtype=np.int32)
                return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))

            def blob(width: int, n: int) -> pa.Array:
                offsets = np.arange(0, width * (n + 1), width, dtype=np.int32)
                return pa.BinaryArray.from_buffers(pa.binary(), n, [
                    None, pa.py_buffer(offsets), pa.py_buffer(bytes(width * n))])

            def timestamps(n: int) -> pa.Array:
                return pa.array(np.full(n, 1_700_000_000_000_000, dtype=np.int64),
                                type=pa.timestamp("us", tz="UTC"))

            makers: dict[str, Callable[[int, int], pa.Array]] = {
                "criterion": lambda low, n: text(64, n, 1),
                "name": lambda low, n: pa.nulls(n, pa.string()),
                "seq": lambda low, n: pa.array(np.arange(low, low + n, dtype=np.int64)),
                "hash": lambda low, n: text(64, n, 1),
                "prev": lambda low, n: text(64, n, 1),
                "author": lambda low, n: text(64, n),
                "command": lambda low, n: pa.nulls(n, pa.int64()),
                "clock": lambda low, n: blob(8, n),
                "time": lambda low, n: timestamps(n),
                "payload": lambda low, n: blob(PAYLOAD, n),
                "replicas": lambda low, n: pa.array(np.full(n, 3, dtype=np.int32)),
            }
            first, stop = partition.value  # type: ignore[attr-defined]
            for low in range(first, stop, batch):
                n = min(batch, stop - low)
                arrays = [makers[c](low, n) for c, _ in fields]
                yield pa.RecordBatch.from_arrays(arrays, schema=pa.schema([
                    pa.field(c, a.type, nullable=nullable)
                    for (c, nullable), a in zip(fields, arrays, strict=True)]))

    class ConstantSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> object:
            return schema

        def reader(self, schema: object) -> DataSourceReader:
            return ConstantReader()

    return ConstantSource


def _make_chain(job: tuple[int, int, bytes]) -> list[bytes]:
    """The encoded events of chain ``index`` (signed; authors rotate among three keys)."""
    index, count, seed = job
    authors = [Identity.from_seed(bytes([k]) * 31 + seed[:1]) for k in range(3)]
    criterion = criterion_key(f"bench-{index}")
    rng = __import__("random").Random(index)
    prev = None
    out = []
    for seq in range(count):
        author = authors[seq % 3]
        event = Event.create(
            author, criterion=criterion, seq=seq, prev=prev,
            payload=rng.randbytes(PAYLOAD), time=1_700_000_000_000 + seq * 7,
            command=seq, clock=seq.to_bytes(8, "big"),
        )
        prev = event.hash
        out.append(event.to_bytes())
    return out


async def _write(path: str, chains: list[list[bytes]]) -> None:
    store = SqliteStore(path=path)
    await store.open()
    try:
        for encoded in chains:
            for begin in range(0, len(encoded), BATCH):
                await store.append([Event.from_bytes(raw) for raw in encoded[begin:begin + BATCH]])
    finally:
        await store.aclose()


def generate(path: str, events: int, chains: int) -> None:
    per_chain = events // chains
    jobs = [(i, per_chain + (1 if i < events % chains else 0), b"\x07") for i in range(chains)]
    started = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        encoded = pool.map(_make_chain, jobs, chunksize=4)
    signed = time.perf_counter()
    trio.run(_write, path, encoded)
    done = time.perf_counter()
    print(f"generated {events:,} events in {chains} chains: signing {signed - started:.1f} s, "
          f"sqlite appends {done - signed:.1f} s ({events / (done - signed):,.0f} events/s)")


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def best_of(runs: int, action: Callable[[], object]) -> float:
    return min(timed(action) for _ in range(runs))


def interleaved(runs: int, *actions: Callable[[], object]) -> list[list[float]]:
    """The times of each action over ``runs`` rounds that run every action once, in
    turn, so that load from elsewhere on the machine hits all of them alike."""
    times: list[list[float]] = [[] for _ in actions]
    for _ in range(runs):
        for i, action in enumerate(actions):
            times[i].append(timed(action))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--chains", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", help="store directory to create or reuse")
    parser.add_argument("--modes", default="none,full",
                        help="other verify modes to time the full scan with ('' for none)")
    args = parser.parse_args()

    scratch = tempfile.mkdtemp(prefix="ketten-bench-spark-")
    store = args.data or os.path.join(scratch, "store")
    marker = os.path.join(store, f".bench-{args.events}-{args.chains}")
    if not os.path.exists(marker):
        shutil.rmtree(store, ignore_errors=True)
        generate(store, args.events, args.chains)
        open(marker, "w").close()

    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from ketten.spark import COMPILED_DECODER, local_session

    spark = local_session("bench_spark", config={"spark.driver.memory": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        def ketten_df(verify: str = "links") -> object:
            return spark.read.format("ketten").option("path", store).option("verify", verify).load()

        source = ketten_df()
        rows = source.count()  # warms the JVM and the Python workers
        assert rows == args.events, f"expected {args.events} rows, read {rows}"
        parquet_path = os.path.join(scratch, "events.parquet")
        source.write.mode("overwrite").parquet(parquet_path)
        parquet = spark.read.parquet(parquet_path)
        parquet.count()

        def full_scan(df: object) -> None:
            df.write.format("noop").mode("overwrite").save()  # type: ignore[attr-defined]

        def grouped(df: object) -> None:
            df.groupBy("criterion").count().collect()  # type: ignore[attr-defined]

        def declared(schema: str, verify: str = "links") -> object:
            return (spark.read.format("ketten").schema(schema).option("path", store)
                    .option("verify", verify).load())

        def by_author(df: object) -> None:
            df.groupBy("author").count().collect()  # type: ignore[attr-defined]

        one = parquet.select("criterion").first()[0]  # type: ignore[attr-defined]
        per_chain = args.events // args.chains
        low, high = per_chain // 10, per_chain // 10 + per_chain // 5
        in_range = f"criterion = '{one}' AND seq >= {low} AND seq < {high}"

        def ranged(df: object) -> None:
            df.where(in_range).write.format("noop").mode("overwrite").save()  # type: ignore[attr-defined]

        writer = parquet.select("author").first()[0]  # type: ignore[attr-defined]

        def by_one_author(df: object) -> None:
            (df.where(f"author = '{writer}'")  # type: ignore[attr-defined]
             .write.format("noop").mode("overwrite").save())

        # Every DataFrame is loaded once, before the rounds, as the Parquet one is:
        # the rounds time the queries, not ``load()`` (which, for a Python data
        # source, asks a Python worker for the source and its schema).
        heads_df = declared("seq long", "none")
        authors_df = declared("author string")

        parts = source.rdd.getNumPartitions()  # type: ignore[attr-defined]
        seqs = StructType([StructField("seq", LongType())])
        for name, count, partitions, columns, batch in [
            ("python_floor", high - low, 1, seqs, 8192),
            ("python_authors", rows, parts, StructType([StructField("author", StringType())]),
             8192),
            ("python_rows", rows, parts, source.schema, 8192),  # type: ignore[attr-defined]
            # As the rows made from the chains' heads: their partitions, 16 x 8,192-row batches.
            ("python_seqs", rows, heads_df.rdd.getNumPartitions(),  # type: ignore[attr-defined]
             seqs, 8192 * 16),
        ]:
            spark.dataSource.register(_constant_source(name, count, partitions, columns, batch))
        floor_df = spark.read.format("python_floor").load()
        authors_floor = spark.read.format("python_authors").load()
        rows_floor = spark.read.format("python_rows").load()
        seqs_floor = spark.read.format("python_seqs").load()

        def floor() -> None:
            floor_df.write.format("noop").mode("overwrite").save()

        # (label, ketten, parquet): each runs its query and returns when Spark is done.
        operations: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
            ("count()", lambda: source.count(), lambda: parquet.count()),  # type: ignore[attr-defined]
            ("count(), heads (1)", lambda: heads_df.count(),  # type: ignore[attr-defined]
             lambda: parquet.count()),  # type: ignore[attr-defined]
            ("count(), floor (5)", lambda: seqs_floor.count(),
             lambda: parquet.count()),  # type: ignore[attr-defined]
            ("groupBy(criterion).count()", lambda: grouped(source), lambda: grouped(parquet)),
            ("groupBy(author).count()", lambda: by_author(source), lambda: by_author(parquet)),
            ("groupBy(author), pruned (2)", lambda: by_author(authors_df),
             lambda: by_author(parquet)),
            ("groupBy(author), floor (5)", lambda: by_author(authors_floor),
             lambda: by_author(parquet)),
            ("full scan", lambda: full_scan(source), lambda: full_scan(parquet)),
            ("full scan, floor (5)", lambda: full_scan(rows_floor),
             lambda: full_scan(parquet)),
            (f"range: 1 chain, {high - low:,} seqs", lambda: ranged(source),
             lambda: ranged(parquet)),
            ("range floor (3)", floor, lambda: ranged(parquet)),
            ("author = one of 3 (4)", lambda: by_one_author(source),
             lambda: by_one_author(parquet)),
        ]
        print(f"\n{rows:,} events, Spark local[2], {args.runs} interleaved rounds, "
              f"{'compiled' if COMPILED_DECODER else 'numpy'} decoder")
        print(f"{'operation':<30}{'ketten s':>10}{'ev/s':>12}{'parquet s':>11}{'ev/s':>12}"
              f"{'ratio':>8}{'median':>8}")
        for label, ours_op, theirs_op in operations:
            ours_all, theirs_all = interleaved(args.runs, ours_op, theirs_op)
            ours, theirs = min(ours_all), min(theirs_all)
            median = statistics.median(t / o for t, o in zip(theirs_all, ours_all))
            print(f"{label:<30}{ours:>10.2f}{rows / ours:>12,.0f}{theirs:>11.2f}"
                  f"{rows / theirs:>12,.0f}{theirs / ours:>8.2f}{median:>8.2f}")
        for verify in [m for m in args.modes.split(",") if m]:
            seconds = best_of(1, lambda v=verify: full_scan(ketten_df(v)))
            print(f"{'full scan, verify=' + verify:<30}{seconds:>10.2f}{rows / seconds:>12,.0f}")
        print("ratio = Parquet's best time / ketten's best time (above 1: ketten is faster); "
              "median = median of the rounds' ratios. Default reads have every column and "
              "verify=links.\n(1) schema 'seq long', verify=none: rows from the chains' heads, "
              "no event read. (2) schema 'author string': only that column handed to Spark. "
              "The range query's events/s count the whole table. (3) a Python source that reads "
              "nothing and hands Spark as many constant rows as the range query returns. (4) every "
              "column of one author's events (pushed down: filtered before Spark gets them). (5) a Python "
              "source that reads nothing and hands Spark as many rows as the line above, built "
              "from constants in the same partitions and batch size: the most any Python "
              "data source can reach.")
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
