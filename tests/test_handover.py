"""Nodes that join near a chain's key takes the hand-over of the chains there
before its "no such chain" counts: a read through it never comes back empty for
a chain with acknowledged events, and no second chain is started beside it."""

from __future__ import annotations

import pytest
import trio

from ketten import Identity, Node, NodeConfig, criterion_key, open_node
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
