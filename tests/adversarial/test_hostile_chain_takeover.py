"""A stranger with a fresh key tries to take over chains on loopback TCP: appends
and vote requests that carry a configuration naming itself the only voter, with
the highest term the wire can carry, and a forged event marked committed. The
brokers hold a configuration, so the stranger's own word counts for nothing: the
chain keeps its voters, its term and its events, and publishing goes on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import trio
from hostile import HostilePeer

import ketten
from ketten import Event, Identity, NodeConfig, criterion_key, open_node
from ketten._core.membership import ChainConfig, Member
from ketten._core.messages import (
    Append,
    AppendItem,
    AppendReply,
    Offer,
    OfferItem,
    Ping,
    Vote,
    VoteItem,
    VoteReply,
)
from ketten.wire import MAX_UINT, decode_message

PM = ketten.plugin_manager()


@asynccontextmanager
async def honest_node(seeds: list[str]) -> AsyncIterator[ketten.Node]:
    config = NodeConfig(identity=Identity.generate(), transport="tcp", overlay="static",
                        request_timeout=2.0,
                        options={"overlay": {"seeds": seeds, "interval": 0.2}})
    async with open_node(config, plugins=PM) as node:
        yield node


async def honest_network(stack: AsyncExitStack, count: int = 3) -> list[ketten.Node]:
    """``count`` honest nodes that know each other (see :func:`honest_node`)."""
    nodes: list[ketten.Node] = []
    for _ in range(count):
        seeds = [nodes[0].address] if nodes else []
        nodes.append(await stack.enter_async_context(honest_node(seeds)))
    await trio.sleep(1.0)
    return nodes


async def honest_chain(stack: AsyncExitStack, key: bytes,
                       ) -> tuple[list[ketten.Node], list[Event], ChainConfig]:
    """Three honest nodes, and a chain of ``key`` with three events on them."""
    nodes = await honest_network(stack)
    for n in range(3):
        await nodes[0].publish(key, b"honest %d" % n, deadline=10)
    config = await nodes[0].configuration(key)
    assert config is not None
    return nodes, await nodes[0].read(key, deadline=10), config


async def rival_lair(stack: AsyncExitStack, key: bytes) -> tuple[Identity, ketten.Node, Event]:
    """A stranger's node that holds a chain of ``key`` of its own, stamped time 0."""
    stranger = Identity.generate()
    lair = await stack.enter_async_context(open_node(NodeConfig(
        identity=stranger, transport="tcp", overlay="static", request_timeout=2.0),
        plugins=PM))
    forged = Event.create(stranger, criterion=key, seq=0, prev=None, payload=b"MINE", time=0)
    await lair.store.append([forged])
    return stranger, lair, forged


async def test_a_stranger_cannot_lead_vote_in_or_write_to_a_chain() -> None:
    key = criterion_key("takeover")
    async with AsyncExitStack() as stack:
        nodes, before, config = await honest_chain(stack, key)
        voters = config.voter_keys()

        stranger = Identity.generate()
        forged_config = ChainConfig(config.epoch + 1, [Member(stranger.public_key, "127.0.0.9:1")],
                                    (), -1, 0)
        head = (before[-1].seq, before[-1].hash)
        forged = Event.create(stranger, criterion=key, seq=head[0] + 1, prev=head[1],
                              payload=b"FORGED", time=0)
        for node in nodes:
            peer = HostilePeer(node.address, identity=stranger, claimed="127.0.0.9:1")
            for term in (MAX_UINT, 50):
                takeover = AppendItem(key, term, head, head, (forged.to_bytes(),),
                                      (forged.seq, forged.hash), (forged_config,), before[0].hash)
                kind, body = await peer.request("append", Append((takeover,)).to_wire(),
                                                timeout=10)
                assert kind == "reply"
                ack = AppendReply.from_wire(decode_message(body)[1]).acks[0]
                assert ack.status == "refused" and "not a voter" in ack.reason
                assert ack.term < term
                for pre in (True, False):
                    ask = VoteItem(key, term, pre, (MAX_UINT, MAX_UINT, MAX_UINT),
                                   forged_config, force=True, genesis=before[0].hash)
                    kind, body = await peer.request("vote", Vote((ask,)).to_wire(), timeout=10)
                    assert kind == "reply"
                    result = VoteReply.from_wire(decode_message(body)[1]).results[0]
                    assert not result.granted and result.term < term
            await peer.aclose()

        # Every broker kept the chain's voters; the chain goes on, without the forgery.
        for node in nodes:
            kept = await node.configuration(key)
            assert kept is not None and kept.voter_keys() == voters
        for n in range(3, 6):
            await nodes[1].publish(key, b"honest %d" % n, deadline=10)
        for node in nodes:
            after = await node.read(key, deadline=10)
            assert [e.payload for e in after] == [b"honest %d" % n for n in range(6)]
            assert after[:3] == before


