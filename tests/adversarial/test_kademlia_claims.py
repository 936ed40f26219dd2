"""Peers that claim addresses that are not theirs, against Kademlia nodes on
loopback TCP. A requester's key is proven by the handshake but its address is
only claimed: it enters a routing table only once a ping there is answered
with its key. A liar claiming an honest node's address, or an address where
nothing listens, never enters; an honest newcomer does, and the honest node
keeps its own entry."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio
from hostile import HostilePeer

import ketten
from ketten import Identity, NodeConfig, criterion_key, open_node
from ketten.plugins.kademlia import KademliaOverlay

PM = ketten.plugin_manager()


def _nowhere() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@asynccontextmanager
async def kad_node(boot: list[str]) -> AsyncIterator[ketten.Node]:
    config = NodeConfig(identity=Identity.generate(), transport="tcp", overlay="kademlia",
                        request_timeout=2.0,
                        options={"overlay": {"bootstrap": boot, "rpc_timeout": 0.5}})
    async with open_node(config, plugins=PM) as node:
        yield node


def table_of(node: ketten.Node) -> dict[bytes, str]:
    overlay = node.overlay
    assert isinstance(overlay, KademliaOverlay)
    return {c.peer.public_key: c.peer.address for c in overlay.table.contacts()}


@pytest.mark.parametrize("whose", ["an honest node's", "nobody's"])
async def test_a_liar_claiming_an_address_not_its_own_never_enters_the_table(
        whose: str) -> None:
    async with AsyncExitStack() as stack:
        honest: list[ketten.Node] = []
        for _ in range(3):
            boot = [honest[0].address] if honest else []
            honest.append(await stack.enter_async_context(kad_node(boot)))
        target, victim = honest[0], honest[1]
        claimed = victim.address if whose == "an honest node's" else _nowhere()
        liar = HostilePeer(target.address, claimed=claimed)
        find = {"op": "find", "target": criterion_key("anything")}
        for _ in range(5):
            kind, body = await liar.request("kad", {"op": "ping"}, timeout=5)
            assert kind == "reply" and b"pong" in body
            kind, _ = await liar.request("kad", find, timeout=5)
            assert kind == "reply"
            await trio.sleep(0.2)
        await trio.sleep(1.5)  # time for the check (rpc_timeout 0.5 s, retransmitted)
        table = table_of(target)
        assert liar.identity.public_key not in table
        assert table.get(victim.identity.public_key) == victim.address
        overlay = target.overlay
        assert isinstance(overlay, KademliaOverlay)
        stats = overlay.statistics()
        assert stats.claims_refuted >= 1
        assert stats.claims_checked <= 3 + 1  # once per claim, not once per request
        # An honest newcomer still enters, at its own address.
        newcomer = await stack.enter_async_context(kad_node([target.address]))
        with trio.fail_after(10):
            while table_of(target).get(newcomer.identity.public_key) != newcomer.address:
                await trio.sleep(0.05)
        await target.publish(criterion_key("after the liar"), b"still served", deadline=10)
        await liar.aclose()
