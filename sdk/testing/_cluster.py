"""Simulated clusters: many nodes on one seeded in-process network."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import attrs
import pluggy
import trio

from .. import Node, NodeConfig, open_node, plugin_manager
from .._core.identity import Identity

__all__ = ["Cluster", "deterministic_identity", "open_cluster", "seed_scheduler"]


def deterministic_identity(seed: int, index: int) -> Identity:
    """The identity of node ``index`` in the simulation with ``seed``: replays exactly."""
    return Identity.from_seed(hashlib.sha256(b"ketten-sim:%d:%d" % (seed, index)).digest())


@contextmanager
def seed_scheduler(seed: int) -> Iterator[None]:
    """Make trio's choices among tasks that wake at the same instant follow ``seed``.

    Inside the block trio orders each batch of runnable tasks by creation and
    shuffles it with a generator seeded by ``seed`` (what it does under
    Hypothesis); otherwise the order follows task addresses and a seed would
    replay only in a fresh process. Together with a seeded
    :class:`~ketten.adapters.memory.MemoryNetwork`, seeded identities and
    virtual time, a simulation run inside the block replays exactly::

        with seed_scheduler(seed):
            trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    """
    from trio._core import _run  # trio keeps its scheduling randomness here

    before = bool(getattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING", False))
    state = _run._r.getstate()
    setattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING", True)  # noqa: B010 - a Final constant
    _run._r.seed(seed)
    try:
        yield
    finally:
        setattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING", before)  # noqa: B010
        _run._r.setstate(state)


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