async def test_a_stranger_makes_a_node_the_broker_of_a_bounded_number_of_chains() -> None:
    """Appends that would make a node the broker of chains it holds nothing of, each
    naming the stranger the only voter, are taken within the stranger's share of
    ``peer_chain_burst``, then refused before anything is stored; an append that
    names no configuration at all makes nobody a broker."""
    config = NodeConfig(identity=Identity.generate(), transport="tcp", overlay="static",
                        request_timeout=2.0,
                        options={"replication": {"peer_chain_burst": 10,
                                                 "peer_chains_per_second": 0.01}})
    async with open_node(config, plugins=PM) as node:
        stranger = Identity.generate()
        own = ChainConfig(1, [Member(stranger.public_key, "127.0.0.9:1")], (), -1, 0)
        peer = HostilePeer(node.address, identity=stranger, claimed="127.0.0.9:1")

        async def append(name: str, configs: tuple[ChainConfig, ...]) -> tuple[str, str]:
            key = criterion_key(name)
            genesis = Event.create(stranger, criterion=key, seq=0, prev=None,
                                   payload=bytes(10_000), time=0)
            item = AppendItem(key, 1, None, None, (genesis.to_bytes(),), None, configs,
                              genesis.hash)
            kind, body = await peer.request("append", Append((item,)).to_wire(), timeout=10)
            if kind == "error":
                return "error", body
            assert kind == "reply"
            ack = AppendReply.from_wire(decode_message(body)[1]).acks[0]
            return ack.status, ack.reason

        # Without a configuration the message itself is malformed.
        assert await append("no configuration", ()) == ("error", "DecodeError")
        statuses = [await append(f"filler {n}", (own,)) for n in range(30)]
        await peer.aclose()
        assert sum(status == "ok" for status, _ in statuses) <= 10
        assert all(status == "refused" and "too many chains" in reason
                   for status, reason in statuses[10:])
        for n in range(10, 30):
            assert await node.store.head(criterion_key(f"filler {n}")) is None
        assert await node.store.head(criterion_key("no configuration")) is None


async def test_a_stranger_cannot_wipe_a_chain_with_an_older_rival_genesis() -> None:
    """A stranger starts the same criterion itself, with a genesis stamped older than
    the real one (time 0), serves it from a node of its own and tells every broker
    about it: in an append, in a vote request and in its answers. A chain started
    twice is settled by the older genesis, but only for a rival that a node this one
    trusts (a member of its configuration, a node nearest to the key) holds: the
    stranger's word alone orphans nothing."""
    key = criterion_key("rival takeover")
    async with AsyncExitStack() as stack:
        nodes, before, config = await honest_chain(stack, key)

        stranger, lair, forged = await rival_lair(stack, key)
        forged_config = ChainConfig(1, [Member(stranger.public_key, lair.address)], (), -1, 0)
        for node in nodes:
            peer = HostilePeer(node.address, identity=stranger, claimed=lair.address)
            item = AppendItem(key, 1, None, None, (forged.to_bytes(),), (0, forged.hash),
                              (forged_config,), forged.hash)
            kind, body = await peer.request("append", Append((item,)).to_wire(), timeout=10)
            assert kind == "reply"
            ack = AppendReply.from_wire(decode_message(body)[1]).acks[0]
            assert ack.status != "ok"
            ask = VoteItem(key, 1, False, (0, 0, 0), forged_config, force=True,
                           genesis=forged.hash)
            kind, body = await peer.request("vote", Vote((ask,)).to_wire(), timeout=10)
            assert kind == "reply"
            assert not VoteReply.from_wire(decode_message(body)[1]).results[0].granted
            await peer.aclose()
        await trio.sleep(3.0)  # settling runs in the background too

        for node in nodes:
            assert await node.store.head(key) is not None
            kept = await node.configuration(key)
            assert kept is not None and kept.voter_keys() == config.voter_keys()
        await nodes[2].publish(key, b"honest 3", deadline=10)
        for node in nodes:
            after = await node.read(key, deadline=10)
            assert [e.payload for e in after] == [b"honest %d" % n for n in range(4)]
            assert after[:3] == before


