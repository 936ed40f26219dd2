"""The gosskip overlay: its sans-IO ring and lookup, a many-node ring simulation,
the trio driver on the memory transport, and the overlay conformance suite."""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pluggy
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import ketten
from ketten import ConfigError, DecodeError, Identity, NodeConfig, ProtocolError, open_node
from ketten.adapters.memory import MemoryNetwork
from ketten.errors import RemoteError
from ketten.interfaces import Peer
from ketten.plugins.gosskip import GosskipOptions, GosskipOverlay, key_distance
from ketten.plugins.gosskip._lookup import Found, Lookup
from ketten.plugins.gosskip._messages import (
    decode_answer,
    decode_found,
    decode_request,
    encode_answer,
    encode_gossip,
)
from ketten.plugins.gosskip._names import RING, Contact, between, clockwise, point
from ketten.plugins.gosskip._ring import MAX_ENTRIES, Answer, Ring
from ketten.plugins.gosskip._sim import RingSimulation
from ketten.testing._check_overlay import check_overlay


def contact(index: int, order: int = 0, key: bytes | None = None) -> Contact:
    return Contact(Peer(f"n:{index}", key or bytes([index % 256]) * 32), order)


def ordered(count: int, seed: int = 0) -> list[Contact]:
    rng = random.Random(seed)
    nodes = [Contact(Peer(f"n:{i}", rng.randbytes(32)), rng.getrandbits(64))
             for i in range(count)]
    return sorted(nodes, key=lambda c: c.position)


# -- names -----------------------------------------------------------------------


def test_names_sort_by_key_hash_then_order_on_a_closed_ring() -> None:
    assert point(b"\x01" * 32, 5) < point(b"\x01" * 32, 6) < point(b"\x02" * 32, 0)
    assert clockwise(RING - 1, 0) == 1
    assert between(10, 11, 12) and not between(10, 12, 12) and not between(10, 10, 12)
    assert between(RING - 5, 3, 7)  # the arc wraps past zero
    assert between(4, 9, 4) and not between(4, 4, 4)  # from a point to itself: the whole ring


@given(st.binary(min_size=32, max_size=32), st.lists(st.binary(min_size=32, max_size=32),
                                                       min_size=1, max_size=20, unique=True))
def test_key_distance_ranks_nodes_as_the_ring_does(key: bytes, ids: list[bytes]) -> None:
    by_metric = sorted(ids, key=lambda i: key_distance(i, key))
    by_ring = sorted(ids, key=lambda i: clockwise(point(key), point(i)))
    assert by_metric == by_ring


# -- the ring state machine -----------------------------------------------------------


def test_a_ring_of_two_closes_through_one_gossip() -> None:
    a, b = (Ring(c) for c in ordered(2))
    assert a.adopt([b.me])
    answer = b.on_gossip(a.me, 0, [], now=1.0)
    assert b.link("left", 0) == a.me and b.link("right", 0) == a.me
    assert answer == Answer((a.me,), None)
    assert not a.on_answer(b.me, 0, answer, now=1.0)
    assert a.successors == [b.me]


def test_link_notification_moves_the_predecessor_to_a_node_that_joined_between() -> None:
    low, middle, high = ordered(3)
    a, b, c = Ring(low), Ring(middle), Ring(high)
    a.adopt([high])
    c.on_gossip(low, 0, [], now=1.0)
    assert c.link("left", 0) == low
    # b joins between a and c: c takes it as the nearer predecessor ...
    b.adopt([high])
    assert c.on_gossip(middle, 0, [], now=2.0).notify is None
    assert c.link("left", 0) == middle
    # ... and tells a, whose next gossip it answers, about it.
    answer = c.on_gossip(low, 0, [], now=2.5)
    assert answer.notify == middle
    assert a.on_answer(high, 0, answer, now=2.5) is True
    assert a.link("right", 0) == middle and a.successors[1] == high
    # A farther node's claim is not taken.
    assert not a.on_answer(middle, 0, Answer((), notify=high), now=3.0)
    assert a.link("right", 0) == middle


def test_a_failed_successor_is_replaced_from_the_repair_list() -> None:
    me, s1, s2, s3 = ordered(4)
    ring = Ring(me, drop_after=2)
    ring.adopt([s1, s2, s3])
    assert ring.on_failure(s1, 0, now=1.0) is False  # one failure is not enough
    assert ring.on_failure(s1, 0, now=2.0) is True
    assert ring.successors == [s2, s3]
    assert ring.statistics().repairs == 1


