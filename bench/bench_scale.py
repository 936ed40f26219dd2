"""Scale benchmark: 50 Kademlia nodes on loopback TCP, side by side with ``kademlia``.

Figures, all measured in the same run:

* **ketten, one process**: ``--nodes`` (50) nodes on loopback TCP with the
  ``kademlia`` overlay in this process, ``r = 3``. ``--criteria`` (100)
  chains are started first (not timed); then publishes (signed, hash-linked,
  acknowledged by a majority of the chain's brokers) from random nodes to
  random chains: ``--sequential`` (500) one at a time, then ``--in-flight``
  (1,000) all at once (success rate, throughput, latency percentiles); then
  every acknowledged event is read back through another random node.
* **baseline**: ``kademlia`` 2.2.3 from PyPI (bmuller/kademlia, asyncio over
  UDP), the same number of nodes on the same loopback: ``set`` one at a time
  and ``--in-flight`` sets at once, then ``get`` of every key. It is
  installed into its own virtual environment (``--baseline-venv``, created
  on first use), never into ketten's.
* **idle** (``--idle 0,1000,10000``): CPU share of 20 nodes holding that
  many chains, over ``--idle-seconds``; each figure is also given as a ratio
  to the 0-chain figure.
* **processes** (``--processes N``): the same publish load against ``N``
  ``ketten serve`` processes (one node each, SQLite), driven from 5 client
  nodes in this process.

Publishes beyond a node's ``max_publishing`` wait their turn; the nodes of
one process share one core, so the one-process run sets it low (4).

    python bench/bench_scale.py [--nodes 50] [--criteria 100] [--sequential 500]
        [--in-flight 1000] [--idle 0,1000] [--idle-seconds 20] [--processes 0]
        [--no-baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

import ketten
from ketten import Identity, NodeConfig, open_node

BASELINE = "kademlia==2.2.3"

_BASELINE_SCRIPT = r"""
import asyncio, json, logging, random, sys, time
from kademlia.network import Server
logging.disable(logging.CRITICAL)
n, sequential, in_flight, port = (int(a) for a in sys.argv[1:5])
async def main():
    servers = []
    for i in range(n):
        server = Server()
        await server.listen(port + i, interface="127.0.0.1")
        if servers:
            await server.bootstrap([("127.0.0.1", port)])
        servers.append(server)
    for server in servers[1:]:
        await server.bootstrap([("127.0.0.1", port)])
    rng = random.Random(3)
    started = time.perf_counter()
    ok = 0
    for i in range(sequential):
        ok += bool(await servers[rng.randrange(n)].set(f"s-{i}", "x" * 100))
    seq_time = time.perf_counter() - started
    started = time.perf_counter()
    results = await asyncio.gather(*[servers[rng.randrange(n)].set(f"c-{i}", "y" * 100)
                                     for i in range(in_flight)], return_exceptions=True)
    flight_time = time.perf_counter() - started
    stored = sum(1 for r in results if r is True)
    got = await asyncio.gather(*[servers[rng.randrange(n)].get(f"c-{i}")
                                 for i in range(in_flight)], return_exceptions=True)
    read = sum(1 for r in got if r == "y" * 100)
    print(json.dumps({"sequential_ok": ok, "sequential_per_s": sequential / seq_time,
                      "in_flight_ok": stored, "in_flight_s": flight_time, "read": read}))
    for server in servers:
        server.stop()
asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# -- ketten --------------------------------------------------------------------------


async def start_nodes(nursery: trio.Nursery, count: int, *, seeds: list[str] | None = None,
                      max_publishing: int = 16) -> list[ketten.Node]:
    plugins = ketten.plugin_manager()
    nodes: list[ketten.Node] = []

    async def run(index: int, boot: list[str], task_status: trio.TaskStatus[ketten.Node]) -> None:
        options: dict[str, dict[str, object]] = {
            "overlay": {"bootstrap": boot}, "replication": {"max_publishing": max_publishing}}
        config = NodeConfig(identity=Identity.from_seed(bytes([index % 251 + 1]) * 32),
                            transport="tcp", overlay="kademlia", options=options)
        async with open_node(config, plugins=plugins) as node:
            task_status.started(node)
            await trio.sleep_forever()

    for index in range(count):
        boot = seeds if seeds is not None else ([nodes[0].address] if nodes else [])
        nodes.append(await nursery.start(run, index, boot))
    return nodes


