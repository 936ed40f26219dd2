"""A deterministic fault simulation of replicated chains, checked by :mod:`._jepsen`.

Nodes run on one seeded :class:`~ketten.adapters.memory.MemoryNetwork` in
virtual time, on the ``static``, ``kademlia``, ``gosskip`` or ``ipfs`` overlay, with memory
stores whose data survives restarts. Publishers (an :class:`ketten.Agent`
each, retrying a command until it is settled, as an application with an
outbox would) and readers run on several nodes throughout, while a *family*
of faults plays out:

``joins``
    nodes join closer to a criterion's key than its brokers: one, several,
    the whole replica set at once, or one after another (rolling).
``crashes``
    one, two or all brokers of a criterion crash, for less or for more than
    the eviction and hysteresis periods (the chain moves), and come back.
``partitions``
    the network splits for longer than every eviction and hysteresis
    timer, with publishers and readers on both sides, then heals.
``churn``
    random crashes, returns, joins and short partitions, with 10 % loss.
``loss``
    10 % message loss (with duplication and reordering) alone, for at least
    ten virtual minutes.

When the faults are over, everything heals, every node runs, and the
simulation waits until each chain's configuration has settled and its
voters agree. The history and the final stores go to
:func:`~ketten.testing._jepsen.check`.

Everything follows the seed: network, identities, workload and faults; run
through :func:`ketten.testing.deterministic` (as :func:`run_simulation`
does), trio's scheduling does too, so a failing seed replays exactly, in any
process.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

import attrs
import pluggy
import trio
import trio.testing

from .. import Agent, Node, NodeConfig, open_node, plugin_manager
from .._core.event import Event
from .._core.identity import Identity
from .._core.membership import ChainState
from ..errors import KettenError, PublishOutcomeUnknown, QuorumUnavailable
from ..hookspecs import hookimpl
from ._cluster import deterministic, deterministic_identity
from ._jepsen import CheckResult, FaultRecord, ForkRecord, History, Op, Read, Snapshot, check

__all__ = ["FAMILIES", "SimConfig", "SimResult", "run_simulation"]

FAMILIES = ("joins", "crashes", "partitions", "churn", "loss")


@attrs.frozen
class SimConfig:
    """Parameters of one simulation run (times are virtual seconds)."""

    seed: int = 0
    family: str = "partitions"
    overlay: str = "static"
    nodes: int = 7
    replication: int = 3
    publishers: int = 4
    readers: int = 2
    criteria: int = 3
    publishes: int = 240
    loss: float = 0.10
    duplicate: float = 0.05
    reorder: float = 0.10
    latency: float = 0.005
    jitter: float = 0.005
    request_timeout: float = 0.5
    anti_entropy: float = 2.0
    hysteresis: float = 15.0
    evict_after: float = 20.0
    overlay_interval: float = 2.0
    settle: float = 240.0
    attempts: int = 4
    deadline: float = 4.0
    min_duration: float = 0.0
    """Keep the faults going at least this long, whatever the workload."""
    pace: float = 0.0
    """Mean seconds a publisher waits between publishes (0: by family)."""
    implicit_commands: bool = False
    """Odd publishers give no command ids: each call (retries included) is a call
    of its own, with a payload of its own, which must be applied at most once."""
    copies_events: int = 100
    """Each node's bound on reader copies (the ``replication`` option): small, so
    that readers drop copies and fetch them again while faults go on."""


@attrs.frozen
class SimResult:
    """What a run produced and what the checker found."""

    config: SimConfig
    history: History
    snapshot: Snapshot
    check: CheckResult
    duration: float
    network: object
    copies_dropped: int = 0
    """Reader copies the nodes dropped to stay within ``copies_events``."""
    retirements: int = 0
    """Chains nodes stopped replicating when a move left them out (and they heard)."""

    @property
    def ok(self) -> bool:
        return self.check.ok


def _criterion(seed: int, index: int) -> bytes:
    return hashlib.sha256(b"ketten-sim-criterion:%d:%d" % (seed, index)).digest()


def _distance(a: bytes, b: bytes) -> int:
    return int.from_bytes(a, "big") ^ int.from_bytes(b, "big")


def _ring_distance(node_id: bytes, key: bytes) -> int:
    """How far ``node_id`` follows ``key`` on a ring (gosskip's replica sets)."""
    return (int.from_bytes(node_id, "big") - int.from_bytes(key, "big")) % (1 << 256)


def _identity_near(key: bytes, closer_than: int, rng: random.Random,
                   distance: Callable[[bytes, bytes], int] = _distance) -> Identity:
    """An identity whose node id is closer to ``key`` than ``closer_than``."""
    while True:
        identity = Identity.from_seed(rng.randbytes(32))
        if distance(identity.node_id, key) < closer_than:
            return identity


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
    identities: dict[int, Identity] = attrs.field(factory=dict)
    backings: dict[int, Any] = attrs.field(factory=dict)
    _scopes: dict[int, trio.CancelScope] = attrs.field(factory=dict)
    _live: dict[int, Node] = attrs.field(factory=dict)
    retirements: int = 0
    """Chains nodes stopped replicating when told to retire (over every run of each)."""
    _outbox: dict[int, _Outbox | None] = attrs.field(factory=dict)
    _invoked: int = 0
    _inflight: int = 0
    network: Any = None
    _nursery: trio.Nursery | None = None
    keys: list[bytes] = attrs.field(factory=list)
    _done: trio.Event = attrs.field(factory=trio.Event)
    rng: random.Random = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.rng = random.Random(self.config.seed * 1_000_003 + FAMILIES.index(
            self.config.family) * 7919 + (self.config.overlay == "kademlia"))

    # -- nodes -------------------------------------------------------------------

    def address(self, index: int) -> str:
        return f"sim:{index}"

    def node_config(self, index: int) -> NodeConfig:
        cfg = self.config
        seeds = [self.address(i) for i in (0, 1) if i != index] or [self.address(0)]
        if cfg.overlay in ("kademlia", "ipfs"):
            overlay: dict[str, Any] = {"bootstrap": seeds, "rpc_timeout": cfg.request_timeout,
                                       "refresh_interval": 10.0}
            if cfg.overlay == "ipfs":
                # Every read on a node that is no broker goes through providers.
                overlay.update(read_above=0, segment=16)
        elif cfg.overlay == "gosskip":
            overlay = {"bootstrap": seeds, "rpc_timeout": cfg.request_timeout,
                       "interval": cfg.overlay_interval}
        else:
            overlay = {"seeds": seeds, "interval": cfg.overlay_interval,
                       "evict_after": cfg.evict_after}
        return NodeConfig(
            identity=self.identities[index],
            overlay=cfg.overlay,
            replication=cfg.replication,
            request_timeout=cfg.request_timeout,
            options={
                "transport": {"network": self.network, "address": self.address(index)},
                "store": {"backing": self.backings[index]},
                "overlay": overlay,
                "replication": {
                    "anti_entropy": cfg.anti_entropy,
                    "hysteresis": cfg.hysteresis,
                    "copies_events": cfg.copies_events,
                    "time": lambda: int(trio.current_time() * 1000),
                },
                "subscriptions": {"ttl": 60.0},
            },
        )

    async def _node(self, index: int, *, task_status: trio.TaskStatus[None]) -> None:
        with trio.CancelScope() as scope:
            self._scopes[index] = scope
            try:
                async with open_node(self.node_config(index), plugins=self.plugins) as node:
                    self._live[index] = node
                    task_status.started()
                    try:
                        await trio.sleep_forever()
                    finally:
                        self.retirements += node.replication_statistics().retirements
            finally:
                self._live.pop(index, None)
                if self._scopes.get(index) is scope:
                    del self._scopes[index]

    async def start(self, index: int) -> None:
        from ketten.plugins.memory_store import MemoryBacking

        if index in self._scopes:
            return
        self.backings.setdefault(index, MemoryBacking())
        assert self._nursery is not None
        await self._nursery.start(self._node, index)

    def crash(self, index: int) -> None:
        scope = self._scopes.pop(index, None)
        if scope is not None:
            scope.cancel()
        self._live.pop(index, None)

    def distance(self, node_id: bytes, key: bytes) -> int:
        """The overlay's metric: ring successors on gosskip, XOR otherwise."""
        return (_ring_distance if self.config.overlay == "gosskip" else _distance)(node_id, key)

    def brokers(self, key: bytes) -> list[int]:
        """The running nodes closest to ``key`` (what the overlays converge to)."""
        ranked = sorted(self._live, key=lambda i: self.distance(self.identities[i].node_id, key))
        return ranked[: self.config.replication]

    # -- workload ----------------------------------------------------------------

    def _worker_nodes(self) -> list[int]:
        return sorted(self._live)

    async def _publisher(self, process: int) -> None:
        cfg = self.config
        rng = random.Random(cfg.seed * 7919 + process)
        identity = Identity.from_seed(hashlib.sha256(b"sim-author:%d:%d" % (
            cfg.seed, process)).digest())
        self.identities.setdefault(-1 - process, identity)
        home = process % cfg.nodes
        implicit = cfg.implicit_commands and process % 2 == 1
        command = 0
        while self._invoked < cfg.publishes or not self._done.is_set():
            if self._done.is_set() and self._invoked >= cfg.publishes:
                return
            node = self._live.get(home)
            if node is None:
                # The publisher's node is down: it waits for it (its outbox is kept).
                await trio.sleep(1.0)
                continue
            pending = self._outbox.get(process)
            if pending is None or pending.tries >= cfg.attempts or implicit:
                command += 1
                criterion = self.keys[rng.randrange(len(self.keys))]
                pending = _Outbox(criterion, command, b"p%d:c%d" % (process, command))
                self._outbox[process] = pending
            pending.tries += 1
            self._invoked += 1
            invoke = Op(process, "invoke", trio.current_time(), pending.criterion,
                        pending.command, pending.payload)
            self.history.add(invoke)
            self._inflight += 1
            try:
                agent = await Agent.open(node, identity=identity)
                event = await agent.publish(pending.criterion, pending.payload,
                                            command=None if implicit else pending.command,
                                            deadline=cfg.deadline)
            except QuorumUnavailable as exc:
                self._inflight -= 1
                self.history.add(attrs.evolve(invoke, kind="fail", time=trio.current_time(),
                                              error=type(exc).__name__))
                await trio.sleep(rng.random() * 0.5)
                continue
            except (PublishOutcomeUnknown, KettenError) as exc:
                self._inflight -= 1
                self.history.add(attrs.evolve(invoke, kind="info", time=trio.current_time(),
                                              error=type(exc).__name__))
                await trio.sleep(rng.random() * 0.5)
                continue
            except BaseException:
                self._inflight -= 1
                self.history.add(attrs.evolve(invoke, kind="info", time=trio.current_time()))
                raise
            self._inflight -= 1
            self.history.add(attrs.evolve(invoke, kind="ok", time=trio.current_time(),
                                          event=event.hash, seq=event.seq))
            self._outbox[process] = None
            await trio.sleep(rng.random() * 2 * self.pace())

    async def _reader(self, process: int) -> None:
        cfg = self.config
        rng = random.Random(cfg.seed * 104729 + process)
        while not self._done.is_set():
            await trio.sleep(1.0 + rng.random() * 2.0)
            live = self._worker_nodes()
            if not live:
                continue
            node = self._live.get(live[rng.randrange(len(live))])
            if node is None:
                continue
            criterion = self.keys[rng.randrange(len(self.keys))]
            start = trio.current_time()
            try:
                events = await node.read(criterion)
            except KettenError:
                continue
            self.history.read(Read(1000 + process, start, trio.current_time(), criterion,
                                   tuple(e.hash for e in events)))

    # -- faults ------------------------------------------------------------------

    def fault(self, kind: str, nodes: tuple[int, ...]) -> None:
        self.history.fault(FaultRecord(trio.current_time(), kind, nodes))

    def set_loss(self, on: bool) -> None:
        from ketten.adapters.memory import Faults

        cfg = self.config
        if on:
            faults = Faults(latency=cfg.latency, jitter=cfg.jitter, loss=cfg.loss,
                            duplicate=cfg.duplicate, reorder=cfg.reorder)
        else:
            faults = Faults(latency=cfg.latency, jitter=cfg.jitter)
        self.network.set_faults(faults)
        self.fault("loss" if on else "lossless", ())

    async def _outage(self, nodes: list[int], length: float) -> None:
        for index in nodes:
            self.crash(index)
        self.fault("crash", tuple(nodes))
        await trio.sleep(length)
        for index in nodes:
            await self.start(index)
        self.fault("restart", tuple(nodes))

    async def _partition(self, group: list[int], length: float) -> None:
        addresses = [self.address(i) for i in group]
        self.network.cut(addresses)
        self.fault("cut", tuple(group))
        await trio.sleep(length)
        self.network.heal(addresses)
        self.fault("heal", tuple(group))

    def pace(self) -> float:
        if self.config.pace > 0:
            return self.config.pace
        return {"loss": 3.0, "churn": 1.5}.get(self.config.family, 1.0)

    def long(self) -> float:
        """Longer than every eviction and hysteresis timer."""
        cfg = self.config
        return cfg.evict_after + cfg.hysteresis + 20.0 + self.rng.uniform(0, 40)

    def short(self) -> float:
        return self.rng.uniform(1.0, min(self.config.hysteresis, self.config.evict_after) / 2)

    async def _joins(self) -> None:
        cfg = self.config
        rng = self.rng
        variant = rng.choice(["one", "several", "whole", "rolling"])
        self.fault(f"joins:{variant}", ())
        next_index = max(self.identities) + 1
        if variant == "one":
            targets = [(self.keys[0], 1)]
        elif variant == "several":
            targets = [(key, 1) for key in self.keys]
        elif variant == "whole":
            targets = [(self.keys[0], cfg.replication)]
        else:
            targets = [(self.keys[0], 1)] * cfg.replication
        for key, count in targets:
            current = min(self.distance(self.identities[i].node_id, key) for i in self._live)
            joiners = []
            for _ in range(count):
                identity = _identity_near(key, current, rng, self.distance)
                self.identities[next_index] = identity
                joiners.append(next_index)
                next_index += 1
            if variant == "rolling":
                await trio.sleep(cfg.hysteresis * rng.uniform(0.5, 2.0))
            for index in joiners:
                await self.start(index)
            self.fault("join", tuple(joiners))
            await trio.sleep(rng.uniform(1.0, 10.0))

    async def _crashes(self) -> None:
        cfg = self.config
        rng = self.rng
        key = self.keys[rng.randrange(len(self.keys))]
        how_many = rng.choice([1, 1, 2, cfg.replication])
        length = self.long() if rng.random() < 0.6 else self.short()
        victims = self.brokers(key)[:how_many]
        self.fault(f"crashes:{how_many}:{'long' if length > cfg.hysteresis else 'short'}", ())
        await self._outage(victims, length)
        await trio.sleep(rng.uniform(5.0, 15.0))
        # A second round on another chain's brokers.
        key = self.keys[rng.randrange(len(self.keys))]
        await self._outage(self.brokers(key)[:1], self.short())

    async def _partitions(self) -> None:
        rng = self.rng
        for _ in range(2):
            key = self.keys[rng.randrange(len(self.keys))]
            brokers = self.brokers(key)
            # One broker and some others on the small side: publishers on both sides.
            small = [brokers[rng.randrange(len(brokers))]]
            others = [i for i in sorted(self._live) if i not in brokers]
            rng.shuffle(others)
            small += others[: max(1, (len(self._live) - 1) // 2 - 1)]
            await self._partition(sorted(small), self.long())
            await trio.sleep(rng.uniform(5.0, 15.0))

    async def _churn(self) -> None:
        rng = self.rng
        self.set_loss(True)
        next_index = max(self.identities) + 1
        until = trio.current_time() + 240.0
        while trio.current_time() < until:
            await trio.sleep(rng.uniform(3.0, 12.0))
            roll = rng.random()
            live = sorted(self._live)
            if roll < 0.4 and len(live) > self.config.replication + 1:
                await self._outage([live[rng.randrange(len(live))]],
                                   self.short() if rng.random() < 0.5 else self.long() / 2)
            elif roll < 0.6:
                key = self.keys[rng.randrange(len(self.keys))]
                current = min(self.distance(self.identities[i].node_id, key) for i in live)
                self.identities[next_index] = _identity_near(key, current, rng, self.distance)
                await self.start(next_index)
                self.fault("join", (next_index,))
                next_index += 1
            else:
                group = [i for i in live if rng.random() < 0.3] or live[:1]
                await self._partition(group, self.short())

    async def _loss(self) -> None:
        self.set_loss(True)
        await trio.sleep(max(600.0, self.config.min_duration))

    async def _faults(self) -> None:
        family = self.config.family
        script: Callable[[], Any] = {
            "joins": self._joins, "crashes": self._crashes, "partitions": self._partitions,
            "churn": self._churn, "loss": self._loss,
        }[family]
        await script()

    # -- the run -------------------------------------------------------------------

    async def main(self) -> tuple[Snapshot, float]:
        from ketten.adapters.memory import Faults, MemoryNetwork

        cfg = self.config
        for index in range(cfg.nodes):
            self.identities[index] = deterministic_identity(cfg.seed, index)
        self.network = MemoryNetwork(seed=cfg.seed,
                                     faults=Faults(latency=cfg.latency, jitter=cfg.jitter))
        self.keys = [_criterion(cfg.seed, i) for i in range(cfg.criteria)]
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for index in range(cfg.nodes):
                await self.start(index)
            await trio.sleep(5.0)  # membership spreads before anyone publishes
            await self._create_chains()
            started = trio.current_time()
            async with trio.open_nursery() as load:
                for process in range(cfg.publishers):
                    load.start_soon(self._publisher, process)
                for process in range(cfg.readers):
                    load.start_soon(self._reader, process)
                await self._faults()
                while trio.current_time() - started < cfg.min_duration:
                    await trio.sleep(1.0)
                self._done.set()
                while self._invoked < cfg.publishes:
                    await trio.sleep(1.0)
            healed = await self._heal()
            converged = await self._settle(healed)
            nursery.cancel_scope.cancel()
        return await self._snapshot(converged), trio.current_time()

    async def _create_chains(self) -> None:
        """Every criterion gets its genesis while all nodes run (no race to create)."""
        node = self._live[0]
        for key in self.keys:
            for _ in range(20):
                try:
                    await node.publish(key, b"genesis", deadline=10.0)
                    break
                except KettenError:
                    await trio.sleep(1.0)

    async def _heal(self) -> float:
        self.network.heal()
        self.set_loss(False)
        for index in sorted(self.identities):
            if index >= 0 and index not in self._scopes:
                await self.start(index)
        healed = trio.current_time()
        self.fault("heal", ())
        return healed

    async def _settle(self, healed: float) -> float | None:
        cfg = self.config
        while trio.current_time() - healed <= cfg.settle:
            await trio.sleep(2.0)
            if await self._converged():
                return trio.current_time() - healed
        return None

    async def _converged(self) -> bool:
        """Does every criterion have one chain, in a settled configuration whose voters hold
        the same head, which a read through another node returns, with no move under way?
        The reads come first; the last look at the replicas awaits nothing, so no move
        can start between it and the snapshot that follows."""
        node = self._live[min(self._live)]
        read: dict[bytes, bytes | None] = {}
        for key in self.keys:
            try:
                with trio.move_on_after(10.0):
                    events = await node.read(key)
                    read[key] = events[-1].hash if events else None
            except KettenError:
                return False
            if read.get(key) is None:
                return False
        for key in self.keys:
            # One chain per criterion: a criterion started twice is settled first.
            geneses = set()
            for index in sorted(self._live):
                first = await self._live[index].store.range(key, 0, 1)
                if first:
                    geneses.add(first[0].hash)
            if len(geneses) > 1:
                return False
        return all(self._settled(key, read[key]) for key in self.keys)

    def _settled(self, key: bytes, head: bytes | None) -> bool:
        """Is ``key`` in a configuration that is not joint and that no leader is moving
        (no learners), with every voter at ``head``? From the replicas in memory."""
        replicas = {}
        for index, node in self._live.items():
            replica = node._replicator.loaded(key)
            if replica is not None and replica.config is not None:
                replicas[index] = replica
        if not replicas:
            return False
        config = max((r.config for r in replicas.values() if r.config is not None),
                     key=lambda c: c.epoch)
        if config.joint or any(p.learner for r in replicas.values() for p in r.progress.values()):
            return False
        index_of = {self.identities[i].public_key: i for i in self._live}
        for member in config.voters:
            replica = replicas.get(index_of.get(member.key, -1))
            if (replica is None or replica.config != config or replica.head is None
                    or replica.head[1] != head):
                return False
        return True

    async def _snapshot(self, converged: float | None) -> Snapshot:
        from ketten.plugins.memory_store import MemoryStore

        chains: dict[int, dict[bytes, list[bytes]]] = {}
        states: dict[int, dict[bytes, ChainState]] = {}
        orphans: dict[int, dict[bytes, list[bytes]]] = {}
        for index in sorted(self.backings):
            store = MemoryStore(backing=self.backings[index])
            await store.open()
            try:
                chains[index] = {k: [e.to_bytes() for e in await store.range(k)]
                                 for k in self.keys}
                orphans[index] = {k: [e.to_bytes() for e in await store.orphans(k)]
                                  for k in self.keys}
                states[index] = {}
                for key in self.keys:
                    raw = await store.get_cursor("ketten/chain/" + key.hex())
                    if raw is not None:
                        states[index][key] = ChainState.decode(raw)
            finally:
                await store.aclose()
        return Snapshot(chains=chains, states=states, converged_after=converged,
                        orphans=orphans)


@attrs.define(eq=False)
class _ForkObserver:
    history: History
    dropped: int = 0

    @hookimpl
    def ketten_chain_dropped(self, node: Any, criterion: bytes) -> None:
        self.dropped += 1

    @hookimpl
    def ketten_fork_resolved(self, node: Any, criterion: bytes, orphaned: list[Event],
                             head: Event | None) -> None:
        index = int(node.address.rsplit(":", 1)[1])
        self.history.forks.append(ForkRecord(
            trio.current_time(), index, criterion,
            tuple((e.seq, e.hash) for e in orphaned),
            None if head is None else (head.seq, head.hash)))


def run_simulation(config: SimConfig, *, plugins: pluggy.PluginManager | None = None) -> SimResult:
    """Run one simulation (blocking, in virtual time, deterministic) and check it."""
    if config.family not in FAMILIES:
        raise ValueError(f"unknown family {config.family!r}; one of {', '.join(FAMILIES)}")
    pm = plugins if plugins is not None else plugin_manager()
    sim = _Simulation(config, pm)
    observer = _ForkObserver(sim.history)
    pm.register(observer)
    try:
        snapshot, duration = deterministic(
            lambda: trio.run(sim.main, clock=trio.testing.MockClock(autojump_threshold=0)))
    finally:
        pm.unregister(observer)
    keys = {identity.public_key: index for index, identity in sim.identities.items()
            if index >= 0}
    authors = {-1 - index: identity.public_key for index, identity in sim.identities.items()
               if index < 0}
    result = check(sim.history, snapshot, keys=keys, authors=authors, settle=config.settle)
    return SimResult(config, sim.history, snapshot, result, duration,
                     sim.network.statistics(), observer.dropped, sim.retirements)
