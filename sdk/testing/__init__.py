"""Test helpers for ketten and for plugin authors.

Conformance suites in the style of ``trio.testing.check_two_way_stream``:
call them from your own tests with a factory for your plugin. Simulation
helpers (:func:`open_cluster`, :func:`seed_scheduler`) and pytest fixtures
(``pytest_plugins = ["ketten.testing.fixtures"]``) run many nodes on one
seeded in-process network in virtual time.
"""

from __future__ import annotations

from ._check_clock import check_clock
from ._check_overlay import OverlayFactory, check_overlay
from ._check_store import check_store
from ._cluster import Cluster, deterministic_identity, open_cluster, seed_scheduler
from ._jepsen import CheckResult, FaultRecord, ForkRecord, History, Op, Snapshot, check
from ._sim import SimConfig, SimResult, run_simulation

__all__ = [
    "CheckResult",
    "Cluster",
    "FaultRecord",
    "ForkRecord",
    "History",
    "Op",
    "OverlayFactory",
    "SimConfig",
    "SimResult",
    "Snapshot",
    "check",
    "check_clock",
    "check_overlay",
    "check_store",
    "deterministic_identity",
    "open_cluster",
    "run_simulation",
    "seed_scheduler",
]