def test_silent_neighbours_are_dropped_after_stale_seconds() -> None:
    p2, p1, me = ordered(3)
    ring = Ring(me, stale=3.0)
    ring.on_gossip(p1, 0, [p2], now=10.0)
    assert ring.predecessors == [p1, p2] and ring.link("left", 1) == p2
    ring.expire(12.9)
    assert ring.predecessors == [p1, p2] and ring.link("left", 1) == p2
    ring.expire(13.1)
    assert ring.predecessors == [] and ring.link("left", 1) is None


def test_chains_that_pass_the_receiver_are_cut_and_drop_the_next_level() -> None:
    n0, n1, n2, n3 = ordered(4)
    ring = Ring(n3)
    ring.on_gossip(n2, 0, [n1], now=1.0)
    assert ring.predecessors == [n2, n1] and ring.link("left", 1) == n1
    # The chain comes back to the receiver: the ring is too small for level 1.
    ring.on_gossip(n2, 0, [n3, n1], now=2.0)
    assert ring.predecessors == [n2] and ring.link("left", 1) is None
    # A chain that turns back is cut where it turns.
    ring.on_gossip(n2, 0, [n0, n1], now=3.0)
    assert ring.predecessors == [n2, n0] and ring.link("left", 1) == n0


def test_version_changes_only_when_the_known_nodes_change() -> None:
    p, me, s = ordered(3)
    ring = Ring(me)
    start = ring.version
    ring.adopt([s])
    after_adopt = ring.version
    assert after_adopt != start
    ring.on_gossip(p, 0, [], now=1.0)
    after_pred = ring.version
    assert after_pred != after_adopt
    ring.on_gossip(p, 0, [], now=2.0)
    assert ring.version == after_pred


def test_hostile_gossip_is_refused_for_that_message_only() -> None:
    p, me = ordered(2)
    ring = Ring(me, max_levels=8)
    with pytest.raises(ProtocolError):
        ring.on_gossip(p, 8, [], now=1.0)
    with pytest.raises(ProtocolError):
        ring.on_gossip(me, 0, [], now=1.0)
    with pytest.raises(ProtocolError):
        ring.on_gossip(p, 0, [p] * (MAX_ENTRIES + 1), now=1.0)
    ring.on_gossip(p, 0, [], now=1.0)
    assert ring.link("left", 0) == p


def test_lists_grow_with_the_levels_and_are_bounded() -> None:
    sim = RingSimulation(seed=3, repair=2)
    sim.build(64)
    for _ in range(30):
        sim.round()
    ring = next(iter(sim.rings.values()))
    assert ring.height >= 6  # levels 0..5 on 64 nodes
    assert ring.list_size() == ring.height + 1 <= MAX_ENTRIES
    assert len(ring.successors) == ring.list_size()


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 48), k=st.sampled_from([2, 3]), seed=st.integers(0, 2**32))
def test_any_ring_converges_to_a_perfect_skip_list(n: int, k: int, seed: int) -> None:
    sim = RingSimulation(seed=seed, k=k, repair=3)
    sim.build(n)
    rounds = 0
    while sim.link_accuracy() < 1.0 and rounds < 20 * (math.ceil(math.log(n, k)) + 2):
        sim.round()
        rounds += 1
    assert sim.ring_formed()
    assert sim.link_accuracy() == 1.0
    rng = random.Random(seed)
    for _ in range(10):
        target = rng.randrange(RING)
        found, _ = sim.lookup(rng.choice(sorted(sim.alive)), target)
        assert found == sim.successor_of(target)


# -- lookups ---------------------------------------------------------------------------


def _run_lookup(lookup: Lookup, local: Found, answers: Mapping[str, Found]) -> Lookup:
    pending = lookup.start(local)
    while pending:
        query = pending.pop(0)
        found = answers.get(query.address)
        pending += (lookup.on_failure(query.address) if found is None
                    else lookup.on_reply(query.address, found))
    assert lookup.finished
    return lookup


def _answers(ring: Sequence[Contact], size: int) -> dict[str, Found]:
    n = len(ring)
    return {c.peer.address: Found(
        c, tuple(ring[(i + j) % n] for j in range(1, min(size, n - 1) + 1)),
        (), tuple(ring[(i - j) % n] for j in range(1, min(size, n - 1) + 1)))
        for i, c in enumerate(ring)}


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), count=st.integers(1, 12), seed=st.integers(0, 2**32))
def test_a_lookup_finds_exactly_the_successors(n: int, count: int, seed: int) -> None:
    ring = ordered(n, seed)
    answers = _answers(ring, 4)
    rng = random.Random(seed)
    start = rng.choice(ring)
    target = rng.randrange(RING)
    lookup = _run_lookup(Lookup(target, count), answers[start.peer.address], answers)
    truth = sorted(ring, key=lambda c: clockwise(target, c.position))[:count]
    assert lookup.result() == truth


