"""Reconfiguration benchmark: a node joins a network that holds many chains.

Five node processes on loopback TCP (``r = 3``, SQLite stores, the static
overlay, hysteresis 2 s) hold ``--chains`` chains of ``--events`` events
each. A sixth node joins; every chain whose three nearest nodes now include
it moves: the newcomer copies it as a learner, then the joint and the new
configuration commit. Figures, measured in the same run:

* chains moved per second and bytes sent by all nodes per moved chain;
* the raw catch-up rate: the newcomer copying one chain of ``--long``
  events as a learner, in events/s, beside the raw Ed25519 verify rate of
  the same events (every copied event is verified before it is stored);
* retirement: how long until every broker a move left out was told to
  retire, and how many events the five old nodes still hold as reader
  copies afterwards (the default ``copies_events`` keeps them all; the
  figure is what the bound then governs).

    python bench/bench_reconfig.py [--chains 1000] [--events 20] [--long 20000]
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

from ketten import Event, Identity, NodeConfig, criterion_key, open_node, verify_signature

WORKERS = 5


def identity(index: int) -> Identity:
    return Identity.from_seed(bytes([index + 1]) * 32)


def config(index: int, base: Path, seeds: list[str]) -> NodeConfig:
    return NodeConfig(
        identity=identity(index), transport="tcp", store="sqlite", overlay="static",
        request_timeout=10.0,
        options={"store": {"path": str(base / f"node{index}"), "check_on_open": False},
                 "overlay": {"seeds": seeds, "interval": 0.5},
                 "replication": {"hysteresis": 2.0, "anti_entropy": 1.0}},
    )


def keys(count: int) -> list[bytes]:
    return [criterion_key(f"chain {n}") for n in range(count)]


def long_key() -> bytes:
    return identity(WORKERS).node_id  # the newcomer is the closest node to it


def moving(chains: list[bytes]) -> list[bytes]:
    """The chains whose three nearest nodes include the newcomer."""
    ids = [int.from_bytes(identity(i).node_id, "big") for i in range(WORKERS + 1)]
    out = []
    for key in chains:
        target = int.from_bytes(key, "big")
        ranked = sorted(range(WORKERS + 1), key=lambda i: ids[i] ^ target)
        if WORKERS in ranked[:3]:
            out.append(key)
    return out


# -- worker process -----------------------------------------------------------------


async def worker(index: int, base: Path, seeds: list[str]) -> None:
    async with open_node(config(index, base, seeds)) as node:
        print("READY", node.address, flush=True)
        stdin = trio.wrap_file(sys.stdin)
        while True:
            line = (await stdin.readline()).split()
            if not line or line[0] == "quit":
                return
            if line[0] == "fill":
                count, events, long = int(line[1]), int(line[2]), int(line[3])
                chains = keys(count)
                sem = trio.Semaphore(64)

                async def fill(key: bytes, n: int, sem: trio.Semaphore = sem) -> None:
                    async with sem:
                        for k in range(n):
                            await node.publish(key, b"event %d" % k, deadline=60.0)

                async with trio.open_nursery() as nursery:
                    for key in chains:
                        nursery.start_soon(fill, key, events)
                    nursery.start_soon(fill, long_key(), long)
                print("FILLED", flush=True)
            elif line[0] == "bytes":
                stats = node.statistics().transport
                print("BYTES", stats.bytes_sent, flush=True)
            elif line[0] == "retired":
                copies = node.copy_statistics()
                print("RETIRED", node.replication_statistics().retirements, copies.copies,
                      copies.copy_events, flush=True)
            elif line[0] == "held":
                wanted = [bytes.fromhex(h) for h in line[1:]]
                own = node.identity.public_key
                held = 0
                for key in wanted:
                    replica = node._replicator.loaded(key)
                    if (replica is not None and replica.config is not None
                            and not replica.config.joint and own in replica.config.voter_keys()
                            and replica.head is not None and replica.commit is not None
                            and replica.head[0] == replica.commit[0]):
                        held += 1
                print("HELD", held, flush=True)


class Worker:
    def __init__(self, index: int, base: Path, seeds: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(index), "--dir", str(base),
             "--seeds", ",".join(seeds)],
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

    def ask(self, line: str, word: str) -> list[str]:
        self.send(line)
        return self.expect(word)

    def close(self) -> None:
        try:
            self.send("quit")
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def verify_rate(count: int = 5000) -> float:
    author = Identity.from_seed(b"\x77" * 32)
    events = [Event.create(author, criterion=long_key(), seq=1, prev=b"\0" * 32,
                           payload=b"event %d" % n, time=n) for n in range(count)]
    best = 0.0
    for _ in range(3):
        began = time.perf_counter()
        for event in events:
            verify_signature(event.author, event.sig, event.signed_bytes())
        best = max(best, count / (time.perf_counter() - began))
    return best


def wait_held(joiner: Worker, wanted: list[bytes], timeout: float, began: float) -> float:
    """Seconds from ``began`` until the newcomer holds every chain of ``wanted`` as a
    voter."""
    hexes = " ".join(k.hex() for k in wanted)
    while time.perf_counter() - began < timeout:
        if int(joiner.ask(f"held {hexes}", "HELD")[0]) == len(wanted):
            return time.perf_counter() - began
        time.sleep(0.2)
    raise RuntimeError(f"the newcomer did not get all {len(wanted)} chains in {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--chains", type=int, default=1000)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--long", type=int, default=20000)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--seeds", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        trio.run(worker, args.worker, Path(args.dir), [s for s in args.seeds.split(",") if s])
        return
    with tempfile.TemporaryDirectory(prefix="ketten-bench-") as tmp:
        base = Path(tmp)
        workers = [Worker(0, base, [])]
        try:
            for index in range(1, WORKERS):
                workers.append(Worker(index, base, [workers[0].address]))
            time.sleep(3.0)
            print(f"{WORKERS} node processes, loopback TCP, r = 3, SQLite; filling "
                  f"{args.chains:,} chains of {args.events} events and one of {args.long:,} "
                  "...", flush=True)
            began = time.perf_counter()
            workers[0].send(f"fill {args.chains} {args.events} {args.long}")
            workers[0].expect("FILLED")
            print(f"  filled in {time.perf_counter() - began:.0f} s; load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
            time.sleep(3.0)
            sent_before = sum(int(w.ask("bytes", "BYTES")[0]) for w in workers)
            # A chain started before every node knew the others moves during the fill.
            retired_before = sum(int(w.ask("retired", "RETIRED")[0]) for w in workers)
            joiner = Worker(WORKERS, base, [workers[0].address])
            joined = time.perf_counter()
            workers.append(joiner)
            wanted = moving(keys(args.chains))
            # Both from the join: the short chains move while the long one is copied.
            long_time = wait_held(joiner, [long_key()], 600.0, joined)
            moved_time = wait_held(joiner, wanted, 900.0, joined)
            sent = sum(int(w.ask("bytes", "BYTES")[0]) for w in workers) - sent_before
            retire_began = time.perf_counter()
            while True:
                told = [w.ask("retired", "RETIRED") for w in workers[:WORKERS]]
                retired = sum(int(t[0]) for t in told) - retired_before
                if retired >= len(wanted) + 1 or time.perf_counter() - retire_began > 120:
                    break
                time.sleep(0.2)
            retire_time = time.perf_counter() - retire_began
            verify = verify_rate()
            copied = args.long / max(long_time - 2.0, 1e-9)  # minus the hysteresis period
            print(f"  chains that moved to the newcomer     {len(wanted):10,}")
            print(f"  all moved                             {moved_time:10.1f} s  after the "
                  f"join ({len(wanted) / moved_time:,.0f} chains/s, hysteresis included)")
            print(f"  bytes sent by all nodes                {sent:10,}  "
                  f"({sent / max(len(wanted), 1):,.0f} per moved chain)")
            print(f"  retirements of old brokers            {retired:10,} for {len(wanted) + 1:,} "
                  f"moved chains, {retire_time:.1f} s after the newcomer held them all")
            print(f"  events they keep as reader copies     "
                  f"{sum(int(t[2]) for t in told):10,} in {sum(int(t[1]) for t in told):,} copies")
            print(f"  catch-up of one {args.long:,}-event chain  {copied:10,.0f} events/s")
            print(f"  raw Ed25519 verify (baseline)         {verify:10,.0f} events/s  "
                  f"catch-up ratio {copied / verify:.2f}")
            print(f"load average {os.getloadavg()[0]:.1f}")
        finally:
            for w in workers:
                w.close()


if __name__ == "__main__":
    main()
