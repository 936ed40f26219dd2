"""Analytics over a simulated ketten cluster with Spark.

Five nodes on a simulated network, each with its own sqlite store, publish
on three criteria; every chain is replicated on three of the nodes by
pulling from the writer, and one replica of ``payments`` falls behind. Spark
then reads all five store directories through the ``ketten`` source and
shows events per criterion and author, the publish rate over time, and how
well the replicas agree.

    python examples/spark_analytics.py
"""

from __future__ import annotations

import os
import random
import tempfile

import trio

import ketten
from ketten import NodeConfig, criterion_key, open_node
from ketten.adapters.memory import Faults, MemoryNetwork

NODES = 5
# criterion -> (writers, replica nodes, events)
CHAINS = {
    "orders": ([0, 1], [0, 1, 2], 180),
    "payments": ([2], [2, 3, 4], 120),
    "shipments": ([3, 4], [3, 4, 0], 90),
}
LATE_PAYMENTS = 30


async def simulate(directories: list[str]) -> None:
    network = MemoryNetwork(seed=1, faults=Faults(latency=0.002))
    plugins = ketten.plugin_manager()
    rng = random.Random(1)
    configs = [
        NodeConfig(store="sqlite", options={"store": {"path": d}, "transport": {"network": network}})
        for d in directories
    ]
    async with open_node(configs[0], plugins=plugins) as n0, \
            open_node(configs[1], plugins=plugins) as n1, \
            open_node(configs[2], plugins=plugins) as n2, \
            open_node(configs[3], plugins=plugins) as n3, \
            open_node(configs[4], plugins=plugins) as n4:
        nodes = [n0, n1, n2, n3, n4]
        for name, (writers, replicas, count) in CHAINS.items():
            key = criterion_key(name)
            for i in range(count):
                # One writer at a time appends to its local head, then the
                # others catch up before writing (a chain has one head).
                writer = nodes[rng.choice(writers)]
                for other in writers:
                    if nodes[other] is not writer:
                        await writer.pull(nodes[other].address, key)
                await writer.append_local(key, f"{name} #{i}".encode(), command=i)
                if i % 10 == 0:
                    await trio.sleep(0.01)
            source = nodes[writers[0]]
            for other in writers[1:]:
                await source.pull(nodes[other].address, key)
            for replica in replicas:
                if nodes[replica] is not source:
                    await nodes[replica].pull(source.address, key)
        # Later payments reach node 3 but not node 4, which has fallen behind.
        payments = criterion_key("payments")
        for i in range(LATE_PAYMENTS):
            await n2.append_local(payments, f"payments late #{i}".encode())
        await n3.pull(n2.address, payments)


def analyse(directories: list[str]) -> None:
    from pyspark.sql import functions as F

    from ketten.spark import local_session

    spark = local_session("ketten-analytics")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        # Chains asked for by name carry it in the name column.
        events = (spark.read.format("ketten").option("paths", ",".join(directories))
                  .option("criteria", ",".join(CHAINS)).option("verify", "full").load()
                  .cache())

        print("\nEvents per criterion and author")
        (events.groupBy("name", F.substring("author", 1, 12).alias("author"))
         .agg(F.count("*").alias("events"), F.max("seq").alias("last seq"))
         .orderBy("name", "author").show(truncate=False))

        print("Publish rate (events per second of the authors' clocks)")
        (events.groupBy(F.window("time", "1 second").alias("w"))
         .agg(F.count("*").alias("events"),
              F.countDistinct("criterion").alias("criteria"))
         .select(F.col("w.start").alias("second"), "events", "criteria")
         .orderBy("second").show(truncate=False))

        print("Replica agreement (how many of the 5 stores hold each event)")
        (events.groupBy("name").pivot("replicas").count().na.fill(0)
         .orderBy("name").show())
        (events.groupBy("name")
         .agg(F.count("*").alias("events"),
              F.round(F.avg((F.col("replicas") >= 3).cast("int")) * 100, 1)
              .alias("% on all 3 replicas"),
              F.min("replicas").alias("min replicas"))
         .orderBy("name").show())
    finally:
        spark.stop()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ketten-analytics-") as base:
        directories = [os.path.join(base, f"node{i}") for i in range(NODES)]
        trio.run(simulate, directories)
        analyse(directories)


if __name__ == "__main__":
    main()
