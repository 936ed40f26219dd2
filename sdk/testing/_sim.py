"""A deterministic fault simulation of publishing, checked by :mod:`._jepsen`.

``N`` nodes on one seeded :class:`~ketten.adapters.memory.MemoryNetwork`
(loss, duplication, reordering throughout) in virtual time, the ``static``
overlay, memory stores whose data survives restarts. Some nodes run a
publisher each (an :class:`ketten.Agent` that retries a command it could not
get acknowledged, as an application with an outbox would). Every few
virtual seconds one node crashes and restarts, or a group is cut off and
healed. When the workload is done everything heals and the simulation waits
for the replica sets to agree. The history and the final chains go to
:func:`~ketten.testing._jepsen.check`.

A fault lasts a few seconds, less than the overlay's ``evict_after``, so the
replica sets never move: the simulation tests majority replication, sync and
fork resolution under loss, crashes and partitions; brokers joining and
leaving are covered by the scenario tests.

Everything follows the seed: network, identities, workload, faults and
trio's scheduler (made deterministic, as under Hypothesis), so a failing seed
replays exactly, in any process.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping

import attrs
import pluggy
import trio
import trio.testing

from .. import Agent, Node, NodeConfig, open_node, plugin_manager
from .._core.event import Event
from .._core.identity import Identity
from ..errors import KettenError
from ..hookspecs import hookimpl
from ._cluster import deterministic_identity, seed_scheduler
from ._jepsen import CheckResult, FaultRecord, ForkRecord, History, Op, Snapshot, check

__all__ = ["SimConfig", "SimResult", "run_simulation"]


@attrs.frozen
class SimConfig:
    """Parameters of one simulation run (times are virtual seconds)."""

    seed: int = 0
    nodes: int = 7
    replication: int = 3
    publishers: int = 5
    criteria: int = 4
    publishes: int = 2000
    loss: float = 0.10
    duplicate: float = 0.05
    reorder: float = 0.10
    latency: float = 0.005
    jitter: float = 0.005
    fault_gap: tuple[float, float] = (1.0, 3.0)
    fault_length: tuple[float, float] = (0.5, 3.0)
    settle: float = 60.0
    request_timeout: float = 0.5
    anti_entropy: float = 2.0
    overlay_interval: float = 5.0
    evict_after: float = 60.0
    attempts: int = 3
    deadline: float = 5.0


@attrs.frozen
class SimResult:
    """What a run produced and what the checker found."""

    config: SimConfig
    history: History
    snapshot: Snapshot
    brokers: Mapping[bytes, tuple[int, ...]]
    check: CheckResult
    duration: float
    network: object

    @property
    def ok(self) -> bool:
        return self.check.ok


def _criterion(seed: int, index: int) -> bytes:
    return hashlib.sha256(b"ketten-sim-criterion:%d:%d" % (seed, index)).digest()


def _replica_set(key: bytes, ids: list[bytes], r: int) -> tuple[int, ...]:
    target = int.from_bytes(key, "big")
    ranked = sorted(range(len(ids)), key=lambda i: int.from_bytes(ids[i], "big") ^ target)
    return tuple(sorted(ranked[:r]))


@attrs.define(eq=False)
class _Outbox:
    criterion: bytes
    command: int
    payload: bytes
    tries: int = 0


@attrs.define(eq=False)
class _Simulation:
    config: SimConfig
    plugins: pluggy.PluginManager
    history: History = attrs.field(factory=History)
    _identities: list[Identity] = attrs.field(factory=list)
    _backings: list[object] = attrs.field(factory=list)
    _scopes: dict[int, trio.CancelScope] = attrs.field(factory=dict)
    _live: dict[int, Node] = attrs.field(factory=dict)
    _outbox: dict[int, _Outbox | None] = attrs.field(factory=dict)
    _rngs: dict[int, random.Random] = attrs.field(factory=dict)
    _invoked: int = 0
    _inflight: int = 0
    _network: object = None
    _nursery: trio.Nursery | None = None
    _go: trio.Event = attrs.field(factory=trio.Event)

    def address(self, index: int) -> str:
        return f"sim:{index}"

    def node_config(self, index: int) -> NodeConfig:
        cfg = self.config
        return NodeConfig(
            identity=self._identities[index],
            overlay="static",
            replication=cfg.replication,
            request_timeout=cfg.request_timeout,
            options={
                "transport": {"network": self._network, "address": self.address(index)},
                "store": {"backing": self._backings[index]},
                "overlay": {
                    "seeds": [self.address(0), self.address(1)],
                    "interval": self.config.overlay_interval,
                    "evict_after": cfg.evict_after,
                },
                "replication": {
                    "anti_entropy": cfg.anti_entropy,
                    "time": lambda: int(trio.current_time() * 1000),
                },
            },
        )

    async def _node(self, index: int, *, task_status: trio.TaskStatus[None]) -> None:
        with trio.CancelScope() as scope:
            self._scopes[index] = scope
            try:
                async with open_node(self.node_config(index), plugins=self.plugins) as node:
                    self._live[index] = node
                    task_status.started()
                    if index < self.config.publishers:
                        await self._go.wait()
                        await self._publisher(index, node)
                    await trio.sleep_forever()
            finally:
                self._live.pop(index, None)
                self._scopes.pop(index, None)

    async def start(self, index: int) -> None:
        assert self._nursery is not None
        await self._nursery.start(self._node, index)

    def crash(self, index: int) -> None:
        scope = self._scopes.get(index)
        if scope is not None:
            scope.cancel()

    async def _publisher(self, process: int, node: Node) -> None:
        cfg = self.config
        rng = self._rngs.setdefault(process, random.Random(cfg.seed * 7919 + process))
        agent = await Agent.open(node)
        key_count = cfg.criteria
        while self._invoked < cfg.publishes:
            pending = self._outbox.get(process)
            if pending is None or pending.tries >= cfg.attempts:
                command = await agent.next_command()
                criterion = _criterion(cfg.seed, rng.randrange(key_count))
                pending = _Outbox(criterion, command, b"p%d:c%d" % (process, command))
                self._outbox[process] = pending
            pending.tries += 1
            self._invoked += 1
            invoke = Op(process, "invoke", trio.current_time(), pending.criterion,
                        pending.command, pending.payload)
            self.history.add(invoke)
            self._inflight += 1
            try:
                event = await agent.publish(pending.criterion, pending.payload,
                                            command=pending.command, deadline=cfg.deadline)
            except KettenError as exc:
                self._inflight -= 1
                self.history.add(attrs.evolve(invoke, kind="fail", time=trio.current_time(),
                                              error=type(exc).__name__))
                await trio.sleep(rng.random() * 0.05)
                continue
            except BaseException:
                self._inflight -= 1
                self.history.add(attrs.evolve(invoke, kind="info", time=trio.current_time()))
                raise
            self._inflight -= 1
            self.history.add(attrs.evolve(invoke, kind="ok", time=trio.current_time(),
                                          event=event.hash, seq=event.seq))
            self._outbox[process] = None

    async def _chaos(self, done: trio.Event, stopped: trio.Event) -> None:
        try:
            await self._faults(done)
        finally:
            stopped.set()

    async def _faults(self, done: trio.Event) -> None:
        cfg = self.config
        rng = random.Random(cfg.seed * 104729 + 1)
        net = self._network
        while True:
            await trio.sleep(rng.uniform(*cfg.fault_gap))
            if done.is_set():
                return
            length = rng.uniform(*cfg.fault_length)
            if rng.random() < 0.5:
                index = rng.randrange(cfg.nodes)
                self.history.fault(FaultRecord(trio.current_time(), "crash", (index,)))
                self.crash(index)
                await trio.sleep(length)
                # It serves requests from the moment it starts, before it is ready.
                self.history.fault(FaultRecord(trio.current_time(), "restart", (index,)))
                await self.start(index)
            else:
                size = rng.randint(1, cfg.nodes // 2)
                group = tuple(sorted(rng.sample(range(cfg.nodes), size)))
                addresses = [self.address(i) for i in group]
                net.cut(addresses)  # type: ignore[attr-defined]
                self.history.fault(FaultRecord(trio.current_time(), "cut", group))
                await trio.sleep(length)
                net.heal(addresses)  # type: ignore[attr-defined]
                self.history.fault(FaultRecord(trio.current_time(), "heal", group))

    async def _chains(self, index: int, keys: list[bytes]
                      ) -> tuple[dict[bytes, list[bytes]], dict[bytes, list[bytes]]]:
        from ketten.plugins.memory_store import MemoryBacking, MemoryStore

        backing = self._backings[index]
        assert isinstance(backing, MemoryBacking)
        store = MemoryStore(backing=backing)
        await store.open()
        try:
            return (
                {k: [e.to_bytes() for e in await store.range(k)] for k in keys},
                {k: [e.to_bytes() for e in await store.orphans(k)] for k in keys},
            )
        finally:
            await store.aclose()

    async def main(self) -> tuple[Snapshot, dict[bytes, tuple[int, ...]], float]:
        from ketten.adapters.memory import Faults, MemoryNetwork
        from ketten.plugins.memory_store import MemoryBacking

        cfg = self.config
        self._identities = [deterministic_identity(cfg.seed, i) for i in range(cfg.nodes)]
        self._backings = [MemoryBacking() for _ in range(cfg.nodes)]
        self._network = net = MemoryNetwork(seed=cfg.seed, faults=Faults(latency=cfg.latency))
        keys = [_criterion(cfg.seed, i) for i in range(cfg.criteria)]
        ids = [identity.node_id for identity in self._identities]
        brokers = {k: _replica_set(k, ids, cfg.replication) for k in keys}
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for index in range(cfg.nodes):
                await self.start(index)
            await trio.sleep(3.0)  # membership spreads before anyone publishes
            net.set_faults(Faults(latency=cfg.latency, jitter=cfg.jitter, loss=cfg.loss,
                                  duplicate=cfg.duplicate, reorder=cfg.reorder))
            done = trio.Event()
            self._go.set()
            stopped = trio.Event()
            nursery.start_soon(self._chaos, done, stopped)
            while self._invoked < cfg.publishes or self._inflight:
                await trio.sleep(0.5)
            done.set()
            await stopped.wait()  # the last fault is undone
            net.heal()
            for index in range(cfg.nodes):
                if index not in self._scopes:
                    await self.start(index)
            healed = trio.current_time()
            self.history.fault(FaultRecord(healed, "heal", ()))
            converged: float | None = None
            while trio.current_time() - healed <= cfg.settle:
                if await self._converged(brokers):
                    converged = trio.current_time() - healed
                    break
                await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        stored = {i: await self._chains(i, keys) for i in range(cfg.nodes)}
        snapshot = Snapshot(chains={i: s[0] for i, s in stored.items()}, converged_after=converged,
                            orphans={i: s[1] for i, s in stored.items()})
        return snapshot, brokers, trio.current_time()

    async def _converged(self, brokers: Mapping[bytes, tuple[int, ...]]) -> bool:
        for key, members in brokers.items():
            heads = []
            for index in members:
                node = self._live.get(index)
                if node is None:
                    return False
                head = await node.store.head(key)
                heads.append(None if head is None else head.hash)
            if len(set(heads)) != 1:
                return False
        return True


@attrs.define(eq=False)
class _ForkObserver:
    history: History

    @hookimpl
    def ketten_fork_resolved(self, node: Node, criterion: bytes, orphaned: list[Event],
                             head: Event) -> None:
        index = int(node.address.rsplit(":", 1)[1])
        self.history.forks.append(ForkRecord(
            trio.current_time(), index, criterion,
            tuple((e.seq, e.hash) for e in orphaned), (head.seq, head.hash)))


def run_simulation(config: SimConfig, *, plugins: pluggy.PluginManager | None = None) -> SimResult:
    """Run one simulation (blocking, in virtual time) and check it."""
    pm = plugins if plugins is not None else plugin_manager()
    sim = _Simulation(config, pm)
    observer = _ForkObserver(sim.history)
    pm.register(observer)
    try:
        with seed_scheduler(config.seed):
            clock = trio.testing.MockClock(autojump_threshold=0)
            snapshot, brokers, duration = trio.run(sim.main, clock=clock)
    finally:
        pm.unregister(observer)
    authors = {p: sim._identities[p].public_key for p in range(config.publishers)}
    result = check(
        sim.history,
        snapshot,
        brokers=brokers,
        replication=config.replication,
        authors=authors,
        publisher_nodes={p: p for p in range(config.publishers)},
        settle=config.settle,
    )
    return SimResult(config, sim.history, snapshot, brokers, result, duration,
                     sim._network.statistics())  # type: ignore[attr-defined]
