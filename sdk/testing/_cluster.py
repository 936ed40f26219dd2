"""Clusters for tests: many nodes in one process, on the simulated network or TCP.

:func:`open_cluster` starts ``count`` nodes and yields a :class:`Cluster`
whose nodes can be stopped, restarted (their stores survive) and, on the
simulated network, cut off and healed; it can wait for a chain to settle on
its replica set or to move to the nodes the overlay names.
:func:`deterministic` runs a function so that trio's scheduling replays
exactly, run after run and in any process.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import pluggy
import trio

from .. import Node, NodeConfig, open_node, plugin_manager
from .._core.event import Event
from .._core.identity import Identity

__all__ = ["Cluster", "deterministic", "deterministic_identity", "open_cluster"]

T = TypeVar("T")


def deterministic_identity(seed: int, index: int) -> Identity:
    """The identity of node ``index`` in the simulation with ``seed``: replays exactly."""
    return Identity.from_seed(hashlib.sha256(b"ketten-sim:%d:%d" % (seed, index)).digest())


def deterministic(fn: Callable[[], T]) -> T:
    """Call ``fn()`` with trio's scheduling made deterministic; return its result.

    trio orders tasks that wake at the same instant at random, so that a
    program cannot come to depend on one order. Trio's documented
    Hypothesis integration makes that order deterministic while Hypothesis
    runs a test body, with every registered random generator seeded; this
    runs ``fn`` as the body of a one-example Hypothesis test. Together with
    a seeded :class:`~ketten.adapters.memory.MemoryNetwork`, seeded
    identities and virtual time, a simulation replays exactly::

        deterministic(lambda: trio.run(main, clock=trio.testing.MockClock(
            autojump_threshold=0)))

    Needs ``hypothesis`` (part of ketten's ``dev`` extra).
    """
    from hypothesis import HealthCheck, Phase, example, given, settings
    from hypothesis import strategies as st

    result: list[T] = []

    @settings(database=None, phases=[Phase.explicit], deadline=None, max_examples=1,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @example(0)
    @given(st.integers())
    def body(_: int) -> None:
        result.append(fn())

    body()
    return result[0]


@attrs.define(eq=False)
class Cluster:
    """Nodes of one test network that can be started and stopped one by one.

    ``transport`` is ``"memory"`` (``network`` is the shared
    :class:`~ketten.adapters.memory.MemoryNetwork`) or ``"tcp"`` (loopback);
    ``store`` is ``"memory"`` (data kept in a backing per node across
    restarts) or ``"sqlite"`` / ``"file"`` (one directory per node under
    ``path``). ``options`` are merged into every node's options.
    """

    nursery: trio.Nursery
    plugins: pluggy.PluginManager
    network: Any = None
    seed: int = 0
    transport: str = "memory"
    overlay: str = "static"
    store: str = "memory"
    path: str | None = None
    replication: int = 3
    request_timeout: float = 1.0
    anti_entropy: float = 1.0
    evict_after: float = 30.0
    hysteresis: float = 30.0
    options: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    nodes: dict[int, Node] = attrs.field(factory=dict)
    backings: dict[int, Any] = attrs.field(factory=dict)
    scopes: dict[int, trio.CancelScope] = attrs.field(factory=dict)
    identities: dict[int, Identity] = attrs.field(factory=dict)
    addresses: dict[int, str] = attrs.field(factory=dict)
    make: Callable[[int, Identity], NodeConfig] | None = None
    """Builds node ``index``'s whole configuration instead of the fields above."""

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, index: int) -> Node:
        return self.nodes[index]

    def identity(self, index: int) -> Identity:
        if index not in self.identities:
            self.identities[index] = deterministic_identity(self.seed, index)
        return self.identities[index]

    def seeds(self) -> list[str]:
        first = sorted(self.addresses)[:1]
        return [self.addresses[i] for i in first]

    def config(self, index: int, **changes: Any) -> NodeConfig:
        """The configuration node ``index`` starts with (``changes`` to its fields)."""
        if self.make is not None:
            return attrs.evolve(self.make(index, self.identity(index)), **changes)
        options: dict[str, dict[str, Any]] = {
            "replication": {"anti_entropy": self.anti_entropy, "hysteresis": self.hysteresis},
        }
        if self.transport == "memory":
            options["transport"] = {"network": self.network, "address": f"n:{index}"}
            options["replication"]["time"] = lambda: int(trio.current_time() * 1000)
        else:
            options["transport"] = {"listen": "127.0.0.1:0"}
        if self.store == "memory":
            from ketten.plugins.memory_store import MemoryBacking

            options["store"] = {"backing": self.backings.setdefault(index, MemoryBacking())}
        else:
            assert self.path is not None, "a cluster with a disk store needs a path"
            options["store"] = {"path": os.path.join(self.path, f"node{index}")}
        seeds = [a for i, a in sorted(self.addresses.items()) if i != index][:2]
        if self.transport == "memory" and not seeds:
            seeds = ["n:0"] if index != 0 else []
        if self.overlay in ("kademlia", "ipfs"):
            options["overlay"] = {"bootstrap": seeds}
        elif self.overlay == "static":
            options["overlay"] = {"seeds": seeds, "interval": 0.5,
                                  "evict_after": self.evict_after}
        for kind, extra in self.options.items():
            options[kind] = {**options.get(kind, {}), **extra}
        base = NodeConfig(identity=self.identity(index), transport=self.transport,
                          store=self.store, overlay=self.overlay,
                          replication=self.replication, request_timeout=self.request_timeout,
                          options=options)
        return attrs.evolve(base, **changes)

    async def start(self, index: int, **changes: Any) -> Node:
        """Start node ``index`` (its store is kept from an earlier run)."""
        config = self.config(index, **changes)

        async def run(task_status: trio.TaskStatus[Node]) -> None:
            with trio.CancelScope() as scope:
                self.scopes[index] = scope
                try:
                    async with open_node(config, plugins=self.plugins) as node:
                        self.nodes[index] = node
                        self.addresses[index] = node.address
                        task_status.started(node)
                        await trio.sleep_forever()
                finally:
                    self.nodes.pop(index, None)

        node: Node = await self.nursery.start(run)
        return node

    async def stop(self, index: int) -> None:
        """Stop node ``index`` (as a crash: nothing is said to the others)."""
        self.scopes.pop(index).cancel()
        while index in self.nodes:
            await trio.sleep(0.01)

    def brokers(self, key: bytes) -> list[int]:
        """Indices of the running nodes closest to ``key`` (where its chain belongs)."""
        target = int.from_bytes(key, "big")
        ranked = sorted(self.nodes, key=lambda i: int.from_bytes(
            self.identity(i).node_id, "big") ^ target)
        return ranked[: self.replication]

    def others(self, key: bytes) -> list[int]:
        chosen = self.brokers(key)
        return [i for i in sorted(self.nodes) if i not in chosen]

    async def chain(self, index: int, key: bytes) -> list[Event]:
        return await self.nodes[index].store.range(key)

    async def settle(self, key: bytes, seconds: float = 10.0) -> list[Event]:
        """Wait until the running brokers of ``key`` hold one chain; return it."""
        with trio.fail_after(seconds):
            while True:
                chains = [await self.chain(i, key) for i in self.brokers(key)]
                if all(c == chains[0] for c in chains):
                    return chains[0]
                await trio.sleep(0.1)

    async def moved(self, key: bytes, seconds: float = 60.0) -> None:
        """Wait until the running nodes closest to ``key`` hold a configuration that
        names exactly them."""
        with trio.fail_after(seconds):
            while True:
                wanted = {self.identity(i).public_key for i in self.brokers(key)}
                configs = [await self.nodes[i].configuration(key) for i in self.brokers(key)]
                if all(cf is not None and not cf.joint and cf.voter_keys() == wanted
                       for cf in configs):
                    return
                await trio.sleep(0.5)

    def cut(self, *indices: int) -> None:
        """Cut nodes ``indices`` off from the others (simulated network only)."""
        self.network.cut([f"n:{i}" for i in indices])

    def heal(self) -> None:
        self.network.heal()