async def publish_load(nodes: list[ketten.Node], criteria: int, sequential: int,
                       in_flight: int) -> dict[str, float]:
    rng = random.Random(11)
    names = [f"scale-{i}" for i in range(criteria)]
    for index, name in enumerate(names):
        await nodes[index % len(nodes)].publish(name, b"first", deadline=60)
    started = time.perf_counter()
    for _ in range(sequential):
        await rng.choice(nodes).publish(rng.choice(names), b"x" * 100)
    seq_rate = sequential / (time.perf_counter() - started)

    acked: list[tuple[str, ketten.Event]] = []
    latencies: list[float] = []
    failures: dict[str, int] = {}

    async def one() -> None:
        name = rng.choice(names)
        begun = time.perf_counter()
        try:
            event = await rng.choice(nodes).publish(name, b"y" * 100)
        except ketten.KettenError as exc:
            failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
            return
        latencies.append(time.perf_counter() - begun)
        acked.append((name, event))

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(in_flight):
            nursery.start_soon(one)
    flight_time = time.perf_counter() - started
    if failures:
        print("  publishes that failed, by error:",
              ", ".join(f"{n} {kind}" for kind, n in sorted(failures.items())))
    read = 0
    by_name: dict[str, set[bytes]] = {}
    for name, event in acked:
        by_name.setdefault(name, set()).add(event.hash)
    for name, hashes in by_name.items():
        chain = await rng.choice(nodes).read(name)
        read += len(hashes & {e.hash for e in chain})
    return {"sequential_per_s": seq_rate, "in_flight_ok": len(acked),
            "in_flight_s": flight_time, "p50": percentile(latencies, 0.5),
            "p99": percentile(latencies, 0.99), "read": read,
            "failures": float(sum(failures.values()))}


async def one_process(args: argparse.Namespace) -> dict[str, float]:
    async with trio.open_nursery() as nursery:
        nodes = await start_nodes(nursery, args.nodes, max_publishing=args.max_publishing)
        await trio.sleep(2.0)
        figures = await publish_load(nodes, args.criteria, args.sequential, args.in_flight)
        nursery.cancel_scope.cancel()
    return figures


async def idle_cpu(chains: int, seconds: float) -> float:
    async with trio.open_nursery() as nursery:
        nodes = await start_nodes(nursery, 20)
        turns = trio.Semaphore(32)

        async def start(index: int) -> None:
            async with turns:
                await nodes[index % len(nodes)].publish(f"idle-{index}", b"x", deadline=120)

        async with trio.open_nursery() as starting:
            for index in range(chains):
                starting.start_soon(start, index)
        await trio.sleep(10.0)  # settle: the creations' own traffic ends
        cpu, wall = time.process_time(), time.perf_counter()
        await trio.sleep(seconds)
        share = (time.process_time() - cpu) / (time.perf_counter() - wall)
        nursery.cancel_scope.cancel()
    return share


async def processes(args: argparse.Namespace, root: Path) -> dict[str, float]:
    ports = [free_port() for _ in range(args.processes)]
    first = f"127.0.0.1:{ports[0]}"
    popens: list[subprocess.Popen[bytes]] = []
    try:
        for index, port in enumerate(ports):
            log = open(root / f"serve{index}.log", "wb")  # noqa: SIM115 - closed with the process
            popen = subprocess.Popen(
                [sys.executable, "-m", "ketten._cli", "serve", "--data", str(root / f"s{index}"),
                 "--key", str(root / f"s{index}.key"), "--listen", f"127.0.0.1:{port}",
                 *(["--bootstrap", first] if index else [])],
                stdout=subprocess.PIPE, stderr=log)
            popens.append(popen)
            assert popen.stdout is not None
            line = popen.stdout.readline().decode()
            if "serving at" not in line:
                raise RuntimeError(f"ketten serve did not start: {line!r}")
        async with trio.open_nursery() as nursery:
            clients = await start_nodes(nursery, 5, seeds=[first])
            await trio.sleep(3.0)
            figures = await publish_load(clients, args.criteria, args.sequential, args.in_flight)
            nursery.cancel_scope.cancel()
        return figures
    finally:
        for popen in popens:
            popen.send_signal(signal.SIGTERM)
        for popen in popens:
            try:
                popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                popen.kill()


