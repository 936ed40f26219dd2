"""Nodes that join near a chain's key takes the hand-over of the chains there
before its "no such chain" counts: a read through it never comes back empty for
a chain with acknowledged events, and no second chain is started beside it."""

from __future__ import annotations

import pytest
import trio

from ketten import Identity, Node, NodeConfig, criterion_key, open_node
from ketten._core.handover import MAX_HANDED, MAX_PAGES, MAX_WANTED, HandoverState, Page
from ketten._core.messages import HandoverReply
from ketten.adapters.memory import MemoryNetwork
from ketten.errors import PublishOutcomeUnknown, QuorumUnavailable, RemoteError
from ketten.plugins.memory_store import MemoryBacking
from ketten.testing import deterministic_identity

KEY_NAME = "orders"


def config(net: MemoryNetwork, identity: Identity, address: str) -> NodeConfig:
    return NodeConfig(
        identity=identity, overlay="static", request_timeout=0.5,
        options={"transport": {"network": net, "address": address},
                 "store": {"backing": MemoryBacking()},
                 "overlay": {"seeds": ["h:0"], "interval": 0.5},
                 "replication": {"anti_entropy": 1.0}})


def distance(identity: Identity, key: bytes) -> int:
    return int.from_bytes(identity.node_id, "big") ^ int.from_bytes(key, "big")


def newcomers_near(key: bytes, closer_than: int, count: int) -> list[Identity]:
    found = [identity for identity in (deterministic_identity(72, i) for i in range(20_000))
             if distance(identity, key) < closer_than]
    assert len(found) >= count, "not enough identities near the key"
    return found[:count]


async def start(nursery: trio.Nursery, net: MemoryNetwork, identity: Identity, address: str,
                plugins) -> Node:
    async def run(*, task_status: trio.TaskStatus[Node]) -> None:
        async with open_node(config(net, identity, address), plugins=plugins) as node:
            task_status.started(node)
            await trio.sleep_forever()

    node: Node = await nursery.start(run)
    return node


async def test_newcomers_cut_off_from_the_brokers_never_read_an_empty_chain(
        plugins, autojump_clock) -> None:
    net = MemoryNetwork()
    identities = [deterministic_identity(71, i) for i in range(5)]
    async with trio.open_nursery() as nursery:
        nodes = [await start(nursery, net, identities[i], f"h:{i}", plugins) for i in range(5)]
        await trio.sleep(3.0)
        key = criterion_key(KEY_NAME)
        ranked = sorted(range(5), key=lambda i: distance(identities[i], key))
        brokers, others = ranked[:3], ranked[3:]
        for seq in range(5):  # published through a broker: the others never hear of it
            await nodes[brokers[0]].publish(KEY_NAME, f"event {seq}".encode(), command=seq + 1)
        # Two newcomers, both nearer to the key than every broker.
        newcomers = newcomers_near(key, distance(identities[ranked[0]], key), 2)
        joined = [await start(nursery, net, identity, f"h:{9 + n}", plugins)
                  for n, identity in enumerate(newcomers)]
        await trio.sleep(4.0)
        net.cut([f"h:{i}" for i in brokers])
        await trio.sleep(1.0)
        # The newcomers, now the key's two nearest nodes, and two nodes that never
        # held the chain are on one side: a majority of the key's nearest r.
        for node in joined:
            with pytest.raises(QuorumUnavailable):
                await node.read(KEY_NAME, deadline=3.0)
        with pytest.raises((QuorumUnavailable, PublishOutcomeUnknown)):
            await joined[0].publish(KEY_NAME, b"beside the chain", command=99, deadline=3.0)
        for index in others:
            with pytest.raises(QuorumUnavailable):
                await nodes[index].read(KEY_NAME, deadline=3.0)
        net.heal()
        await trio.sleep(10.0)
        payloads = [e.payload for e in await joined[1].read(KEY_NAME)]
        # The publish cut off may still be adopted (its outcome was unknown), but only
        # after the acknowledged events, in the one chain.
        assert payloads[:5] == [f"event {s}".encode() for s in range(5)]
        assert payloads[5:] in ([], [b"beside the chain"])
        nursery.cancel_scope.cancel()


