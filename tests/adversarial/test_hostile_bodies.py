"""Hostile message bodies against live nodes on loopback TCP.

An authenticated peer sends every service of a node the bodies honest nodes
sent it, changed at random (types, sizes, missing and extra fields, flipped
bytes, huge lists, out-of-range integers). Each request must end with an
answer or an error reply (or the connection closed), none may reach a
handler as an exception other than the typed errors (``internal_errors``
stays 0), the memory the flood leaves stays bounded, and the cluster must go on
publishing and reading.
"""

from __future__ import annotations

from typing import Any

import pluggy
import pytest
import trio
from hostile import HostilePeer, mutations, retained_memory

from ketten import Node, criterion_key
from ketten.testing import open_cluster
from ketten.wire import decode_message

_SERVICES_SEEN_LEAST = {"offer", "append", "locate"}


async def _honest_traffic(monkeypatch: pytest.MonkeyPatch,
                          ) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """Record the bodies of every request and message any node takes."""
    requests: list[tuple[str, Any]] = []
    messages: list[tuple[str, Any]] = []
    handle_request, handle_message = Node.handle_request, Node.handle_message

    async def record_request(self: Node, peer: Any, data: bytes) -> bytes:
        requests.append(decode_message(data))
        return await handle_request(self, peer, data)

    async def record_message(self: Node, peer: Any, data: bytes) -> None:
        messages.append(decode_message(data))
        await handle_message(self, peer, data)

    monkeypatch.setattr(Node, "handle_request", record_request)
    monkeypatch.setattr(Node, "handle_message", record_message)
    return requests, messages


@pytest.mark.parametrize(("overlay", "seed", "count"), [
    ("static", 0, 1500), ("kademlia", 1, 1500), ("ipfs", 2, 1500),
    *(pytest.param(o, s, 6000, marks=pytest.mark.slow)
      for o, s in [("static", 2), ("static", 3), ("kademlia", 2), ("kademlia", 3), ("ipfs", 4)])])
async def test_mutated_bodies_end_one_request_never_the_node(
    plugins: pluggy.PluginManager, monkeypatch: pytest.MonkeyPatch, overlay: str, seed: int,
    count: int,
) -> None:
    requests, messages = await _honest_traffic(monkeypatch)
    # On ipfs every read of a node that is no broker goes through the providers.
    extra = {"options": {"overlay": {"read_above": 0}}} if overlay == "ipfs" else {}
    async with open_cluster(4, plugins=plugins, transport="tcp", overlay=overlay,
                            request_timeout=2.0, settle=1.0, seed=seed, **extra) as c:
        key = criterion_key("hostile")
        victim = c.brokers(key)[0]
        writer = c.nodes[c.others(key)[0]]
        for i in range(6):
            await writer.publish(key, b"honest %d" % i)
        await writer.read(key)
        async with writer.subscribe(key, start=0) as feed:
            async for _event in feed:
                break
        assert {s for s, _ in requests} >= _SERVICES_SEEN_LEAST, {s for s, _ in requests}
        if overlay == "ipfs":
            ops = {body.get("op") for s, body in requests if s == "ipfs"}
            assert ops >= {"provide", "providers", "tip", "have", "want"}, ops
        by_service: dict[str, list[tuple[str, Any]]] = {}
        for service, body in requests:
            by_service.setdefault(service, []).append((service, body))
        sample = [pair for pairs in by_service.values() for pair in pairs[:40]]
        monkeypatch.undo()

        hostile = HostilePeer(c.nodes[victim].address)
        outcomes: dict[str, int] = {}
        # Made before the measured block: the allocations it counts are the nodes' (and
        # the sending), and tracing them would make the mutating itself several times slower.
        bodies = list(mutations(sample, count, seed))
        notes = list(mutations(messages or [("elect", {"c": key})], count // 5, seed))
        with retained_memory() as kept:
            for service, body in bodies:
                kind, _ = await hostile.request(service, body, timeout=10.0)
                outcomes[kind] = outcomes.get(kind, 0) + 1
            for service, body in notes:
                await hostile.message(service, body)
        # No body inflates on decoding (the 400-byte CBOR bomb took 320 MiB once), and
        # what the flood leaves is bounded by the caches' sizes (1,500 bodies: ~0.6 MB).
        assert kept.peak < 32 << 20 and kept.bytes < 8 << 20, kept
        await hostile.aclose()

        stats = c.nodes[victim].statistics()
        assert stats.internal_errors == 0, stats
        assert outcomes.get("reply", 0) + outcomes.get("error", 0) > 0, outcomes
        # The honest cluster goes on: publishes succeed and every node reads them all.
        with trio.fail_after(60):
            for i in range(6, 10):
                await writer.publish(key, b"honest %d" % i, deadline=20.0)
            for node in c.nodes.values():
                events = await node.read(key)
                assert [e.payload for e in events if e.payload.startswith(b"honest")] == [
                    b"honest %d" % i for i in range(10)]
        for node in c.nodes.values():
            assert node.statistics().internal_errors == 0, node.statistics()
