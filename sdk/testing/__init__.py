"""Test helpers for ketten and for plugin authors.

Conformance suites in the style of ``trio.testing.check_two_way_stream``:
call them from your own tests with a factory for your plugin
(:func:`check_store`, :func:`check_clock`, :func:`check_overlay`,
:func:`check_transport`, :func:`check_delivery`).
Clusters of nodes in one process on the simulated network or on loopback
TCP (:func:`open_cluster`), deterministic runs (:func:`deterministic`), the
fault simulation with its Jepsen-style checker (:func:`run_simulation`) and
pytest fixtures (``pytest_plugins = ["ketten.testing.fixtures"]``).
"""

from __future__ import annotations

from ._check_clock import check_clock
from ._check_delivery import DeliveryFactory, check_delivery
from ._check_overlay import OverlayFactory, check_overlay
from ._check_store import check_store
from ._check_transport import TransportFactory, check_transport
from ._cluster import Cluster, deterministic, deterministic_identity, open_cluster
from ._jepsen import (
    CheckResult,
    FaultRecord,
    ForkRecord,
    History,
    Op,
    Read,
    Snapshot,
    check,
    final_config,
)
from ._sim import FAMILIES, SimConfig, SimResult, run_simulation

__all__ = [
    "FAMILIES",
    "CheckResult",
    "Cluster",
    "DeliveryFactory",
    "FaultRecord",
    "ForkRecord",
    "History",
    "Op",
    "OverlayFactory",
    "Read",
    "SimConfig",
    "SimResult",
    "Snapshot",
    "TransportFactory",
    "check",
    "check_clock",
    "check_delivery",
    "check_overlay",
    "check_store",
    "check_transport",
    "deterministic",
    "deterministic_identity",
    "final_config",
    "open_cluster",
    "run_simulation",
]