async def test_a_stranger_cannot_lead_a_readers_copy() -> None:
    """A node that read a chain holds a copy of it, but no configuration. A stranger
    sends it the next event of the chain (its own), naming itself and the node the
    voters and the event committed: the nodes near the key know the chain without
    the stranger, so the copy takes nothing, and reads from that node go on."""
    from ketten.testing import open_cluster

    async with open_cluster(4, plugins=PM, transport="tcp", overlay="static",
                            settle=1.0) as c:
        key = criterion_key("copied")
        writer = c.nodes[c.brokers(key)[0]]
        reader = c.nodes[next(i for i in c.nodes if i not in c.brokers(key))]
        for n in range(3):
            await writer.publish(key, b"honest %d" % n, deadline=10)
        before = await reader.read(key, deadline=10)
        assert await reader.store.head(key) == before[-1]  # the reader's copy
        head = before[-1]
        stranger = Identity.generate()
        forged = Event.create(stranger, criterion=key, seq=head.seq + 1, prev=head.hash,
                              payload=b"FORGED", time=head.time + 1)
        forged_config = ChainConfig(1, [Member(stranger.public_key, "127.0.0.9:1"),
                                        Member(reader.identity.public_key, reader.address)],
                                    (), -1, 0)
        peer = HostilePeer(reader.address, identity=stranger, claimed="127.0.0.9:1")
        item = AppendItem(key, 1, None, (head.seq, head.hash), (forged.to_bytes(),),
                          (forged.seq, forged.hash), (forged_config,), before[0].hash)
        kind, body = await peer.request("append", Append((item,)).to_wire(), timeout=10)
        await peer.aclose()
        assert kind == "reply"
        ack = AppendReply.from_wire(decode_message(body)[1]).acks[0]
        assert ack.status == "refused"
        assert await reader.store.head(key) == head
        assert await reader.read(key, deadline=10) == before
        await writer.publish(key, b"honest 3", deadline=10)
        after = await reader.read(key, deadline=10)
        assert [e.payload for e in after] == [b"honest %d" % n for n in range(4)]


async def test_whoever_offers_a_first_event_does_not_pick_the_chains_brokers() -> None:
    """A stranger offers the first event of a criterion nobody has started yet and
    names the members to create it on: the broker it asks and two nodes of its own.
    The broker creates the chain on the nodes its own routing table names nearest
    to the key, so a later honest publish is held by a majority of them."""
    key = criterion_key("orders")
    async with AsyncExitStack() as stack:
        nodes = await honest_network(stack)
        lairs = [await stack.enter_async_context(open_node(NodeConfig(
            identity=Identity.generate(), transport="tcp", overlay="static",
            request_timeout=2.0), plugins=PM)) for _ in range(2)]
        victim = nodes[0]
        members = (Member(victim.identity.public_key, victim.address),
                   *(Member(lair.identity.public_key, lair.address) for lair in lairs))
        genesis = Event.create(Identity.generate(), criterion=key, seq=0, prev=None,
                               payload=b"squat", time=0)
        for lair in lairs:
            await lair._rpc.call(victim.address, Ping(), timeout=5)
        for _ in range(10):
            _, reply = await lairs[0]._rpc.call(
                victim.address, Offer((OfferItem(genesis.to_bytes(), (), members, False),)),
                timeout=15)
            if reply.answers[0].kind.name == "ACK":
                break
            await trio.sleep(1.0)
        config = await victim.configuration(key)
        lair_keys = {lair.identity.public_key for lair in lairs}
        assert config is None or not (config.keys() & lair_keys)
        event = await nodes[1].publish(key, b"payment 1", deadline=10)
        holders = sum([await node.store.get(event.hash) is not None for node in nodes])
        assert holders >= 2


