"""Conformance suite for overlays: :func:`check_overlay`."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import pluggy
import trio
import trio.testing

from .. import Node, NodeConfig, open_node, plugin_manager
from .._core.identity import Identity
from ..errors import UsageError
from ..hookspecs import hookimpl
from ..interfaces import Handler, Overlay, Peer, Reply
from ._cluster import deterministic_identity

if TYPE_CHECKING:
    from ketten.adapters.memory import MemoryNetwork, MemoryTransport

__all__ = ["OverlayFactory", "check_overlay"]

OverlayFactory = Callable[[int, Sequence[str]], tuple[str, Mapping[str, Any]]]
"""``factory(index, seeds) -> (overlay plugin name, overlay options)``."""
Distance = Callable[[bytes, bytes], int]
"""``distance(node id, key)``: the overlay's metric; nearest first means smallest first."""

_LIAR = "check-overlay-liar"
_COUNTS = (1, 2, 3, 5, 8)


def _expect(section: str, condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"check_overlay [{section}]: {message}")


def _distance(node_id: bytes, key: bytes) -> int:
    return int.from_bytes(node_id, "big") ^ int.from_bytes(key, "big")


def _show(peers: Sequence[Any]) -> str:
    shown = []
    for p in peers:
        if isinstance(p, Peer):
            shown.append(f"{p.address}/{p.node_id.hex()[:8]}")
        else:
            shown.append(repr(p))
    return "[" + ", ".join(shown) + "]"