def test_forged_keys_never_enter_a_lookups_result() -> None:
    ring = ordered(12, seed=5)
    answers = _answers(ring, 4)
    liar = ring[3]
    # The liar names its successors by forged keys at their real addresses.
    forged = tuple(Contact(Peer(c.peer.address, bytes(32 - i) + b"\xff" * i), c.order)
                   for i, c in enumerate(answers[liar.peer.address].successors, start=1))
    answers[liar.peer.address] = Found(liar, forged, (), answers[liar.peer.address].predecessors)
    target = ring[4].position - 1
    lookup = _run_lookup(Lookup(target, 5), answers[ring[0].peer.address], answers)
    assert lookup.result() == ring[4:9]


def test_dead_nodes_are_left_out_of_a_lookup() -> None:
    ring = ordered(10, seed=6)
    answers = _answers(ring, 4)
    dead = ring[5]
    del answers[dead.peer.address]
    lookup = _run_lookup(Lookup(ring[4].position + 1, 3), answers[ring[0].peer.address], answers)
    assert lookup.result() == [ring[6], ring[7], ring[8]]


# -- messages ----------------------------------------------------------------------------


def test_messages_round_trip() -> None:
    nodes = ordered(3)
    request = decode_request(encode_gossip(2, 7, nodes[:2]))
    assert request.level == 2 and request.order == 7 and request.entries == tuple(nodes[:2])  # type: ignore[union-attr]
    peer = nodes[2].peer
    responder, answer = decode_answer(peer, encode_answer(nodes[2].order, Answer(
        tuple(nodes[:2]), nodes[0])))
    assert responder == nodes[2] and answer == Answer(tuple(nodes[:2]), nodes[0])


@pytest.mark.parametrize("body, error", [
    ({"op": "gossip", "level": -1, "order": 0, "entries": []}, DecodeError),
    ({"op": "gossip", "level": 0, "order": 2**64, "entries": []}, DecodeError),
    ({"op": "gossip", "level": 0, "order": 0, "entries": [["a", b"x", 0]]}, DecodeError),
    ({"op": "gossip", "level": 0, "order": 0, "entries": [["a", b"x" * 32, 0]] * 65},
     ProtocolError),
    ({"op": "find", "target": b"short", "at": 0}, DecodeError),
    ({"op": "steal"}, ProtocolError),
    ([1, 2], DecodeError),
])
def test_malformed_requests_raise(body: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_request(body)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.binary(max_size=40)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["op", "level", "order", "entries",
                                                       "target", "at", "succ", "notify",
                                                       "closer", "pred"]), inner, max_size=6),
                    max_leaves=20))
def test_any_body_decodes_or_raises_a_ketten_error(body: Any) -> None:
    peer = Peer("n:1", b"\x01" * 32)
    for decode in (decode_request, lambda b: decode_answer(peer, b),
                   lambda b: decode_found(peer, b)):
        try:
            decode(body)
        except (DecodeError, ProtocolError):
            pass


def test_options_are_checked() -> None:
    assert GosskipOptions.parse({}, replication=3).repair == 8
    assert GosskipOptions.parse({"rpc_timeout": 0.5}, 3).lookup_timeout == 4.0
    for bad in ({"k": 1}, {"bootstrap": "mem:1"}, {"interval": 0}, {"nonsense": 1},
                {"max_levels": 65}, {"repair": True}):
        with pytest.raises(ConfigError):
            GosskipOptions.parse(bad, 3)


# -- the simulated ring ----------------------------------------------------------------


def _converge(sim: RingSimulation, goal: float, limit: int) -> int:
    for rounds in range(1, limit + 1):
        sim.round()
        if sim.link_accuracy() >= goal:
            return rounds
    raise AssertionError(f"link accuracy {sim.link_accuracy():.3f} after {limit} rounds")


def _lookups(sim: RingSimulation, count: int, seed: int) -> int:
    rng = random.Random(seed)
    live = sorted(sim.alive)
    worst = 0
    for _ in range(count):
        target = rng.randrange(RING)
        found, hops = sim.lookup(rng.choice(live), target)
        assert found == sim.successor_of(target)
        worst = max(worst, hops)
    return worst


def _kill_and_repair(sim: RingSimulation, limit: int) -> int:
    sim.kill(0.10)
    for rounds in range(1, limit + 1):
        sim.round()
        if sim.ring_formed():
            return rounds
    raise AssertionError(f"the ring did not re-form within {limit} rounds")


