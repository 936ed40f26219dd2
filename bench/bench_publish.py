"""Publish benchmark: 5 nodes on loopback TCP, r = 3, SQLite stores.

Each node is its own process (as in a deployment; one Python process cannot
use more than one core). Figures:

* publish throughput, one criterion, one publisher, sequential calls;
* publish throughput, 64 criteria published concurrently from all nodes
  (target >= 2,000 acknowledged events/s on a 2-core machine);
* the signature bound measured in the same run: every acknowledged event
  costs one sign and ``r`` verifies, so the machine cannot acknowledge more
  than ``verify rate x cores / r`` events per second; the concurrent figure
  is printed as a ratio to it.

    python bench/bench_publish.py [--sequential 300] [--criteria 64] [--per-criterion 150]
                                  [--store sqlite|memory] [--compare] [--inline-limit 0.005]
                                  [--compare-encryption] [--encryption-rounds 2]
                                  [--gc-threshold 50000]

The machine's load average is printed too: on a shared machine the figures
move with it. The CPU time all nodes spent per acknowledged event in the
concurrent run (every worker publishes there) moves less. ``--compare``
repeats the publish runs with memory stores: the difference is what the
durable store costs; ``--compare-encryption`` runs them with frame encryption on and off, in the
order on, off, off, on (``--encryption-rounds``, 2: then off, on, on, off)
and compares the means (the ratio on / off is what encryption costs). Catching up (copying a chain to a new broker) is
measured by ``bench_reconfig.py``. The node processes set their collector as
``ketten serve`` does (:func:`ketten.tune_gc`); ``--gc-threshold 0`` keeps
Python's own settings.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from ketten import Event, Identity, NodeConfig, criterion_key, open_node, tune_gc, verify_signature

WORKERS = 5
GC_THRESHOLD = 50_000
"""The node processes' youngest-generation gc threshold: ``ketten serve``'s default."""


def identity(index: int) -> Identity:
    return Identity.from_seed(bytes([index + 1]) * 32)


def config(index: int, base: Path, seeds: list[str], store: str = "sqlite",
           inline_limit: float = 0.005, encrypt: bool = True) -> NodeConfig:
    stored = {"path": str(base / f"node{index}"), "check_on_open": False,
              "inline_limit": inline_limit}
    return NodeConfig(
        identity=identity(index), transport="tcp", store=store, overlay="static",
        request_timeout=20.0,
        options={"store": stored if store == "sqlite" else {},
                 "transport": {"encrypt": encrypt},
                 "overlay": {"seeds": seeds},
                 "replication": {"anti_entropy": 600.0}},
    )


# -- worker process -----------------------------------------------------------------


async def worker(index: int, base: Path, seeds: list[str], store: str,
                 inline_limit: float, encrypt: bool) -> None:
    async with open_node(config(index, base, seeds, store, inline_limit, encrypt)) as node:
        tune_gc(GC_THRESHOLD)  # as ``ketten serve`` does
        print("READY", node.address, flush=True)
        stdin = trio.wrap_file(sys.stdin)
        while True:
            line = (await stdin.readline()).split()
            if not line or line[0] == "quit":
                return
            if line[0] == "members":
                assert node.overlay is not None
                print("MEMBERS", node.overlay.statistics().live, flush=True)
            elif line[0] == "publish":
                prefix, first, count, per = line[1], int(line[2]), int(line[3]), int(line[4])
                keys = [criterion_key(f"{prefix}{i}") for i in range(first, first + count)]
                async with trio.open_nursery() as nursery:
                    for key in keys:
                        nursery.start_soon(node.publish, key, b"warm up")
                print("WARM", flush=True)
                await trio.wrap_file(sys.stdin).readline()
                acked = 0
                cpu = time.process_time()
                began = time.perf_counter()

                async def publisher(key: bytes, per: int) -> None:
                    nonlocal acked
                    for n in range(per):
                        await node.publish(key, b"event %d" % n)
                        acked += 1

                async with trio.open_nursery() as nursery:
                    for key in keys:
                        nursery.start_soon(publisher, key, per)
                print("DONE", acked, time.perf_counter() - began, time.process_time() - cpu,
                      flush=True)


# -- orchestration ------------------------------------------------------------------


class Worker:
    def __init__(self, index: int, base: Path, seeds: list[str], store: str,
                 inline_limit: float, encrypt: bool = True) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(index), "--dir", str(base),
             "--seeds", ",".join(seeds), "--store", store, "--inline-limit", str(inline_limit),
             "--gc-threshold", str(GC_THRESHOLD), *([] if encrypt else ["--no-encrypt"])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.address = self.expect("READY")[0]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, word: str) -> list[str]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker exited while waiting for {word}")
            parts = line.split()
            if parts and parts[0] == word:
                return parts[1:]

    def close(self) -> None:
        try:
            self.send("quit")
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def run_publish(workers: list[Worker], prefix: str, counts: list[int], per: int,
                ) -> tuple[float, float]:
    """Acknowledged events/s, and CPU seconds of the publishing workers (their broker
    work included) per acknowledged event."""
    first = 0
    busy = []
    for w, count in zip(workers, counts, strict=True):
        if count:
            w.send(f"publish {prefix} {first} {count} {per}")
            busy.append(w)
        first += count
    for w in busy:
        w.expect("WARM")
    began = time.perf_counter()
    for w in busy:
        w.send("go")
    done = [w.expect("DONE") for w in busy]
    acked = sum(int(d[0]) for d in done)
    rate = acked / (time.perf_counter() - began)
    cpu = sum(float(d[2]) for d in done)
    return rate, cpu / acked


def verify_rate(count: int = 5000) -> float:
    """Best of three: Ed25519 verifies per second of events like the published ones."""
    author = Identity.from_seed(b"\x77" * 32)
    key = criterion_key("verify")
    events = [Event.create(author, criterion=key, seq=1, prev=b"\0" * 32,
                           payload=b"event %d" % n, time=n) for n in range(count)]
    best = 0.0
    for _ in range(3):
        began = time.perf_counter()
        for event in events:
            verify_signature(event.author, event.sig, event.signed_bytes())
        best = max(best, count / (time.perf_counter() - began))
    return best


def start_workers(base: Path, store: str, inline_limit: float,
                  encrypt: bool = True) -> list[Worker]:
    workers = [Worker(0, base, [], store, inline_limit, encrypt)]
    try:
        for index in range(1, WORKERS):
            workers.append(Worker(index, base, [workers[0].address], store, inline_limit,
                                  encrypt))
        for w in workers:
            w.send("members")
            live = int(w.expect("MEMBERS")[0])
            assert live == WORKERS - 1, f"worker sees {live} members"
    except BaseException:
        for w in workers:
            w.close()
        raise
    return workers


def publish_figures(workers: list[Worker], store: str, args: argparse.Namespace,
                    encrypt: bool = True) -> tuple[float, float]:
    kind = "SQLite stores (synchronous=FULL)" if store == "sqlite" else "memory stores"
    sealed = "encrypted" if encrypt else "in clear"
    print(f"{WORKERS} node processes, loopback TCP ({sealed}), r = 3, {kind}, static overlay; "
          f"load average {os.getloadavg()[0]:.1f}")
    seq, _ = run_publish(workers, "seq", [1, 0, 0, 0, 0], args.sequential)
    print(f"  publish, 1 criterion, sequential       {seq:10,.0f} acked events/s")
    share = [args.criteria // WORKERS + (i < args.criteria % WORKERS) for i in range(WORKERS)]
    conc, conc_cpu = run_publish(workers, "conc", share, args.per_criterion)
    print(f"  publish, {args.criteria} criteria concurrently    {conc:10,.0f} acked "
          f"events/s  (target >= 2,000; {conc_cpu * 1e3:.2f} ms CPU of all nodes per event)",
          flush=True)
    return seq, conc


def main() -> None:
    global GC_THRESHOLD
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequential", type=int, default=300)
    parser.add_argument("--criteria", type=int, default=64)
    parser.add_argument("--per-criterion", type=int, default=150)
    parser.add_argument("--store", default="sqlite", choices=["sqlite", "memory"],
                        help="store of the publish runs (memory: to see what the disk costs)")
    parser.add_argument("--compare", action="store_true",
                        help="also run the publish figures with memory stores and print "
                             "the ratios (what the durable store costs, same machine load)")
    parser.add_argument("--inline-limit", type=float, default=0.005,
                        help="the sqlite store option inline_limit (0: every commit in a "
                             "worker thread)")
    parser.add_argument("--compare-encryption", action="store_true",
                        help="also run the publish figures with frame encryption off and "
                             "print the ratios (what encryption costs, same machine load)")
    parser.add_argument("--encryption-rounds", type=int, default=2,
                        help="with --compare-encryption: rounds of four runs (on, off, off, "
                             "on; the next round the other way round)")
    parser.add_argument("--gc-threshold", type=int, default=GC_THRESHOLD,
                        help="the node processes' youngest-generation gc threshold, as "
                             "ketten serve's --gc-threshold (0: Python's own settings)")
    parser.add_argument("--no-encrypt", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--seeds", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    GC_THRESHOLD = args.gc_threshold
    if args.worker is not None:
        trio.run(worker, args.worker, Path(args.dir), [s for s in args.seeds.split(",") if s],
                 args.store, args.inline_limit, not args.no_encrypt)
        return
    with tempfile.TemporaryDirectory(prefix="ketten-bench-") as tmp:
        base = Path(tmp)
        store = "sqlite" if args.store == "sqlite" else "memory"
        workers = start_workers(base, store, args.inline_limit)
        try:
            seq, conc = publish_figures(workers, store, args)
            if args.compare and store == "sqlite":
                baseline = start_workers(base / "memory", "memory", args.inline_limit)
                try:
                    mem_seq, mem_conc = publish_figures(baseline, "memory", args)
                finally:
                    for w in baseline:
                        w.close()
                print(f"  sqlite / memory: sequential {seq / mem_seq:.2f}, "
                      f"concurrently {conc / mem_conc:.2f}")
            if args.compare_encryption:
                # Runs in the order on, off, off, on, then off, on, on, off, ...: what
                # drifts while they go on (the machine's other load, the disk) weighs
                # on both sides alike. The ratio is of the means.
                order = [True, False, False, True, False, True, True, False]
                order = (order * args.encryption_rounds)[:4 * args.encryption_rounds]
                runs: dict[bool, list[tuple[float, float]]] = {True: [(seq, conc)], False: []}
                for n, encrypt in enumerate(order[1:]):
                    cluster = start_workers(base / f"cmp{n}", store, args.inline_limit,
                                            encrypt=encrypt)
                    try:
                        runs[encrypt].append(publish_figures(cluster, store, args,
                                                             encrypt=encrypt))
                    finally:
                        for w in cluster:
                            w.close()
                on, off = ([sum(f[i] for f in runs[e]) / len(runs[e]) for i in (0, 1)]
                           for e in (True, False))
                print(f"  encrypted / in clear ({len(order)} runs, means): sequential "
                      f"{on[0] / off[0]:.2f}, concurrently {on[1] / off[1]:.2f} (target >= 0.9)")
            verify = verify_rate()
            cores = os.cpu_count() or 1
            bound = verify * cores / 3
            print(f"  raw Ed25519 verify, one core          {verify:10,.0f} events/s")
            print(f"  signature bound (verify x {cores} cores / r)  {bound:10,.0f} events/s; "
                  f"concurrent publish is {conc / bound:.2f} of it")
            print(f"load average {os.getloadavg()[0]:.1f}")
        finally:
            for w in workers:
                w.close()


if __name__ == "__main__":
    main()