@attrs.define(eq=False)
class _LyingTransport:
    """A memory endpoint whose outgoing bytes name every other node by a forged key.

    Each public key of another node (and its node id) is replaced by the key
    (and id) of an identity nobody runs, so the node's overlay gossips the
    right addresses with the wrong keys.
    """

    inner: MemoryTransport
    forged: Callable[[], Mapping[bytes, bytes]]

    @property
    def address(self) -> str:
        return self.inner.address

    def _lie(self, data: bytes) -> bytes:
        for real, fake in self.forged().items():
            data = data.replace(real, fake)
            data = data.replace(hashlib.sha256(real).digest(), hashlib.sha256(fake).digest())
        return data

    async def serve(
        self, handler: Handler, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await self.inner.serve(_LyingHandler(handler, self._lie), task_status=task_status)

    async def request(self, address: str, data: bytes) -> Reply:
        return await self.inner.request(address, self._lie(data))

    async def send(self, address: str, data: bytes) -> None:
        await self.inner.send(address, self._lie(data))

    def statistics(self) -> Any:
        return self.inner.statistics()


@attrs.define(eq=False)
class _LyingHandler:
    handler: Handler
    lie: Callable[[bytes], bytes]

    async def handle_request(self, peer: Peer, data: bytes) -> bytes:
        return self.lie(await self.handler.handle_request(peer, data))

    async def handle_message(self, peer: Peer, data: bytes) -> None:
        await self.handler.handle_message(peer, data)


@attrs.define(eq=False)
class _Harness:
    """The suite's network: nodes that can be started and stopped one by one."""

    factory: OverlayFactory
    network: MemoryNetwork
    plugins: pluggy.PluginManager
    nursery: trio.Nursery
    seed: int
    start_timeout: float
    live: dict[bytes, tuple[Node, trio.CancelScope]] = attrs.field(factory=dict)
    honest: set[bytes] = attrs.field(factory=set)
    joined: list[tuple[bytes, Peer]] = attrs.field(factory=list)
    forged: dict[bytes, bytes] = attrs.field(factory=dict)
    ever: dict[bytes, Peer] = attrs.field(factory=dict)
    next_index: int = 0
    distance: Distance = attrs.field(default=lambda node_id, key: _distance(node_id, key))

    # -- hooks (registered on the plugin manager for the suite's duration) ------

    @hookimpl
    def ketten_peer_joined(self, node: Node, peer: Peer) -> None:
        self.joined.append((node.identity.public_key, peer))

    @hookimpl
    def ketten_make_transport(
        self, name: str, options: Mapping[str, Any], node: Node
    ) -> _LyingTransport | None:
        if name != _LIAR:
            return None
        own = node.identity.public_key
        inner = self.network.endpoint(node.identity, options.get("address"))

        def forged() -> Mapping[bytes, bytes]:
            for key in self.live:
                if key != own and key not in self.forged:
                    fake = Identity.from_seed(hashlib.sha256(b"forged" + key).digest())
                    self.forged[key] = fake.public_key
            return {k: v for k, v in self.forged.items() if k != own}

        return _LyingTransport(inner, forged)

    # -- membership --------------------------------------------------------------

    def seeds(self) -> list[str]:
        return [node.address for node, _ in self.live.values()]

    def nodes(self) -> list[Node]:
        return [node for node, _ in self.live.values()]

    def honest_nodes(self) -> list[Node]:
        return [node for key, (node, _) in self.live.items() if key in self.honest]

    def genuine(self) -> dict[bytes, Peer]:
        return {key: _peer(node) for key, (node, _) in self.live.items()}

    def truth(self, key: bytes, count: int) -> list[Peer]:
        ranked = sorted(self.genuine().values(), key=lambda p: self.distance(p.node_id, key))
        return ranked[:count]

    async def start(self, *, address: str | None = None, liar: bool = False) -> Node:
        index = self.next_index
        self.next_index += 1
        name, options = self.factory(index, tuple(self.seeds()))
        transport: dict[str, Any] = {"network": self.network}
        if address is not None:
            transport["address"] = address
        config = NodeConfig(
            identity=deterministic_identity(self.seed, index),
            transport=_LIAR if liar else "memory",
            overlay=name,
            options={"transport": transport, "overlay": dict(options)},
        )

        async def run(task_status: trio.TaskStatus[tuple[Node, trio.CancelScope]]) -> None:
            with trio.CancelScope() as scope:
                async with open_node(config, plugins=self.plugins) as node:
                    task_status.started((node, scope))
                    await trio.sleep_forever()

        started: tuple[Node, trio.CancelScope] | None = None
        with trio.move_on_after(self.start_timeout):
            started = await self.nursery.start(run)
        _expect("run", started is not None,
                f"node {index}: run() did not call task_status.started() within "
                f"{self.start_timeout} s of virtual time")
        assert started is not None
        node, scope = started
        _expect("run", isinstance(node.overlay, Overlay),
                f"node {index}: the plugin {name!r} does not implement the Overlay protocol")
        key = node.identity.public_key
        self.live[key] = (node, scope)
        self.ever[key] = _peer(node)
        if not liar:
            self.honest.add(key)
        return node

    def stop(self, node: Node) -> None:
        key = node.identity.public_key
        self.honest.discard(key)
        self.live.pop(key)[1].cancel()


def _peer(node: Node) -> Peer:
    return Peer(node.address, node.identity.public_key)


def _overlay(node: Node) -> Overlay:
    overlay = node.overlay
    assert overlay is not None
    return overlay


async def _closest(section: str, h: _Harness, node: Node, key: bytes, count: int,
                   timeout: float) -> list[Peer]:
    """Ask ``node``; check the answer's shape and that it names only genuine peers."""
    where = f"closest({key.hex()[:12]}..., {count}) at {node.address}"
    with trio.move_on_after(timeout):
        found = await _overlay(node).closest(key, count)
        _expect(section, isinstance(found, list), f"{where} returned {type(found).__name__}")
        _expect(section, all(isinstance(p, Peer) for p in found),
                f"{where} returned something that is not a Peer: {_show(found)}")
        _expect(section, len(found) <= count,
                f"{where} returned {len(found)} peers: {_show(found)}")
        ids = [p.node_id for p in found]
        _expect(section, len(set(ids)) == len(ids), f"{where} named a node twice: {_show(found)}")
        distances = [h.distance(i, key) for i in ids]
        _expect(section, distances == sorted(distances),
                f"{where} is not ordered nearest first by the overlay's distance (XOR unless "
                f"the suite was given another): {_show(found)}")
        genuine = h.genuine()
        for p in found:
            real = genuine.get(p.public_key)
            if real is None:
                _expect(section, p.public_key not in h.forged.values(),
                        f"{where} returned a key forged by a lying peer: {_show([p])}")
            _expect(section, real == p,
                    f"{where} returned {_show([p])}, which is not the authenticated identity of "
                    f"a live node (a departed node, or an address paired with the wrong key)")
        return found
    raise AssertionError(f"check_overlay [{section}]: {where} did not return within {timeout} s")


async def _exact(section: str, h: _Harness, node: Node, key: bytes, count: int,
                 timeout: float) -> None:
    found = await _closest(section, h, node, key, count, timeout)
    truth = h.truth(key, count)
    if found != truth:
        missing = [p for p in truth if p not in found]
        extra = [p for p in found if p not in truth]
        raise AssertionError(
            f"check_overlay [{section}]: closest({key.hex()[:12]}..., {count}) at "
            f"{node.address} returned {len(found)} peers, not the {len(truth)} closest live "
            f"nodes: missing {_show(missing)}, not among them {_show(extra)}"
            + ("" if missing or extra else f"; order {_show(found)} vs {_show(truth)}")
        )


async def _random_lookups(section: str, h: _Harness, rng: random.Random, lookups: int,
                          timeout: float) -> None:
    askers = h.honest_nodes()
    for _ in range(lookups):
        count = rng.choice([c for c in _COUNTS if c <= len(h.live)] or [1])
        await _exact(section, h, rng.choice(askers), rng.randbytes(32), count, timeout)


def _check_statistics(node: Node) -> None:
    stats = _overlay(node).statistics()
    _expect("statistics", stats is not None, "statistics() returned None")
    if attrs.has(type(stats)):
        try:
            setattr(stats, attrs.fields(type(stats))[0].name, None)
        except (attrs.exceptions.FrozenInstanceError, IndexError):
            return
        raise AssertionError("check_overlay [statistics]: statistics() must return a frozen "
                             "snapshot, not a live object")


def _check_joined(h: _Harness, section: str, *, complete: bool) -> None:
    records = h.joined
    everyone = h.ever
    for owner, peer in records:
        _expect(section, peer.public_key != owner,
                f"ketten_peer_joined reported node {peer.address} joined itself")
        real = everyone.get(peer.public_key)
        _expect(section, real == peer,
                f"ketten_peer_joined reported {_show([peer])}, which is not the authenticated "
                f"identity of a node")
    if not complete:
        return
    pairs = [(owner, peer.public_key) for owner, peer in records]
    _expect(section, len(set(pairs)) == len(pairs),
            "ketten_peer_joined fired more than once for the same peer while no node left")
    owners = {owner for owner, _ in records}
    seen = {peer.public_key for _, peer in records}
    for key, (node, _) in h.live.items():
        _expect(section, key in owners,
                f"ketten_peer_joined never fired on node {node.address}")
        _expect(section, key in seen,
                f"no node reported {node.address} through ketten_peer_joined")


async def check_overlay(
    factory: OverlayFactory,
    *,
    nodes: int = 40,
    seed: int = 0,
    settle: float = 60.0,
    liveness: float = 120.0,
    lookups: int = 60,
    plugins: pluggy.PluginManager | None = None,
    distance: Distance | None = None,
) -> None:
    """Check that an overlay plugin behaves as :class:`~ketten.interfaces.Overlay` promises.

    Builds a network of ``nodes`` full nodes (memory transport and store) on a
    ``MemoryNetwork(seed=seed)``, started one after another. Node ``index``
    runs the overlay plugin that ``factory(index, seeds)`` names, with the
    options it returns; ``seeds`` are the addresses of the live nodes
    started before it, oldest first (empty for the first node). For example::

        def kademlia(index, seeds):
            return "kademlia", {"bootstrap": list(seeds[:1])}

        async def test_my_overlay(autojump_clock):
            await ketten.testing.check_overlay(kademlia)

    It must run in virtual time: under ``trio.testing.MockClock`` with a
    finite ``autojump_threshold`` (0 is best). It checks, and fails with an
    :class:`AssertionError` naming the part and the lookup that failed:

    * ``run()`` calls ``task_status.started()`` within ``settle`` seconds;
    * after ``settle`` seconds, every node is found by its own id from others;
      ``closest(key, count)`` returns :class:`~ketten.interfaces.Peer` objects,
      nearest first by ``distance(node id, key)`` (default: their XOR; a ring
      overlay passes its own, e.g. ``ketten.plugins.gosskip.key_distance``), exactly the ``count`` closest
      live nodes (brute force, the asking node included), and everyone when
      ``count`` exceeds the network;
    * ``statistics()`` returns a frozen snapshot;
    * ``ketten_peer_joined`` fires on every node, for authenticated peers only,
      once per peer, and every node is reported by some other node;
    * nodes that leave (a tenth, at least two) are gone from every answer
      ``liveness`` seconds later, and the remaining answers are exact again;
    * a node with a new key at a departed node's address, and a lying node
      that names every other node by a forged key, never make a node return
      anything but the authenticated identity of a live node (its address
      with the key that proved itself there).
    * an overlay with a ``version`` property changes it whenever
      ``nearest`` answers differently (sampled every few seconds on every
      node throughout).

    ``plugins`` is the plugin manager the nodes use (default: the installed
    plugins); pass ``ketten.plugin_manager(extra=(your_plugin,))`` for a
    plugin that is not installed. The suite registers a helper plugin on it
    for its duration. For an exact replay of a failure, also make trio's
    scheduling deterministic: run ``trio.run`` under
    :func:`~ketten.testing.deterministic`.

    Raises :class:`~ketten.errors.UsageError` outside virtual time or with
    fewer than 8 nodes.
    """
    clock = trio.lowlevel.current_clock()
    if not (isinstance(clock, trio.testing.MockClock)
            and math.isfinite(clock.autojump_threshold)):
        raise UsageError("check_overlay runs in virtual time: use "
                         "trio.testing.MockClock(autojump_threshold=0)")
    if nodes < 8:
        raise UsageError("check_overlay needs at least 8 nodes")
    from ketten.adapters.memory import MemoryNetwork

    pm = plugins if plugins is not None else plugin_manager()
    rng = random.Random(seed)
    timeout = max(settle, liveness)
    failure: AssertionError | None = None
    async with trio.open_nursery() as nursery:
        h = _Harness(factory, MemoryNetwork(seed=seed), pm, nursery, seed, settle)
        if distance is not None:
            h.distance = distance
        pm.register(h)
        versions: list[AssertionError] = []
        nursery.start_soon(_watch_versions, h, random.Random(seed + 1), versions)
        try:
            await _run_suite(h, rng, nodes, settle, liveness, lookups, timeout)
        except AssertionError as exc:
            failure = exc
        finally:
            pm.unregister(h)
            nursery.cancel_scope.cancel()
    if failure is None and versions:
        failure = versions[0]
    if failure is not None:
        raise failure


_VERSION_SAMPLE = 2.0
_VERSION_KEYS = 4


async def _watch_versions(h: _Harness, rng: random.Random,
                          failures: list[AssertionError]) -> None:
    """Sample every node's ``version`` and ``nearest`` answers now and then: the
    answers may differ between two samples only if the version does."""
    keys = [rng.randbytes(32) for _ in range(_VERSION_KEYS)]
    seen: dict[tuple[str, bytes], tuple[int, list[list[Peer]]]] = {}
    while not failures:
        await trio.sleep(_VERSION_SAMPLE)
        failures.extend(filter(None, (_sample_version(node, keys, seen) for node in h.nodes())))


def _sample_version(node: Node, keys: list[bytes],
                    seen: dict[tuple[str, bytes], tuple[int, list[list[Peer]]]],
                    ) -> AssertionError | None:
    """Sample one node (see :func:`_watch_versions`); the broken promise, if any."""
    overlay = _overlay(node)
    version = getattr(overlay, "version", None)
    if not isinstance(version, int):
        return None
    answers = [list(overlay.nearest(key, 3)) for key in keys]
    name = (node.address, node.identity.public_key)
    before = seen.get(name)
    seen[name] = (version, answers)
    if before is None or before[0] != version:
        return None
    for key, old, new in zip(keys, before[1], answers, strict=True):
        if old != new:
            return AssertionError(
                f"check_overlay [version]: {node.address} kept version {version} while "
                f"nearest({key.hex()[:8]}, 3) went from {_show(old)} to {_show(new)}")
    return None


async def _run_suite(h: _Harness, rng: random.Random, nodes: int, settle: float,
                     liveness: float, lookups: int, timeout: float) -> None:
    for _ in range(nodes):
        await h.start()
    await trio.sleep(settle)

    everyone = h.nodes()
    for i, node in enumerate(everyone):
        asker = everyone[(i + 1 + rng.randrange(len(everyone) - 1)) % len(everyone)]
        await _exact("join", h, asker, node.identity.node_id, 1, timeout)
        await _exact("self", h, node, node.identity.node_id, 3, timeout)
    await _random_lookups("closest", h, rng, lookups, timeout)
    for node in rng.sample(everyone, 3):
        await _exact("everyone", h, node, rng.randbytes(32), len(everyone) + 10, timeout)
    for node in everyone:
        _check_statistics(node)
    _check_joined(h, "peer joined", complete=True)

    leavers = rng.sample(everyone, max(2, nodes // 10))
    for node in leavers:
        h.stop(node)
    await trio.sleep(liveness)
    for gone in leavers:
        for asker in rng.sample(h.honest_nodes(), 2):
            await _exact("leave", h, asker, gone.identity.node_id, 3, timeout)
    await _random_lookups("leave", h, rng, lookups // 2, timeout)
    asker = rng.choice(h.honest_nodes())
    await _exact("leave", h, asker, rng.randbytes(32), len(h.live) + 10, timeout)

    await h.start(address=leavers[0].address)
    await h.start(liar=True)
    await trio.sleep(settle)
    await _random_lookups("impostors", h, rng, lookups, timeout)
    for asker in rng.sample(h.honest_nodes(), 3):
        await _exact("impostors", h, asker, rng.randbytes(32), len(h.live) + 10, timeout)
    _check_joined(h, "impostors", complete=False)
