"""One liar among 50 Kademlia nodes on loopback TCP: every find it answers names
as many made-up contacts as it may (up to 256), at addresses where nothing
answers. Most honest nodes have the liar in their tables; publishes to new and to existing
criteria from random honest nodes each succeed within their deadline."""

from __future__ import annotations

import random
import socket
from collections.abc import Mapping
from typing import Any

import pytest
import trio

import ketten
from ketten import Identity, NodeConfig, open_node
from ketten.interfaces import Peer
from ketten.plugins.kademlia import MAX_REPLY_CONTACTS, KademliaOptions, KademliaOverlay

NODES = 50
DEADLINE = 10.0


def _dead_addresses(count: int) -> list[str]:
    """Loopback addresses where nothing listens (their ports were free just now)."""
    held = [socket.socket() for _ in range(count)]
    try:
        for sock in held:
            sock.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{sock.getsockname()[1]}" for sock in held]
    finally:
        for sock in held:
            sock.close()


_NOWHERE = _dead_addresses(MAX_REPLY_CONTACTS)


class TcpLiar(KademliaOverlay):
    """Answers every find with the most contacts it may name, none of them there."""

    async def _serve(self, peer: Peer, body: Any) -> Any:
        if isinstance(body, dict) and body.get("op") == "find":
            rng = random.Random(body.get("target"))
            count = body.get("count", 0)
            count = min(MAX_REPLY_CONTACTS, max(self.options.k,
                                                count if type(count) is int else 0))
            return {"nodes": [[_NOWHERE[i], Identity.from_seed(rng.randbytes(32)).public_key]
                              for i in range(count)]}
        return await super()._serve(peer, body)


class Liars:
    @ketten.hookimpl
    def ketten_plugin_names(self) -> Mapping[str, list[str]]:
        return {"overlay": ["tcp-liar"]}

    @ketten.hookimpl
    def ketten_make_overlay(self, name: str, options: Mapping[str, Any],
                            node: ketten.Node) -> KademliaOverlay | None:
        if name != "tcp-liar":
            return None
        return TcpLiar(node=node, options=KademliaOptions.parse(options, 3))


async def _start(nursery: trio.Nursery, plugins: Any, index: int, overlay: str,
                 boot: list[str]) -> ketten.Node:
    async def run(task_status: trio.TaskStatus[ketten.Node]) -> None:
        config = NodeConfig(identity=Identity.from_seed(bytes([index + 1]) * 32),
                            transport="tcp", overlay=overlay,
                            options={"overlay": {"bootstrap": boot}})
        async with open_node(config, plugins=plugins) as node:
            task_status.started(node)
            await trio.sleep_forever()

    node: ketten.Node = await nursery.start(run)
    return node


@pytest.mark.slow
async def test_a_tcp_liar_among_fifty_costs_no_publish() -> None:
    plugins = ketten.plugin_manager(extra=(Liars(),))
    async with trio.open_nursery() as nursery:
        honest: list[ketten.Node] = []
        for index in range(NODES - 1):
            boot = [honest[0].address] if honest else []
            honest.append(await _start(nursery, plugins, index, "kademlia", boot))
            if index == NODES // 2:
                liar = await _start(nursery, plugins, 200, "tcp-liar", [honest[0].address])
        liar_id = int.from_bytes(liar.identity.node_id, "big")
        knowing = 0
        for node in honest:  # every honest node hears from the liar (full buckets may keep it out)
            overlay = node.overlay
            assert isinstance(overlay, KademliaOverlay)
            await overlay._rpc(liar.address, {"op": "ping"})
            knowing += overlay.table.get(liar_id) is not None
        assert knowing >= len(honest) // 2, knowing
        rng = random.Random(7)
        names = [f"liar tcp {i}" for i in range(20)]
        slowest = 0.0
        for name in [*names, *(rng.choice(names) for _ in range(20))]:
            node = rng.choice(honest)
            started = trio.current_time()
            with trio.fail_after(DEADLINE + 2):
                await node.publish(name, b"honest", deadline=DEADLINE)
            slowest = max(slowest, trio.current_time() - started)
        assert slowest < DEADLINE
        served = liar.overlay.statistics().requests_served  # type: ignore[union-attr]
        assert served > 0  # the lookups did ask the liar
        nursery.cancel_scope.cancel()
