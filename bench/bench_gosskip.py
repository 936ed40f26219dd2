"""GosSkip figures: gossip rounds to converge and memory per node.

Run: ``python bench/bench_gosskip.py [--sizes 1000,10000] [--seed 1]``.

Each size builds a ring of ``n`` nodes on the sans-IO
:class:`~ketten.plugins.gosskip._ring.Ring` in the deterministic ring
simulation (every node knows only its level-0 successors, as a join leaves
it) and runs gossip rounds until the share of (node, side, level) links that
point at the exact ``2**level``-th neighbour reaches 95 % (and 99 %, and
all). Per round it prints that share, the messages sent and the seconds the
round took in this process.

Memory per node is a ``sys.getsizeof`` walk over one node's ring state
(neighbour lists, links, gossip buffers and the contacts in them), counting
each object once per node, as if each node held its own copies (in the
simulation nodes share contact objects, so tracemalloc would undercount);
the mean and the largest over a sample of nodes, after convergence.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

from ketten.plugins.gosskip._ring import Ring
from ketten.plugins.gosskip._sim import RingSimulation


def deep_size(root: Any) -> int:
    """Bytes of ``root`` and everything it refers to, each object counted once."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (bool, type)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__slots__"):
            stack.extend(getattr(obj, slot) for slot in _slots(type(obj)) if hasattr(obj, slot))
        elif hasattr(obj, "__dict__"):
            stack.append(vars(obj))
    return total


def _slots(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = getattr(klass, "__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    return [n for n in names if n not in ("__weakref__", "__dict__")]


def converge(n: int, seed: int, limit: int) -> None:
    print(f"\n== {n} nodes (seed {seed}) ==", flush=True)
    started = time.perf_counter()
    sim = RingSimulation(seed=seed)
    sim.build(n)
    print(f"built in {time.perf_counter() - started:.1f} s; "
          f"links right at round 0: {sim.link_accuracy():.1%}", flush=True)
    marks: dict[str, int | None] = {"95 %": None, "99 %": None, "100 %": None}
    rounds_total = 0.0
    messages = sim.messages
    for round_no in range(1, limit + 1):
        tick = time.perf_counter()
        sim.round()
        elapsed = time.perf_counter() - tick
        rounds_total += elapsed
        accuracy = sim.link_accuracy()
        sent = sim.messages - messages
        messages = sim.messages
        print(f"round {round_no:3}: links right {accuracy:7.2%}  messages {sent:8}"
              f" ({sent / n:.1f} per node)  {elapsed:6.2f} s", flush=True)
        for label, threshold in (("95 %", 0.95), ("99 %", 0.99), ("100 %", 1.0)):
            if marks[label] is None and accuracy >= threshold:
                marks[label] = round_no
        if marks["100 %"] is not None:
            break
    for label, value in marks.items():
        print(f"rounds to {label:>5} of the links right: "
              f"{value if value is not None else f'not within {limit}'}")
    heights = [sim.rings[key].height for key in sim.alive]
    print(f"levels per node: mean {statistics.mean(heights):.1f}, max {max(heights)} "
          f"(log2 n = {n.bit_length() - 1})")
    rng = random.Random(seed)
    sample = rng.sample(sorted(sim.alive), min(n, 300))
    sizes = [deep_size(sim.rings[key]) for key in sample]
    print(f"memory per node (getsizeof walk over {len(sample)} nodes): "
          f"mean {statistics.mean(sizes) / 1024:.1f} KiB, max {max(sizes) / 1024:.1f} KiB")
    example: Ring = sim.rings[sample[0]]
    stats = example.statistics()
    print(f"one node: {stats.contacts} contacts, {stats.successors} successors, "
          f"{stats.predecessors} predecessors")
    print(f"gossip time: {rounds_total:.1f} s for all rounds "
          f"({rounds_total / max(1, round_no) / n * 1e6:.0f} µs per node and round)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000",
                        help="comma-separated ring sizes (default 1000,10000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--limit", type=int, default=40, help="most gossip rounds per size")
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        converge(size, args.seed, args.limit)


if __name__ == "__main__":
    main()