async def test_offers_that_create_chains_count_against_the_peers_share() -> None:
    """Each first event signed by a fresh author, offered by one peer naming the node
    the only member: the per-author bound alone would let the peer create chains
    without end; the peer's own share (``peer_chain_burst``) bounds them."""
    tight = {"peer_chain_burst": 5, "peer_chains_per_second": 0.01}
    async with AsyncExitStack() as stack:
        nodes: list[ketten.Node] = []
        for _ in range(3):
            seeds = [nodes[0].address] if nodes else []
            nodes.append(await stack.enter_async_context(open_node(NodeConfig(
                identity=Identity.generate(), transport="tcp", overlay="static",
                request_timeout=2.0,
                options={"overlay": {"seeds": seeds, "interval": 0.2},
                         "replication": tight}), plugins=PM)))
        await trio.sleep(3.0)
        victim = nodes[0]
        lair = await stack.enter_async_context(open_node(NodeConfig(
            identity=Identity.generate(), transport="tcp", overlay="static",
            request_timeout=2.0), plugins=PM))
        await lair._rpc.call(victim.address, Ping(), timeout=5)
        only_victim = (Member(victim.identity.public_key, victim.address),)
        answers = []
        for n in range(30):
            genesis = Event.create(Identity.generate(), criterion=criterion_key(f"filler {n}"),
                                   seq=0, prev=None, payload=bytes(1000), time=0)
            _, reply = await lair._rpc.call(
                victim.address, Offer((OfferItem(genesis.to_bytes(), (), only_victim, False),)),
                timeout=15)
            answers.append(reply.answers[0])
        created = sum([await victim.store.head(criterion_key(f"filler {n}")) is not None
                       for n in range(30)])
        assert created <= tight["peer_chain_burst"]
        assert sum(a.kind.name == "LIMITED" and "too many chains" in a.message
                   for a in answers) >= 30 - tight["peer_chain_burst"]


async def plant(victim: ketten.Node, key: bytes, stranger: Identity, lair: ketten.Node,
                forged: Event) -> AppendReply:
    """The stranger sends ``victim`` its own chain of ``key``, naming itself and the
    victim the voters."""
    forged_config = ChainConfig(1, [Member(stranger.public_key, lair.address),
                                    Member(victim.identity.public_key, victim.address)],
                                (), -1, 0)
    peer = HostilePeer(victim.address, identity=stranger, claimed=lair.address)
    item = AppendItem(key, 1, None, None, (forged.to_bytes(),), (0, forged.hash),
                      (forged_config,), forged.hash)
    kind, body = await peer.request("append", Append((item,)).to_wire(), timeout=10)
    await peer.aclose()
    assert kind == "reply"
    return AppendReply.from_wire(decode_message(body)[1])


async def tell_of_rival(node: ketten.Node, key: bytes, stranger: Identity, lair: ketten.Node,
                        forged: Event) -> None:
    """The stranger tells ``node`` of its older chain, in a vote request."""
    forged_config = ChainConfig(1, [Member(stranger.public_key, lair.address)], (), -1, 0)
    peer = HostilePeer(node.address, identity=stranger, claimed=lair.address)
    ask = VoteItem(key, 1, False, (0, 0, 0), forged_config, force=True, genesis=forged.hash)
    kind, body = await peer.request("vote", Vote((ask,)).to_wire(), timeout=10)
    await peer.aclose()
    assert kind == "reply"
    assert not VoteReply.from_wire(decode_message(body)[1]).results[0].granted


