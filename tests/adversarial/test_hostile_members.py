"""Sybils join a static network on loopback TCP: twelve fresh identities and one
with a ticket from the wrong operator. Membership is admitted, not announced:
none of them becomes a member or a broker, and the honest nodes publish."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import trio
from hostile import HostilePeer

import ketten
from ketten import ConfigError, Identity, NodeConfig, criterion_key, open_node
from ketten.plugins.static_overlay import Admission, admission_ticket

PM = ketten.plugin_manager()


@asynccontextmanager
async def static_node(identity: Identity, seeds: list[str],
                      **overlay: Any) -> AsyncIterator[ketten.Node]:
    config = NodeConfig(identity=identity, transport="tcp", overlay="static",
                        request_timeout=2.0,
                        options={"overlay": {"seeds": seeds, "interval": 0.2, **overlay}})
    async with open_node(config, plugins=PM) as node:
        yield node


async def kademlia_nodes(stack: AsyncExitStack, *, request_timeout: float,
                         count: int = 3) -> list[ketten.Node]:
    """``count`` nodes on loopback TCP with the kademlia overlay, the first their seed."""
    nodes: list[ketten.Node] = []
    for _ in range(count):
        boot = [nodes[0].address] if nodes else []
        config = NodeConfig(identity=Identity.generate(), transport="tcp", overlay="kademlia",
                            request_timeout=request_timeout,
                            options={"overlay": {"bootstrap": boot}})
        nodes.append(await stack.enter_async_context(open_node(config, plugins=PM)))
    return nodes


def close_pair() -> tuple[Identity, Identity]:
    """Two identities whose node ids share their first byte: some keys have both as
    their two nearest nodes."""
    first: dict[int, Identity] = {}
    while True:
        ident = Identity.generate()
        other = first.setdefault(ident.node_id[0], ident)
        if other is not ident:
            return other, ident


def names_nearest_to(strangers: list[Identity], honest: list[Identity],
                     count: int) -> list[str]:
    """``count`` criterion names whose two nearest nodes (by XOR) are strangers."""
    ids = {int.from_bytes(i.node_id, "big"): i in strangers for i in strangers + honest}
    names = []
    for n in range(100_000):
        goal = int.from_bytes(criterion_key(f"near-{n}"), "big")
        if all(ids[node] for node in sorted(ids, key=lambda node: node ^ goal)[:2]):
            names.append(f"near-{n}")
            if len(names) == count:
                return names
    raise AssertionError("no such names")


async def test_sybils_never_become_members_or_brokers() -> None:
    operator, impostor = Identity.generate(), Identity.generate()
    rules = {"operators": [operator.public_key.hex()]}
    honest_ids = [Identity.generate() for _ in range(3)]
    async with AsyncExitStack() as stack:
        honest: list[ketten.Node] = []
        for ident in honest_ids:
            ticket = admission_ticket(operator, ident.public_key).hex()
            seeds = [honest[0].address] if honest else []
            honest.append(await stack.enter_async_context(
                static_node(ident, seeds, admission=ticket, **rules)))
        sybil_ids = [Identity.generate() for _ in range(13)]
        async with AsyncExitStack() as sybil_stack:
            sybils = [await sybil_stack.enter_async_context(
                static_node(ident, [honest[0].address])) for ident in sybil_ids[:12]]
            wrong = sybil_ids[12]
            sybils.append(await sybil_stack.enter_async_context(static_node(
                wrong, [honest[1].address],
                admission=admission_ticket(impostor, wrong.public_key).hex())))
            await trio.sleep(1.5)
            keys = {n.identity.public_key for n in honest}
            for node in honest:
                assert node.overlay is not None
                members = {p.public_key for p in node.overlay.members()}
                assert members == keys - {node.identity.public_key}
            assert sum(n.overlay.statistics().refused for n in honest) >= 13
            for i in range(10):
                key = criterion_key(f"admitted {i}")
                await honest[i % 3].publish(key, b"only honest brokers")
                config = await honest[i % 3].configuration(key)
                assert config is not None and config.voter_keys() <= keys
        # The sybils are gone. They stand for nobody near a key: new chains whose
        # two nearest nodes are sybils are created on the honest members.
        for name in names_nearest_to(sybil_ids, honest_ids, 3):
            await honest[0].publish(name, b"near sybils", deadline=10)


def test_admission_rules() -> None:
    operator, member = Identity.generate(), Identity.generate()
    ticket = admission_ticket(operator, member.public_key)
    assert Admission().admits(member.public_key, None)  # open membership
    listed = Admission(keys=frozenset({member.public_key}))
    assert listed.admits(member.public_key, None)
    assert not listed.admits(operator.public_key, None)
    signed = Admission(operators=(operator.public_key,))
    assert signed.admits(member.public_key, ticket)
    assert not signed.admits(operator.public_key, ticket)  # a ticket names one key
    assert not signed.admits(member.public_key, b"x" * 64)
    assert not signed.admits(member.public_key, "not bytes")


@pytest.mark.parametrize("options", [
    {"operators": "abc"}, {"admit": ["zz" * 32]}, {"admit": ["ab" * 31]},
    {"admission": "12"}])
async def test_bad_admission_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="overlay option"):
        async with static_node(Identity.generate(), [], **options):
            pass


async def test_a_peer_claiming_a_members_address_takes_nothing_from_it() -> None:
    """A hello whose handshake claims another member's address (and one that
    claims a member moved) changes no member: only an answer at the address
    proves it."""
    async with AsyncExitStack() as stack:
        honest: list[ketten.Node] = []
        for _ in range(3):
            seeds = [honest[0].address] if honest else []
            honest.append(await stack.enter_async_context(
                static_node(Identity.generate(), seeds)))
        await trio.sleep(1.0)
        victim, target = honest[1], honest[0]
        liar = HostilePeer(target.address, claimed=victim.address)
        hello = {"op": "hello", "r": 3, "known": []}
        for _ in range(5):
            kind, _body = await liar.request("static", hello, timeout=5)
            assert kind == "reply"
            await trio.sleep(0.3)
        assert target.overlay is not None
        members = {p.public_key: p.address for p in target.overlay.members()}
        assert members.get(victim.identity.public_key) == victim.address
        assert members.get(liar.identity.public_key) != victim.address
        for i in range(6):
            key = criterion_key(f"claimed {i}")
            await target.publish(key, b"still three brokers", deadline=10)
            config = await target.configuration(key)
            assert config is not None
            assert liar.identity.public_key not in config.voter_keys()
        await liar.aclose()


async def test_false_claims_do_not_hold_back_new_chains_near_the_claimants() -> None:
    """A peer whose handshake claims another node's address, and one that claims an
    address nobody listens at, each send a few requests. The node checks each claim
    once, forgets both, and creates new chains whose nearest nodes are the claimants."""
    async with AsyncExitStack() as stack:
        nodes = await kademlia_nodes(stack, request_timeout=2.0)
        await trio.sleep(1.0)
        target, victim = nodes[0], nodes[1]
        liar_id, nowhere_id = close_pair()
        liar = HostilePeer(target.address, identity=liar_id, claimed=victim.address)
        nowhere = HostilePeer(target.address, identity=nowhere_id,
                              claimed="127.0.0.1:9")  # nobody listens there
        for _ in range(3):
            for peer in (liar, nowhere):
                kind, _body = await peer.request("kad", {"op": "ping"}, timeout=5)
                assert kind == "reply"
        await trio.sleep(2.0)
        # New chains whose keys are nearer to both false claimants than to any honest
        # node are created: the claims were checked and forgotten, so they do not
        # stand for two silent nodes among the three nearest.
        claimants = [liar.identity, nowhere.identity]
        for name in names_nearest_to(claimants, [n.identity for n in nodes], 2):
            await target.publish(name, b"x", deadline=10)
        assert target.replication_statistics().claims_refuted == 2
        for peer in (liar, nowhere):
            await peer.aclose()


@asynccontextmanager
async def silent_listener() -> AsyncIterator[str]:
    """An address that accepts connections and never says a word."""
    held: list[trio.SocketStream] = []

    async def hold(stream: trio.SocketStream) -> None:
        held.append(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, hold, 0,
                                                          host="127.0.0.1"))
        yield f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        nursery.cancel_scope.cancel()


async def test_made_up_keys_at_silent_addresses_do_not_hold_back_new_chains() -> None:
    """Twenty made-up keys claim two addresses that accept connections and never
    answer, one request each. One address holds one node, and a claim whose check
    got no answer counts only a little longer: chains nearest to the claimants are
    created within seconds, not after the ten-minute memory."""
    async with AsyncExitStack() as stack:
        nodes = await kademlia_nodes(stack, request_timeout=1.0)
        silent = [await stack.enter_async_context(silent_listener()) for _ in range(2)]
        await trio.sleep(1.0)
        target = nodes[0]
        last = close_pair()  # the last claimant of each address: some keys have both nearest
        for address, final in zip(silent, last, strict=True):
            for n in range(10):
                claimant = HostilePeer(target.address, claimed=address,
                                       identity=final if n == 9 else None)
                kind, _body = await claimant.request("kad", {"op": "ping"}, timeout=5)
                assert kind == "reply"
                await claimant.aclose()
        await trio.sleep(3.0)  # the checks time out (0.5 s), the grace (2 s) passes
        with trio.fail_after(20):
            for name in names_nearest_to(list(last), [n.identity for n in nodes], 2):
                await target.publish(name, b"x", deadline=10)


async def test_made_up_keys_at_silent_addresses_never_become_static_members() -> None:
    """Sixty fresh identities greet a node of an open static network, each claiming an
    address where nobody answers: the node dials each claim back, and none becomes a
    member, is stored, or is greeted round after round; an honest node still joins."""
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(static_node(Identity.generate(), []))
        silent = await stack.enter_async_context(silent_listener())
        hello = {"op": "hello", "r": 3, "known": []}
        for n in range(60):
            claimed = silent if n % 2 else f"127.0.0.1:{9 + n}"  # nobody listens there
            sybil = HostilePeer(first.address, claimed=claimed)
            kind, _body = await sybil.request("static", hello, timeout=5)
            assert kind == "reply"
            await sybil.aclose()
        second = await stack.enter_async_context(static_node(Identity.generate(),
                                                             [first.address]))
        await trio.sleep(3.0)
        assert first.overlay is not None
        members = {p.public_key for p in first.overlay.members()}
        assert members == {second.identity.public_key}
        stats = first.overlay.statistics()
        assert stats.candidates == 0
        sent = stats.hellos_sent
        await trio.sleep(1.0)
        assert first.overlay.statistics().hellos_sent - sent < 20  # about 5 rounds of one
