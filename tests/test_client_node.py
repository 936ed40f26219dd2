"""Client nodes (``NodeConfig.client``): they use the network without joining it.

A short-lived process (the ``ketten`` command) that joined as a full member
stayed in its peers' routing tables and in their memory of the nodes near
each key after it exited; once a few such ghosts were nearer a new key than
the live nodes, no new criterion could be started there.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

import ketten
from ketten import criterion_key
from ketten._core.identity import node_id_of
from ketten.errors import ConfigError, DecodeError
from ketten.testing import open_cluster
from ketten.wire import decode_message, encode_message


async def _visit(cluster: object, index: int, *, client: bool) -> bytes:
    """Start node ``index``, publish to ``"busy"`` through it, stop it; its key."""
    node = await cluster.start(index, client=client)  # type: ignore[attr-defined]
    await node.publish("busy", b"visit %d" % index, deadline=10)
    key = node.identity.public_key
    await cluster.stop(index)  # type: ignore[attr-defined]
    return key


def _remembered(node: ketten.Node, key: bytes) -> bool:
    table = node.overlay.table  # type: ignore[union-attr]
    in_table = int.from_bytes(node_id_of(key), "big") in table
    return in_table or node._sets.acquaintances.last_seen(key) is not None


@pytest.mark.parametrize("client", [True, False])
async def test_nodes_that_came_and_went_are_remembered_only_if_they_were_members(
        autojump_clock: trio.testing.MockClock, client: bool) -> None:
    async with open_cluster(3, overlay="kademlia", seed=21, settle=5.0) as cluster:
        await cluster[0].publish("busy", b"first")
        visitors = [await _visit(cluster, index, client=client) for index in range(3, 13)]
        remembered = sum(_remembered(cluster[i], key) for i in range(3) for key in visitors)
        if client:
            assert remembered == 0
        else:
            assert remembered >= 10  # members are kept, as Kademlia keeps its contacts


async def test_new_criteria_start_after_many_client_visits(
        autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(3, overlay="kademlia", seed=22, settle=5.0) as cluster:
        await cluster[0].publish("busy", b"first")
        for index in range(3, 13):
            await _visit(cluster, index, client=True)
        for n in range(10):
            event = await cluster[n % 3].publish(f"fresh-{n}", b"genesis", deadline=10)
            assert event.seq == 0
        assert len(await cluster[1].read("busy")) == 11


async def test_a_client_is_never_a_broker_and_still_subscribes(
        autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(3, overlay="kademlia", seed=23, settle=5.0) as cluster:
        client = await cluster.start(3, client=True)
        await trio.sleep(5)
        names = [f"topic-{n}" for n in range(30)]
        async with client.subscribe("topic-0") as feed:
            for name in names:
                await cluster[0].publish(name, b"x")
            await client.publish("topic-0", b"from the client")
            seen = []
            with trio.fail_after(30):
                async for event in feed:
                    seen.append(event.payload)
                    if len(seen) == 2:
                        break
        assert seen == [b"x", b"from the client"]
        assert client.overlay is not None
        for name in names:
            assert client.identity.public_key not in {
                p.public_key for p in client.overlay.nearest(criterion_key(name), 3)}
        # it keeps a copy of what it subscribed to, and nothing else
        assert set(await client.store.heads()) <= {criterion_key("topic-0")}
        assert client.replication_statistics().chains_held == 0


async def test_client_mode_needs_an_overlay_that_supports_it() -> None:
    config = ketten.NodeConfig(overlay="static", client=True)
    with pytest.raises(ConfigError, match="client=True needs an overlay"):
        async with ketten.open_node(config):
            pass
    with pytest.raises(ConfigError, match="client must be True or False"):
        ketten.NodeConfig(client="yes")  # type: ignore[arg-type]


def test_the_client_mark_in_the_envelope() -> None:
    assert decode_message(encode_message("s", {"a": 1}, client=True)) == ("s", {"a": 1})
    from ketten._wire import decode_envelope
    assert decode_envelope(encode_message("s", 1, client=True)) == ("s", 1, True)
    assert decode_envelope(encode_message("s", 1)) == ("s", 1, False)
    with pytest.raises(DecodeError, match="message"):
        decode_envelope(ketten.wire.dumps(["s", 1, 2]))
    with pytest.raises(DecodeError, match="message"):
        decode_envelope(ketten.wire.dumps(["s", 1, 1, 1]))