async def test_a_stranger_cannot_plant_an_older_chain_on_a_node_near_the_key() -> None:
    """A node near a key that is no broker of its chain holds nothing of it. A stranger
    sends it a chain of its own of that criterion, stamped older and naming the node
    a voter. Were it taken, the node would be believed, as a node near the key, that
    an older chain exists, and the real chain's brokers would give way to it. A node
    that holds no configuration of a chain takes one on from a sender that is not
    one of the nodes nearest to the key only if the nodes near the key name the
    sender a voter: the stranger's chain is refused, and told of it the brokers
    keep theirs."""
    from ketten.testing import open_cluster

    async with AsyncExitStack() as stack:
        c = await stack.enter_async_context(open_cluster(
            5, plugins=PM, transport="tcp", overlay="static", settle=1.0))
        key = criterion_key("planted near")
        writer = c.nodes[c.brokers(key)[0]]
        for n in range(3):
            await writer.publish(key, b"honest %d" % n, deadline=10)
        before = await writer.read(key, deadline=10)
        stranger, lair, forged = await rival_lair(stack, key)
        for index in c.nodes:
            if index in c.brokers(key):
                continue
            ack = (await plant(c.nodes[index], key, stranger, lair, forged)).acks[0]
            assert ack.status == "refused" and "near the key" in ack.reason
            assert await c.nodes[index].store.head(key) is None
        for index in c.brokers(key):
            await tell_of_rival(c.nodes[index], key, stranger, lair, forged)
        await trio.sleep(3.0)  # settling runs in the background too
        for node in c.nodes.values():
            assert node.replication_statistics().chains_yielded == 0
        await writer.publish(key, b"honest 3", deadline=10)
        after = await c.nodes[c.brokers(key)[1]].read(key, deadline=10)
        assert [e.payload for e in after] == [b"honest %d" % n for n in range(4)]
        assert after[:3] == before


async def test_a_stranger_cannot_plant_an_older_chain_on_a_node_joining_near_the_key() -> None:
    """A node joins nearer to a key than the chain's brokers; before the chain moves
    onto it, a stranger sends it a chain of its own of that criterion, stamped older
    and naming the newcomer a voter. The newcomer refuses it (see above), and the
    real chain moves onto it whole; nobody gives anything up."""
    from ketten._core.identity import node_id_of

    key = criterion_key("planted")

    def distance(identity: Identity) -> int:
        return int.from_bytes(node_id_of(identity.public_key), "big") ^ int.from_bytes(key, "big")

    def config(identity: Identity, seeds: list[str]) -> NodeConfig:
        return NodeConfig(identity=identity, transport="tcp", overlay="static",
                          request_timeout=2.0,
                          options={"overlay": {"seeds": seeds, "interval": 0.2},
                                   "replication": {"hysteresis": 3.0}})

    identities = [Identity.generate() for _ in range(3)]
    newcomer = Identity.generate()
    while distance(newcomer) > min(map(distance, identities)):
        newcomer = Identity.generate()
    async with AsyncExitStack() as stack:
        nodes: list[ketten.Node] = []
        for identity in identities:
            seeds = [nodes[0].address] if nodes else []
            nodes.append(await stack.enter_async_context(open_node(config(identity, seeds),
                                                                   plugins=PM)))
        await trio.sleep(1.0)
        for n in range(3):
            await nodes[0].publish(key, b"honest %d" % n, deadline=10)
        before = await nodes[0].read(key, deadline=10)

        stranger, lair, forged = await rival_lair(stack, key)
        joined = await stack.enter_async_context(open_node(config(newcomer, [nodes[0].address]),
                                                           plugins=PM))
        ack = (await plant(joined, key, stranger, lair, forged)).acks[0]
        assert ack.status == "refused" and "near the key" in ack.reason

        # The real chain moves onto the newcomer, whole; told of the stranger's chain,
        # the brokers keep theirs.
        with trio.fail_after(60):
            while True:
                await trio.sleep(1.0)
                config_now = await nodes[0].configuration(key)
                if (config_now is not None and config_now.is_voter(newcomer.public_key)
                        and (await joined.store.range(key, 0, 3)) == before):
                    break
        for node in [*nodes, joined]:
            await tell_of_rival(node, key, stranger, lair, forged)
        await trio.sleep(3.0)
        for node in [*nodes, joined]:
            assert node.replication_statistics().chains_yielded == 0
        await joined.publish(key, b"honest 3", deadline=10)
        after = await nodes[1].read(key, deadline=10)
        assert [e.payload for e in after] == [b"honest %d" % n for n in range(4)]
