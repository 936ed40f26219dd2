"""Run the fault simulation for many seeds and report the failing ones.

    python -m ketten.testing.jepsen --seeds 0-99 [--family all] [--overlay both|all]
                                    [--jobs 2] [--verbose]

Every run is deterministic: a failing seed replays exactly with
``--seeds N --family F --overlay O``. The exit status is 1 if any run failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import NoReturn

import attrs

from .._process import tune_gc
from ._jepsen import CheckResult, FaultRecord, History, Op, Snapshot, check
from ._sim import FAMILIES, SimConfig, SimResult, run_simulation

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
    "tune_collector",
]

OVERLAYS = ("static", "kademlia", "gosskip", "ipfs")
_BOTH = ("static", "kademlia")


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


@attrs.frozen
class Outcome:
    """One run, as reported by a worker process."""

    config: SimConfig
    ok: bool
    line: str
    problems: tuple[str, ...]
    cpu: float


def run_one(config: SimConfig) -> Outcome:
    """Run one simulation and summarise it (in a worker process with ``--jobs``)."""
    started = time.process_time()
    result = run_simulation(config)
    spent = time.process_time() - started
    c = result.check
    line = (f"{config.family:10} {config.overlay:8} seed {config.seed}: "
            f"{'ok' if c.ok else 'FAILED'}  invoked {c.invoked}, acknowledged "
            f"{c.acknowledged}, failed {c.failed}, unknown {c.indeterminate}, reads {c.reads}, "
            f"events {c.events}, faults {len(result.history.faults)}, copies dropped "
            f"{result.copies_dropped}, retired {result.retirements}, converged after "
            f"{result.snapshot.converged_after} s, virtual {result.duration:.0f} s, "
            f"cpu {spent:.1f} s")
    return Outcome(config, c.ok, line, c.problems, spent)


def _configs(seeds: Sequence[int], families: Sequence[str], overlays: Sequence[str],
             **fields: object) -> Iterator[SimConfig]:
    for seed in seeds:
        for family in families:
            for overlay in overlays:
                yield SimConfig(seed=seed, family=family, overlay=overlay, **fields)  # type: ignore[arg-type]


class _Parser(argparse.ArgumentParser):
    """Reports bad usage in one line on stderr (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m ketten.testing.jepsen",
         on_run: Callable[[int, int], None] | None = None) -> int:
    """Run the simulations ``argv`` asks for; 0 if every run passed, 1 if any failed.

    ``prog`` names the command in its help and errors. ``on_run(done, total)``
    is called after each run (a progress display, say).
    """
    defaults = SimConfig()
    parser = _Parser(prog=prog, description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", default="0-9", help="seeds, e.g. 0-99 or 3,7,12-15")
    parser.add_argument("--family", default="all",
                        help=f"fault family: {', '.join(FAMILIES)} or all")
    parser.add_argument("--overlay", default="both",
                        help="static, kademlia, gosskip, ipfs (or several, comma-separated); "
                             "both: static and kademlia; all: every overlay")
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes (default 1; 0: one per core)")
    parser.add_argument("--publishes", type=int, default=defaults.publishes)
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--implicit-commands", action="store_true", dest="implicit_commands",
                        help="odd publishers give no command ids (each call applied at most "
                             "once is checked by payload)")
    parser.add_argument("--verbose", "-v", action="store_true", help="print every problem")
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError:
        parser.error(f"cannot read seeds {args.seeds!r}")
    families = FAMILIES if args.family == "all" else tuple(args.family.split(","))
    overlays = {"both": _BOTH, "all": OVERLAYS}.get(args.overlay) or tuple(
        args.overlay.split(","))
    for family in families:
        if family not in FAMILIES:
            parser.error(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    for overlay in overlays:
        if overlay not in OVERLAYS:
            parser.error(f"unknown overlay {overlay!r}; one of {', '.join(OVERLAYS)}, both or all")
    configs = list(_configs(seeds, families, overlays, publishes=args.publishes,
                            nodes=args.nodes, implicit_commands=args.implicit_commands))
    jobs = args.jobs if args.jobs > 0 else (os.cpu_count() or 1)
    failed: list[SimConfig] = []
    started = time.monotonic()
    done = 0
    if on_run is not None:
        on_run(0, len(configs))

    def report(outcome: Outcome) -> None:
        nonlocal done
        print(outcome.line, flush=True)
        if not outcome.ok:
            failed.append(outcome.config)
            for problem in outcome.problems if args.verbose else outcome.problems[:5]:
                print(f"    {problem}", flush=True)
        done += 1
        if on_run is not None:
            on_run(done, len(configs))

    if jobs == 1 or len(configs) == 1:
        for config in configs:
            report(run_one(config))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for outcome in pool.map(run_one, configs):
                report(outcome)
    elapsed = time.monotonic() - started
    if failed:
        first = failed[0]
        print(f"FAILED {len(failed)} of {len(configs)} runs; replay one: {prog} "
              f"--seeds {first.seed} --family {first.family} "
              f"--overlay {first.overlay} --verbose")
        return 1
    print(f"all {len(configs)} runs passed in {elapsed:.0f} s")
    return 0


def tune_collector() -> None:
    """Give this process the collector settings of a node process
    (:func:`ketten.tune_gc`): the simulated nodes live here. Hypothesis, which
    makes trio's scheduling deterministic, is imported first: importing it
    registers trio's random generator, and the registration looks for the
    generator's referrers, which the collector no longer lists once frozen."""
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        pass  # run_simulation says what is missing
    tune_gc()


if __name__ == "__main__":
    tune_collector()
    sys.exit(main())