@asynccontextmanager
async def open_cluster(
    count: int,
    *,
    seed: int = 0,
    network: Any = None,
    config: Callable[[int, Identity], NodeConfig] | None = None,
    plugins: pluggy.PluginManager | None = None,
    settle: float = 2.0,
    **options: Any,
) -> AsyncIterator[Cluster]:
    """Start ``count`` nodes and yield them as a :class:`Cluster`; stop them all on exit.

    On the simulated network (the default ``transport="memory"``) ``network``
    defaults to a fault-free ``MemoryNetwork(seed=seed)``; run it in virtual
    time (``trio.testing.MockClock(autojump_threshold=0)``). Keyword
    ``options`` set :class:`Cluster` fields (``transport``, ``overlay``,
    ``store``, ``path``, ``replication``, ``request_timeout``, ``hysteresis``,
    ...). ``config(index, identity)``, if given, builds each node's whole
    configuration instead. Identities follow ``seed``. Waits ``settle``
    seconds for the membership to spread before yielding.
    """
    from ketten.adapters.memory import MemoryNetwork

    pm = plugins if plugins is not None else plugin_manager()
    if options.get("transport", "memory") == "memory" and network is None:
        network = MemoryNetwork(seed=seed)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, pm, network, seed, make=config, **options)
        for index in range(count):
            await cluster.start(index)
        await trio.sleep(settle)
        try:
            yield cluster
        finally:
            nursery.cancel_scope.cancel()