def test_a_256_node_ring_converges_routes_and_repairs() -> None:
    sim = RingSimulation(seed=11)
    sim.build(256)
    assert _converge(sim, 0.95, 40) <= 40
    assert _lookups(sim, 100, seed=1) <= 2 * math.log2(256)
    assert _kill_and_repair(sim, 10) <= 10
    assert _lookups(sim, 100, seed=2) <= 2 * math.log2(len(sim.alive))


@pytest.mark.slow
def test_a_1000_node_ring_converges_to_a_perfect_skip_list() -> None:
    sim = RingSimulation(seed=1)
    sim.build(1000)
    rounds = _converge(sim, 0.95, 40)
    assert rounds <= 25
    assert _lookups(sim, 300, seed=1) <= 2 * math.log2(1000)
    for _ in range(5):
        sim.round()
    assert sim.link_accuracy() >= 0.99


@pytest.mark.slow
def test_a_1000_node_ring_survives_a_tenth_failing_at_once() -> None:
    sim = RingSimulation(seed=2)
    sim.build(1000)
    _converge(sim, 0.95, 40)
    assert _kill_and_repair(sim, 10) <= 10
    assert _lookups(sim, 300, seed=3) <= 2 * math.log2(len(sim.alive))
    _converge(sim, 0.95, 30)


def test_remembered_nodes_are_ranked_by_the_overlays_metric() -> None:
    from ketten._core.acquaintances import Acquaintances

    rng = random.Random(8)
    keys = [rng.randbytes(32) for _ in range(16)]
    known = Acquaintances()
    for i, key in enumerate(keys):
        known.saw(key, f"n:{i}", now=1.0)
    target = rng.randbytes(32)

    def ring(node_id: int, goal: int) -> int:
        return key_distance(node_id.to_bytes(32, "big"), goal.to_bytes(32, "big"))

    on_ring = known.nearest(target, 3, since=0.0, distance=ring)
    assert [m.key for m in on_ring] == sorted(
        keys, key=lambda k: key_distance(Peer("", k).node_id, target))[:3]
    assert on_ring != known.nearest(target, 3, since=0.0)  # XOR ranks them otherwise


# -- the trio driver -------------------------------------------------------------------


async def _start(nursery: trio.Nursery, net: MemoryNetwork, plugins: pluggy.PluginManager,
                 seed: int, boot: list[str], **options: Any) -> tuple[ketten.Node, trio.CancelScope]:
    config = NodeConfig(identity=Identity.from_seed(bytes([seed]) * 32), overlay="gosskip",
                        options={"transport": {"network": net},
                                 "overlay": {"bootstrap": boot, **options}})

    async def run(task_status: trio.TaskStatus[tuple[ketten.Node, trio.CancelScope]]) -> None:
        with trio.CancelScope() as scope:
            async with open_node(config, plugins=plugins) as node:
                task_status.started((node, scope))
                await trio.sleep_forever()

    started: tuple[ketten.Node, trio.CancelScope] = await nursery.start(run)
    return started


@asynccontextmanager
async def _ring_of(plugins: pluggy.PluginManager, count: int, *, seed: int, first: int,
                   settle: float) -> AsyncIterator[list[ketten.Node]]:
    """``count`` nodes on a memory network (identity seeds from ``first``), each
    joining through the last, given ``settle`` seconds to form their ring."""
    net = MemoryNetwork(seed=seed)
    async with trio.open_nursery() as nursery:
        nodes: list[ketten.Node] = []
        for i in range(count):
            boot = [nodes[-1].address] if nodes else []
            nodes.append((await _start(nursery, net, plugins, first + i, boot))[0])
        await trio.sleep(settle)
        yield nodes
        nursery.cancel_scope.cancel()


def _overlay(node: ketten.Node) -> GosskipOverlay:
    assert isinstance(node.overlay, GosskipOverlay)
    return node.overlay


