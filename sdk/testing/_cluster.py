"""Simulated clusters: many nodes on one seeded in-process network."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pluggy
import trio

from .._config import NodeConfig
from .._identity import Identity
from .._node import Node, open_node
from .._plugins import plugin_manager

__all__ = ["Cluster", "deterministic_identity", "open_cluster", "seed_scheduler"]


def deterministic_identity(seed: int, index: int) -> Identity:
    """The identity of node ``index`` in the simulation with ``seed``: replays exactly."""
    return Identity.from_seed(hashlib.sha256(b"ketten-sim:%d:%d" % (seed, index)).digest())


def seed_scheduler(seed: int) -> None:
    """Make trio's choice among tasks that wake at the same instant follow ``seed``.

    Together with a seeded :class:`~ketten.adapters.memory.MemoryNetwork`,
    seeded identities and virtual time, this makes a simulation replay
    exactly. Call it before ``trio.run``.
    """
    from trio._core import _run  # trio keeps its scheduling randomness here

    _run._r.seed(seed)


@attrs.define(eq=False)
class Cluster:
    """The nodes of :func:`open_cluster`, in start order."""

    network: Any
    nodes: list[Node]
    _nursery: trio.Nursery
    _scopes: list[trio.CancelScope] = attrs.field(factory=list)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, index: int) -> Node:
        return self.nodes[index]

    def addresses(self) -> list[str]:
        return [node.address for node in self.nodes]


@asynccontextmanager
async def open_cluster(
    count: int,
    *,
    seed: int = 0,
    network: Any = None,
    config: Callable[[int, Identity], NodeConfig] | None = None,
    plugins: pluggy.PluginManager | None = None,
) -> AsyncIterator[Cluster]:
    """Open ``count`` nodes on one simulated network; close them all on exit.

    ``network`` defaults to a fault-free ``MemoryNetwork(seed=seed)``.
    ``config(index, identity)`` builds each node's configuration (it must
    keep ``options["transport"]["network"]``); by default every node uses the
    memory transport and store. Identities are derived from ``seed``.
    """
    from ketten.adapters.memory import MemoryNetwork

    net = network if network is not None else MemoryNetwork(seed=seed)
    pm = plugins if plugins is not None else plugin_manager()

    def default(index: int, identity: Identity) -> NodeConfig:
        return NodeConfig(identity=identity, options={"transport": {"network": net}})

    make = config or default

    async with trio.open_nursery() as nursery:

        async def run(index: int, task_status: trio.TaskStatus[Node]) -> None:
            async with open_node(make(index, deterministic_identity(seed, index)), plugins=pm) as node:
                task_status.started(node)
                await trio.sleep_forever()

        nodes = [await nursery.start(run, i) for i in range(count)]
        try:
            yield Cluster(net, nodes, nursery)
        finally:
            nursery.cancel_scope.cancel()
