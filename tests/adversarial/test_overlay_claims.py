"""Peers that claim addresses that are not theirs, against Kademlia and GosSkip
nodes on loopback TCP. A requester's key is proven by the handshake but its
address is only claimed: it enters a routing table (a ring's lists) only once
a request there is answered with its key. A liar claiming an honest node's
address, or an address where nothing listens, never enters; an honest
newcomer does, and the honest node keeps its own entry."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import trio
from hostile import HostilePeer

import ketten
from ketten import Identity, NodeConfig, criterion_key, open_node
from ketten.plugins.gosskip import GosskipOverlay
from ketten.plugins.kademlia import KademliaOverlay

PM = ketten.plugin_manager()


def _nowhere() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@asynccontextmanager
async def overlay_node(overlay: str, boot: list[str]) -> AsyncIterator[ketten.Node]:
    options: dict[str, Any] = {"bootstrap": boot, "rpc_timeout": 0.5}
    if overlay == "gosskip":
        options["interval"] = 0.2
    config = NodeConfig(identity=Identity.generate(), transport="tcp", overlay=overlay,
                        request_timeout=2.0, options={"overlay": options})
    async with open_node(config, plugins=PM) as node:
        yield node


def contacts_of(node: ketten.Node) -> dict[bytes, str]:
    """Every node ``node``'s routing table or ring lists name, by key."""
    overlay = node.overlay
    if isinstance(overlay, KademliaOverlay):
        return {c.peer.public_key: c.peer.address for c in overlay.table.contacts()}
    assert isinstance(overlay, GosskipOverlay)
    ring = overlay.ring
    found = {key: c.peer.address for key, c in ring.known().items()}
    for contact in ring.successors + ring.predecessors:
        found[contact.key] = contact.peer.address
    return found


def lies(overlay: str) -> list[tuple[str, Any]]:
    """Requests a liar sends: each would let an honest sender in."""
    if overlay == "kademlia":
        return [("kad", {"op": "ping"}),
                ("kad", {"op": "find", "target": criterion_key("anything")})]
    return [("gosskip", {"op": "gossip", "level": level, "order": order, "entries": []})
            for level in range(4) for order in (1, 1 << 62, (1 << 64) - 2)]


@pytest.mark.parametrize("overlay", ["kademlia", "gosskip"])
@pytest.mark.parametrize("whose", ["an honest node's", "nobody's"])
async def test_a_liar_claiming_an_address_not_its_own_never_enters(
        overlay: str, whose: str) -> None:
    async with AsyncExitStack() as stack:
        honest: list[ketten.Node] = []
        for _ in range(3):
            boot = [honest[0].address] if honest else []
            honest.append(await stack.enter_async_context(overlay_node(overlay, boot)))
        target, victim = honest[0], honest[1]
        with trio.fail_after(10):
            while contacts_of(target).get(victim.identity.public_key) != victim.address:
                await trio.sleep(0.05)
        claimed = victim.address if whose == "an honest node's" else _nowhere()
        liar = HostilePeer(target.address, claimed=claimed)
        for _ in range(3):
            for service, body in lies(overlay):
                kind, _ = await liar.request(service, body, timeout=5)
                assert kind == "reply"
                # Not even for a moment (a failed request would drop it later).
                assert liar.identity.public_key not in contacts_of(target)
            await trio.sleep(0.2)
        await trio.sleep(1.5)  # time for the check (rpc_timeout 0.5 s, retransmitted)
        known = contacts_of(target)
        assert liar.identity.public_key not in known
        assert known.get(victim.identity.public_key) == victim.address
        stats = target.overlay.statistics()  # type: ignore[union-attr]
        assert stats.claims_refuted >= 1
        assert stats.claims_checked <= 3 + 1  # once per claim, not once per request
        # An honest newcomer still enters, at its own address.
        newcomer = await stack.enter_async_context(overlay_node(overlay, [target.address]))
        with trio.fail_after(10):
            while contacts_of(target).get(newcomer.identity.public_key) != newcomer.address:
                await trio.sleep(0.05)
        await target.publish(criterion_key("after the liar"), b"still served", deadline=10)
        await liar.aclose()


async def test_contacts_a_proven_gosskip_node_names_for_others_enter_only_once_they_answer(
) -> None:
    """A ring member (its own address proven) gossips chains of made-up contacts: a
    key at an address where nothing listens, and a key at an honest node's address.
    Neither enters the target's lists; each claim is checked once and refuted."""
    from ketten.interfaces import Peer
    from ketten.plugins.gosskip._messages import encode_gossip
    from ketten.plugins.gosskip._names import Contact
    from ketten.plugins.gosskip._ring import Ring

    async with AsyncExitStack() as stack:
        honest: list[ketten.Node] = []
        for _ in range(3):
            boot = [honest[0].address] if honest else []
            honest.append(await stack.enter_async_context(overlay_node("gosskip", boot)))
        target, sender, victim = honest
        assert isinstance(target.overlay, GosskipOverlay)
        assert isinstance(sender.overlay, GosskipOverlay)
        with trio.fail_after(10):
            while sender.identity.public_key not in contacts_of(target):
                await trio.sleep(0.05)
        me, named_by = target.overlay.ring.me, sender.overlay.ring.me
        fakes = []
        for address in (_nowhere(), victim.address):
            while True:  # a contact the sender's level-1 chain would carry on
                fake = Contact(Peer(address, Identity.generate().public_key), 1 << 40)
                probe = Ring(me)
                probe.on_gossip(named_by, 1, [fake], now=0.0)
                if probe.link("right", 2) == fake:
                    break
            fakes.append(fake)
            for _ in range(3):
                await sender.request(target.address, "gosskip",
                                     encode_gossip(1, named_by.order, [fake]))
                assert fake.key not in contacts_of(target), "not even for a moment"
        await trio.sleep(1.5)  # time for the checks (rpc_timeout 0.5 s, retransmitted)
        known = contacts_of(target)
        assert not {f.key for f in fakes} & set(known)
        assert known.get(victim.identity.public_key, victim.address) == victim.address
        stats = target.overlay.statistics()
        assert stats.claims_refuted >= 2
        await target.publish(criterion_key("after the made-up contacts"), b"served", deadline=10)