async def test_hand_over_pages_are_rate_limited_per_peer(plugins, autojump_clock) -> None:
    net = MemoryNetwork()
    identities = [deterministic_identity(73, i) for i in range(3)]
    async with trio.open_nursery() as nursery:
        nodes = [await start(nursery, net, identities[i], f"h:{i}", plugins) for i in range(3)]
        await trio.sleep(2.0)
        await nodes[0].publish(KEY_NAME, b"one", command=1)
        answered = refused = 0
        began = trio.current_time()
        for _ in range(300):
            try:
                _, body = await nodes[1].request("h:0", "handover", {"a": b""}, timeout=1.0)
            except RemoteError as exc:
                assert "hand-over" in str(exc)
                refused += 1
            else:
                assert HandoverReply.from_wire(body).more is False
                answered += 1
        # A burst of 128, then 8 a second.
        assert refused > 0
        assert answered <= 128 + 8 * (trio.current_time() - began) + 1
        nursery.cancel_scope.cancel()


# -- the sans-IO core ----------------------------------------------------------

def page(*criteria: bytes, more: bool) -> HandoverReply:
    return HandoverReply(criteria=criteria, more=more)


def test_a_key_is_settled_once_a_majority_of_its_nearest_handed_over() -> None:
    state: HandoverState[str] = HandoverState()
    near = [(b"a", "A"), (b"b", "B"), (b"c", "C")]
    assert not state.settled(near)
    assert state.wanting
    assert sorted(state.round([])) == near  # the wanted are asked in the next round
    assert not state.wanting
    state.on_reply(b"a", b"", page(more=False))
    assert not state.settled(near)
    state.on_reply(b"b", b"", page(b"k1", more=False))
    assert state.settled(near)
    assert state.round(near) == [(b"c", "C")]  # the handed are not asked again
    assert not state.settled([])  # nobody near: nothing to count on


def test_pages_are_followed_until_done_and_only_forward() -> None:
    state: HandoverState[str] = HandoverState()
    state.round([(b"a", "A")])
    first = state.on_reply(b"a", b"", page(b"k1", b"k2", more=True))
    assert first == Page((b"k1", b"k2"), b"k2", handed=False)
    # A peer that says "more" without moving past where it was asked is done with.
    stuck = state.on_reply(b"a", b"k2", page(b"k1", b"k2", more=True))
    assert stuck == Page((), None, handed=False)
    assert not state.handed(b"a")
    last = state.on_reply(b"a", b"k2", page(b"k3", more=False))
    assert last == Page((b"k3",), None, handed=True)
    assert state.handed(b"a")


def test_a_peer_gives_at_most_max_pages_in_a_round() -> None:
    state: HandoverState[str] = HandoverState()
    state.round([(b"a", "A")])
    after = b""
    for i in range(MAX_PAGES):
        key = i.to_bytes(4, "big") + b"\x01"
        result = state.on_reply(b"a", after, page(key, more=True))
        if result.after is None:
            break
        after = result.after
    assert i == MAX_PAGES - 1 and result.after is None and not result.handed
    state.round([(b"a", "A")])  # a new round asks it again, from the start
    assert state.on_reply(b"a", b"", page(b"\x00", more=True)).after == b"\x00"


def test_the_wanted_and_the_handed_are_bounded() -> None:
    state: HandoverState[int] = HandoverState()
    state.settled([(i.to_bytes(4, "big"), i) for i in range(MAX_WANTED * 3)])
    assert len(state.round([])) == MAX_WANTED
    for i in range(MAX_HANDED + 10):
        state.on_reply(i.to_bytes(4, "big"), b"", page(more=False))
    assert not state.handed((0).to_bytes(4, "big"))  # the oldest forgotten
    assert state.handed((MAX_HANDED + 9).to_bytes(4, "big"))