# -- baseline ------------------------------------------------------------------------


def baseline(args: argparse.Namespace) -> dict[str, float] | None:
    venv = Path(args.baseline_venv)
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    check = subprocess.run([str(python), "-c", "import kademlia; print(kademlia.__version__)"],
                           capture_output=True, text=True)
    if check.returncode != 0 or check.stdout.strip() != BASELINE.split("==")[1]:
        subprocess.run([str(python), "-m", "pip", "install", "-q", BASELINE], check=True)
    out = subprocess.run([str(python), "-c", _BASELINE_SCRIPT, str(args.nodes),
                          str(args.sequential), str(args.in_flight), str(20000 + os.getpid() % 20000)],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        print(f"baseline failed: {out.stderr[-2000:]}")
        return None
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def show(label: str, figures: dict[str, float], in_flight: int) -> None:
    if not in_flight:
        print(f"{label}: one at a time {figures['sequential_per_s']:.1f} publishes/s")
        return
    print(f"{label}: one at a time {figures['sequential_per_s']:.1f} publishes/s; "
          f"{in_flight} in flight: {figures['in_flight_ok']:.0f} acknowledged "
          f"({100 * figures['in_flight_ok'] / in_flight:.1f} %) in {figures['in_flight_s']:.1f} s "
          f"= {figures['in_flight_ok'] / figures['in_flight_s']:.0f}/s, latency p50 "
          f"{figures['p50']:.2f} s p99 {figures['p99']:.2f} s; read back {figures['read']:.0f} of "
          f"{figures['in_flight_ok']:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--criteria", type=int, default=100)
    parser.add_argument("--sequential", type=int, default=500)
    parser.add_argument("--in-flight", type=int, default=1000, dest="in_flight")
    parser.add_argument("--idle", default="0,1000")
    parser.add_argument("--idle-seconds", type=float, default=20.0, dest="idle_seconds")
    parser.add_argument("--processes", type=int, default=0)
    parser.add_argument("--max-publishing", type=int, default=4, dest="max_publishing",
                        help="publish calls each node works on at once (the nodes of one "
                             "process share its CPU; default 4)")
    parser.add_argument("--no-baseline", action="store_true", dest="no_baseline")
    parser.add_argument("--baseline-venv", dest="baseline_venv",
                        default=str(Path(tempfile.gettempdir()) / "ketten-bench-kademlia"))
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")

    ours = trio.run(one_process, args)
    show(f"ketten, {args.nodes} nodes in one process (max_publishing {args.max_publishing})",
         ours, args.in_flight)
    if not args.no_baseline:
        theirs = baseline(args)
        if theirs is not None:
            print(f"{BASELINE}, {args.nodes} nodes: one at a time "
                  f"{theirs['sequential_per_s']:.1f} sets/s; {args.in_flight} in flight: "
                  f"{theirs['in_flight_ok']:.0f} stored in {theirs['in_flight_s']:.1f} s; "
                  f"read back {theirs['read']:.0f}")
            print(f"ratio ketten / kademlia, one at a time: "
                  f"{ours['sequential_per_s'] / theirs['sequential_per_s']:.2f}")
    chains = [int(c) for c in args.idle.split(",") if c.strip()]
    shares = {c: trio.run(idle_cpu, c, args.idle_seconds) for c in chains}
    for count, share in shares.items():
        ratio = f" ({share / shares[0]:.2f}x the 0-chain figure)" if 0 in shares and count else ""
        print(f"idle: 20 nodes holding {count} chains use {share:.3f} of a core{ratio}")
    if args.processes:
        with tempfile.TemporaryDirectory() as tmp:
            served = trio.run(processes, args, Path(tmp))
        show(f"ketten, {args.processes} `ketten serve` processes + 5 client nodes", served,
             args.in_flight)


if __name__ == "__main__":
    main()
