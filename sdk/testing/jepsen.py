"""Run the fault simulation for many seeds and report the failing ones.

    python -m ketten.testing.jepsen --seeds 0-99 [--publishes 2000] [--verbose]

Every run is deterministic: a failing seed replays exactly with
``--seeds N``. The exit status is 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from .. import plugin_manager
from ._jepsen import CheckResult, FaultRecord, History, Op, Snapshot, check
from ._sim import SimConfig, SimResult, run_simulation

__all__ = [
    "CheckResult",
    "FaultRecord",
    "History",
    "Op",
    "SimConfig",
    "SimResult",
    "Snapshot",
    "check",
    "main",
    "parse_seeds",
    "run_simulation",
]


def parse_seeds(text: str) -> list[int]:
    """``"0-9,20,30-31"`` -> ``[0, ..., 9, 20, 30, 31]``."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            seeds.extend(range(int(low), int(high) + 1))
        else:
            seeds.append(int(part))
    return seeds


def main(argv: Sequence[str] | None = None) -> int:
    defaults = SimConfig()
    parser = argparse.ArgumentParser(prog="python -m ketten.testing.jepsen",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-9", help="seeds, e.g. 0-99 or 3,7,12-15")
    parser.add_argument("--publishes", type=int, default=defaults.publishes)
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--publishers", type=int, default=defaults.publishers)
    parser.add_argument("--criteria", type=int, default=defaults.criteria)
    parser.add_argument("--loss", type=float, default=defaults.loss)
    parser.add_argument("--verbose", "-v", action="store_true", help="print every problem")
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError:
        parser.error(f"cannot read seeds {args.seeds!r}")
    plugins = plugin_manager()
    failed: list[int] = []
    for seed in seeds:
        config = SimConfig(seed=seed, publishes=args.publishes, nodes=args.nodes,
                           publishers=args.publishers, criteria=args.criteria, loss=args.loss)
        started = time.process_time()
        result = run_simulation(config, plugins=plugins)
        spent = time.process_time() - started
        c = result.check
        status = "ok" if c.ok else "FAILED"
        print(f"seed {seed}: {status}  invoked {c.invoked}, acknowledged {c.acknowledged}, "
              f"failed {c.failed}, indeterminate {c.indeterminate}, events {c.events}, "
              f"faults {len(result.history.faults)}, converged after "
              f"{result.snapshot.converged_after} s, virtual {result.duration:.0f} s, "
              f"cpu {spent:.1f} s", flush=True)
        if not c.ok:
            failed.append(seed)
            for problem in c.problems if args.verbose else c.problems[:5]:
                print(f"    {problem}")
    if failed:
        listed = ",".join(str(s) for s in failed)
        print(f"FAILED seeds: {listed}  (replay one: python -m ketten.testing.jepsen "
              f"--seeds {failed[0]} --verbose)")
        return 1
    print(f"all {len(seeds)} seeds passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
