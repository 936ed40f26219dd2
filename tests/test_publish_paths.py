"""The publish path at scale: routes without lookups, admission, distinct events."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ketten import criterion_key
from ketten.plugins.kademlia._ids import Contact
from ketten.plugins.kademlia._routing import RoutingTable
from ketten.testing import deterministic_identity, open_cluster


async def test_a_node_new_to_a_chain_finds_it_without_a_lookup(autojump_clock) -> None:
    async with open_cluster(8, overlay="kademlia", seed=3, settle=5.0) as cluster:
        for index in range(8):
            await cluster[index].publish(f"c{index}", b"first")
        key = criterion_key("c0")
        newcomer = next(i for i in range(1, 8)
                        if cluster[i]._sets.cached(key) is None)
        sets = cluster[newcomer]._sets
        before = sets.lookups
        event = await cluster[newcomer].publish("c0", b"second")
        assert event.seq == 1
        assert sets.lookups == before  # the routing table named a broker that knew
        assert sets.near_asks >= 1


async def test_a_new_chain_is_still_started_only_after_a_lookup(autojump_clock) -> None:
    async with open_cluster(8, overlay="kademlia", seed=4, settle=5.0) as cluster:
        sets = cluster[2]._sets
        before = sets.lookups
        await cluster[2].publish("fresh", b"genesis")
        assert sets.lookups == before + 1


async def test_publishes_beyond_max_publishing_wait_their_turn(autojump_clock) -> None:
    async with open_cluster(3, seed=5, options={"replication": {"max_publishing": 2}}) as cluster:
        node = cluster[0]
        publisher = node._publisher
        waited: list[int] = []
        events = []

        async def one(n: int) -> None:
            events.append(await node.publish(f"k{n}", b"%d" % n, deadline=5.0))

        async with trio.open_nursery() as nursery:
            for n in range(10):
                nursery.start_soon(one, n)
            await trio.testing.wait_all_tasks_blocked()
            waited.append(publisher.waiting)
        assert waited == [8]
        assert len(events) == 10 and publisher.waiting == 0


@pytest.mark.parametrize("command", [None, 5])
async def test_two_calls_with_the_same_content_in_one_millisecond(
        autojump_clock, command: int | None) -> None:
    """Two events, unless a command id makes them one."""
    frozen = {"replication": {"time": lambda: 1_000}}
    async with open_cluster(3, seed=6, options=frozen) as cluster:
        node = cluster[0]
        await node.publish("same", b"genesis")
        events = []

        async def one() -> None:
            events.append(await node.publish("same", b"twice", command=command, deadline=10.0))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            nursery.start_soon(one)
        chain = await node.read("same")
        if command is None:
            assert events[0].hash != events[1].hash
            assert {e.hash for e in events} <= {e.hash for e in chain}
            assert len(chain) == 3
        else:
            assert events[0].hash == events[1].hash
            assert len(chain) == 2


def test_the_routing_table_version_changes_with_its_contacts() -> None:
    own = deterministic_identity(9, 0)
    table = RoutingTable(int.from_bytes(own.node_id, "big"), k=4)
    peer = deterministic_identity(9, 1)
    from ketten.interfaces import Peer

    contact = Contact.of(Peer("m:1", peer.public_key))
    start = table.version
    table.observe(contact, 0.0)
    added = table.version
    assert added != start
    table.observe(contact, 1.0)  # seen again, same address: nothing changed
    assert table.version == added
    table.observe(Contact.of(Peer("m:2", peer.public_key)), 2.0)  # moved
    moved = table.version
    assert moved != added
    table.remove(contact.id, 3.0)
    assert table.version != moved


async def test_a_stable_network_smaller_than_k_does_not_join_again(autojump_clock) -> None:
    async with open_cluster(5, overlay="kademlia", seed=8, settle=5.0) as cluster:
        overlay = cluster[1].overlay
        assert overlay is not None
        before = overlay.statistics().lookups
        await trio.sleep(120.0)
        assert overlay.statistics().lookups == before


async def test_an_event_over_max_event_size_is_refused_at_once_naming_the_limit(
        autojump_clock) -> None:
    from ketten.errors import UsageError

    async with open_cluster(3, seed=8) as cluster:
        node = cluster[0]
        limit = node.config.max_event_size
        for size in (limit, 4 * limit):
            started = trio.current_time()
            with pytest.raises(UsageError, match="max_event_size"):
                await node.publish("big", b"x" * size)
            assert trio.current_time() == started  # nothing was sent, nobody waited
        # Headers and signature push a payload just under the limit over it.
        with pytest.raises(UsageError, match=r"would take \d+ bytes .* max_event_size"):
            await node.publish("big", b"x" * (limit - 8))
        assert await node.read("big") == []
        event = await node.publish("big", b"x" * (limit - 1024))
        assert event.seq == 0


async def test_a_nodes_own_publishes_to_one_criterion_go_in_turn(autojump_clock) -> None:
    """Side by side they would conflict with each other and back off: the node sends
    them one after the other, so 32 at once take about as long as 32 in a row."""
    conflicts = 0

    def on_conflict(head: object) -> None:
        nonlocal conflicts
        conflicts += 1

    async with open_cluster(3, seed=6) as cluster:
        node = cluster[0]
        await node.publish("in turn", b"genesis")
        began = trio.current_time()
        for n in range(32):
            await node.publish("in turn", b"row %d" % n, on_conflict=on_conflict)
        in_a_row = trio.current_time() - began
        began = trio.current_time()
        async with trio.open_nursery() as nursery:
            for n in range(32):
                nursery.start_soon(lambda n=n: node.publish("in turn", b"at once %d" % n,
                                                            on_conflict=on_conflict))
        at_once = trio.current_time() - began
        assert conflicts == 0
        assert at_once <= in_a_row * 1.5
        chain = await node.read("in turn")
        assert len(chain) == 65
        assert sorted(e.payload for e in chain[33:]) == sorted(b"at once %d" % n
                                                               for n in range(32))
        assert node._publisher._in_turn._locks == {}  # nothing kept once the calls ended