async def test_nodes_form_a_ring_and_answer_with_ring_successors(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    async with _ring_of(plugins, 12, seed=1, first=1, settle=30) as nodes:
        ring = sorted(nodes, key=lambda n: _overlay(n).ring.me.position)
        for i, node in enumerate(ring):
            assert _overlay(node).ring.link("right", 0) == _overlay(ring[(i + 1) % 12]).ring.me
        key = random.Random(4).randbytes(32)
        truth = sorted((Peer(n.address, n.identity.public_key) for n in nodes),
                       key=lambda p: key_distance(p.node_id, key))
        for node in nodes[:4]:
            assert await _overlay(node).closest(key, 3) == truth[:3]
        # Every node knows the whole 12-node ring: nearest needs no traffic.
        assert _overlay(nodes[0]).nearest(key, 3) == truth[:3]
        assert _overlay(nodes[0]).distance(truth[0].node_id, key) < _overlay(
            nodes[0]).distance(truth[1].node_id, key)
        assert _overlay(nodes[0]).statistics().levels >= 3

        # A malformed request fails alone; the node goes on answering.
        with pytest.raises(RemoteError):
            await nodes[1].request(nodes[0].address, "gosskip", {"op": "gossip", "level": 99,
                                                                 "order": 1, "entries": []})
        with pytest.raises(RemoteError):
            await nodes[1].request(nodes[0].address, "gosskip", {"op": "steal"})
        assert await _overlay(nodes[1]).closest(key, 3) == truth[:3]


def _known_keys(node: ketten.Node) -> set[bytes]:
    ring = _overlay(node).ring
    return {*ring.known(), *(c.key for c in ring.successors + ring.predecessors)}


async def test_contacts_a_gossiping_node_names_enter_only_once_their_address_answers(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    async with _ring_of(plugins, 6, seed=5, first=60, settle=20) as nodes:
        target, sender = nodes[0], nodes[1]
        me, named_by = _overlay(target).ring.me, _overlay(sender).ring.me
        rng = random.Random(5)
        fakes = []
        for address in ("mem:nobody-listens-here", nodes[2].address):
            # A key the sender's level-1 chain would carry on: the ring takes it as
            # this node's level-2 link, unless its address has to answer first.
            while True:
                fake = Contact(Peer(address, rng.randbytes(32)), rng.getrandbits(64))
                probe = Ring(me)
                probe.on_gossip(named_by, 1, [fake], now=0.0)
                if probe.link("right", 2) == fake:
                    break
            fakes.append(fake)
            await sender.request(target.address, "gosskip", encode_gossip(1, named_by.order,
                                                                            [fake]))
            assert fake.key not in _known_keys(target), "not even for a moment"
        await trio.sleep(10)
        assert not {f.key for f in fakes} & _known_keys(target)
        stats = _overlay(target).statistics()
        assert stats.claims_checked >= 2 and stats.claims_refuted >= 2
        assert sender.identity.public_key in _known_keys(target), "the sender itself is kept"


async def test_nodes_that_fall_silent_leave_the_ring(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=2)
    async with trio.open_nursery() as nursery:
        started = []
        for i in range(10):
            boot = [started[0][0].address] if started else []
            started.append(await _start(nursery, net, plugins, 40 + i, boot))
        await trio.sleep(20)
        for _node, scope in started[3:6]:
            scope.cancel()
        await trio.sleep(20)
        live = [node for node, _ in started[:3] + started[6:]]
        key = bytes(32)
        truth = sorted((Peer(n.address, n.identity.public_key) for n in live),
                       key=lambda p: key_distance(p.node_id, key))
        for node in live:
            assert await _overlay(node).closest(key, 10) == truth
            assert _overlay(node).nearest(key, 4) == truth[:4]
        nursery.cancel_scope.cancel()


async def test_unknown_options_are_refused(plugins: pluggy.PluginManager) -> None:
    config = NodeConfig(identity=Identity.from_seed(b"\x07" * 32), overlay="gosskip",
                        options={"transport": {"network": MemoryNetwork()},
                                 "overlay": {"fanout": 3}})
    with pytest.raises(ConfigError):
        async with open_node(config, plugins=plugins):
            pass


def gosskip(index: int, seeds: Sequence[str]) -> tuple[str, Mapping[str, Any]]:
    return "gosskip", {"bootstrap": list(seeds[-1:])}


@pytest.mark.slow
async def test_gosskip_conforms(plugins: pluggy.PluginManager,
                                autojump_clock: trio.testing.MockClock) -> None:
    await check_overlay(gosskip, nodes=40, seed=3, plugins=plugins, distance=key_distance)


def test_the_jepsen_command_runs_on_gosskip(capsys: pytest.CaptureFixture[str]) -> None:
    from ketten.testing.jepsen import main

    assert main(["--seeds", "5", "--family", "joins", "--overlay", "gosskip",
                 "--publishes", "60"]) == 0
    out = capsys.readouterr().out
    assert "gosskip  seed 5: ok" in out and "all 1 runs passed" in out
    with pytest.raises(SystemExit):
        main(["--overlay", "chord"])
    assert "gosskip, ipfs, both or all" in capsys.readouterr().err
