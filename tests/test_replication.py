"""Replicated chains: publish, sync, forks, churn, reading, idempotency, writers.

Every test runs real nodes on the in-process network in virtual time
(``autojump_clock``), with the ``static`` overlay and memory stores.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pluggy
import pytest
import trio
import trio.testing

import ketten
import ketten.plugins.memory_store
from ketten import Agent, Event, Identity, Node, criterion_key, hookimpl
from ketten._core.membership import ChainConfig, Member
from ketten._core.messages import Route
from ketten.adapters.memory import Faults, MemoryNetwork
from ketten.errors import (
    CommandIdReused,
    PublishOutcomeUnknown,
    QuorumUnavailable,
    UsageError,
    WriterNotAllowed,
)
from ketten.testing import Cluster, open_cluster


@asynccontextmanager
async def cluster(plugins: pluggy.PluginManager, count: int, *, faults: Faults | None = None,
                  **options: Any) -> AsyncIterator[Cluster]:
    net = MemoryNetwork(seed=options.get("seed", 0), faults=faults or Faults())
    async with open_cluster(count, network=net, plugins=plugins, **options) as c:
        yield c


# -- seed 000 scenarios ------------------------------------------------------


async def test_first_event_of_a_new_criterion(plugins, autojump_clock) -> None:
    async with cluster(plugins, 5) as c:
        key = criterion_key("orders")
        publisher = c.others(key)[0]
        event = await c.nodes[publisher].publish("orders", b"first")
        assert (event.seq, event.prev, event.payload) == (0, None, b"first")
        assert event.author == c.identity(publisher).public_key
        assert await c.settle(key) == [event]
        for index in c.others(key):
            assert await c.chain(index, key) == []


async def test_a_successor_links_to_the_head(plugins, autojump_clock) -> None:
    async with cluster(plugins, 5) as c:
        key = criterion_key("orders")
        first = await c.nodes[0].publish(key, b"1")
        second = await c.nodes[3].publish(key, b"2")
        assert (second.seq, second.prev) == (1, first.hash)
        assert await c.settle(key) == [first, second]


async def test_a_stale_publish_syncs_rechecks_and_retries(plugins, autojump_clock) -> None:
    async with cluster(plugins, 5) as c:
        key = criterion_key("stale")
        a, b = c.others(key)[0], c.brokers(key)[0]
        await c.nodes[a].publish(key, b"a1")
        newer = await c.nodes[b].publish(key, b"b1")
        seen: list[Event | None] = []

        def recheck(head: Event | None) -> bytes:
            seen.append(head)
            return b"a2 after " + (head.payload if head else b"")

        event = await c.nodes[a].publish(key, b"a2", on_conflict=recheck)
        assert seen == [newer]
        assert (event.seq, event.prev, event.payload) == (2, newer.hash, b"a2 after b1")
        chain = await c.settle(key)
        assert [e.payload for e in chain] == [b"a1", b"b1", b"a2 after b1"]


async def test_on_conflict_can_give_up(plugins, autojump_clock) -> None:
    async with cluster(plugins, 5) as c:
        key = criterion_key("give up")
        a, b = c.others(key)[0], c.others(key)[1]
        await c.nodes[a].publish(key, b"a1")
        await c.nodes[b].publish(key, b"b1")

        class Changed(Exception):
            pass

        def refuse(head: Event | None) -> bytes:
            raise Changed

        with pytest.raises(Changed):
            await c.nodes[a].publish(key, b"a2", on_conflict=refuse)
        assert [e.payload for e in await c.settle(key)] == [b"a1", b"b1"]


async def test_a_broker_without_the_predecessor_syncs_before_answering(
        plugins, autojump_clock) -> None:
    async with cluster(plugins, 5, anti_entropy=1000.0) as c:
        key = criterion_key("gap")
        lagging, other, third = c.brokers(key)
        publisher = c.others(key)[0]
        c.cut(lagging)
        for i in range(4):
            await c.nodes[publisher].publish(key, b"%d" % i)
        c.heal()
        assert await c.chain(lagging, key) == []
        # Without the lagging broker's vote there is no majority now: it has to
        # catch up from the one broker it can reach before it acknowledges.
        c.cut(other)
        event = await c.nodes[publisher].publish(key, b"needs the lagging broker")
        assert event.seq == 4
        chain = await c.chain(lagging, key)
        assert chain == await c.chain(third, key)
        assert chain[-1] == event
        assert c.nodes[lagging].replication_statistics().events_synced >= 4


async def test_a_broker_leaves_and_another_takes_over(plugins, autojump_clock) -> None:
    async with cluster(plugins, 6, evict_after=3.0, hysteresis=4.0) as c:
        key = criterion_key("handover")
        publisher = c.others(key)[0]
        events = [await c.nodes[publisher].publish(key, b"%d" % i) for i in range(10)]
        leaving = c.brokers(key)[0]
        await c.stop(leaving)
        successor = c.brokers(key)[-1]
        assert await c.chain(successor, key) == []
        # Two of three brokers are left: the chain stays writable meanwhile.
        events.append(await c.nodes[publisher].publish(key, b"while moving"))
        # The leaver is evicted (nobody says goodbye); after the hysteresis period the
        # chain moves: the successor catches up as a learner, then votes.
        await c.moved(key)
        events.append(await c.nodes[publisher].publish(key, b"after"))
        chain = await c.settle(key)
        assert chain == events
        assert await c.chain(successor, key) == events
        assert sum(c.nodes[i].replication_statistics().reconfigurations
                   for i in c.nodes) >= 2  # joint, then the new configuration


async def test_a_new_node_catches_up(plugins, autojump_clock) -> None:
    async with cluster(plugins, 4, hysteresis=4.0) as c:
        newcomer = c.identity(9)
        key = newcomer.node_id  # the newcomer will be the closest node to this key
        events = [await c.nodes[i % 4].publish(key, b"%d" % i) for i in range(25)]
        assert 9 not in c.brokers(key)
        await c.start(9)
        assert 9 in c.brokers(key)
        # It holds nothing and votes for nothing until the chain moves to it.
        assert await c.nodes[9].store.range(key) == []
        await c.moved(key)
        chain = await c.settle(key)
        assert chain == events
        assert c.nodes[9].replication_statistics().events_synced == 25


async def test_a_node_that_holds_no_copy_names_the_configuration_in_force(
        plugins, autojump_clock) -> None:
    # A publisher that is no broker learned the chain's route; the chain then moves
    # while it is silent. Asked, it names the new configuration, not the route it
    # learned (which may also name a configuration that was abandoned).
    async with cluster(plugins, 4, hysteresis=4.0) as c:
        newcomer = c.identity(9)
        key = newcomer.node_id
        observer = c.others(key)[0]
        for i in range(5):
            await c.nodes[observer].publish(key, b"%d" % i)
        before = await c.nodes[observer].configuration(key)
        assert before is not None and newcomer.public_key not in before.voter_keys()
        await c.start(9)
        await c.moved(key)
        await c.settle(key)
        broker = c.brokers(key)[0]
        in_force = await c.nodes[broker].configuration(key)
        assert in_force is not None and newcomer.public_key in in_force.voter_keys()
        assert await c.nodes[observer].configuration(key) == in_force
        assert in_force.epoch > before.epoch


async def test_replay_reads_the_local_copy_in_order(plugins, autojump_clock) -> None:
    async with cluster(plugins, 4) as c:
        key = criterion_key("replay")
        events = [await c.nodes[0].publish(key, b"%d" % i) for i in range(600)]
        broker = c.brokers(key)[0]
        await c.settle(key, 30.0)
        replayed = [e async for e in c.nodes[broker].replay(key)]
        assert replayed == events
        assert [e async for e in c.nodes[broker].replay("replay", from_seq=595)] == events[595:]


async def test_a_view_as_of_an_older_hash(plugins, autojump_clock) -> None:
    async with cluster(plugins, 4) as c:
        key = criterion_key("view")
        events = [await c.nodes[1].publish(key, b"%d" % i) for i in range(10)]
        broker = c.nodes[c.brokers(key)[0]]
        await c.settle(key)
        view = await broker.view(key, at=events[4].hash)
        assert view.head == events[4]
        assert list(view.replay()) == events[:5]
        with pytest.raises(KeyError):
            await broker.view(key, at=b"\0" * 32)


# -- reading -------------------------------------------------------------------


async def test_read_syncs_with_a_majority_first(plugins, autojump_clock) -> None:
    async with cluster(plugins, 5) as c:
        key = criterion_key("read")
        events = [await c.nodes[0].publish(key, b"%d" % i) for i in range(7)]
        reader = c.nodes[c.others(key)[-1]]
        assert await reader.store.range(key) == []
        assert await reader.read(key) == events
        assert await reader.read(key, since=5) == events[5:]
        assert await reader.sync(key) == events[-1]


async def test_read_without_a_majority_fails(plugins, autojump_clock) -> None:
    async with cluster(plugins, 5) as c:
        key = criterion_key("cut off")
        await c.nodes[0].publish(key, b"x")
        reader = c.others(key)[-1]
        c.cut(reader)
        with pytest.raises(QuorumUnavailable):
            await c.nodes[reader].read(key)


# -- quorum ----------------------------------------------------------------------


async def test_publish_without_a_majority_fails_and_acknowledges_nothing(
        plugins, autojump_clock) -> None:
    async with cluster(plugins, 5) as c:
        key = criterion_key("minority")
        await c.nodes[0].publish(key, b"before")
        publisher = c.brokers(key)[0]
        c.cut(*c.brokers(key)[1:])
        start = trio.current_time()
        with pytest.raises((QuorumUnavailable, PublishOutcomeUnknown)) as raised:
            await c.nodes[publisher].publish(key, b"lonely", command=1, deadline=3.0)
        assert trio.current_time() - start == pytest.approx(3.0, abs=0.2)
        if isinstance(raised.value, PublishOutcomeUnknown):
            # This broker led the chain: it holds the event, which may yet commit.
            assert raised.value.event_hashes
        else:
            assert "nothing was stored" in str(raised.value)
        c.heal()
        # Retrying the command settles the outcome, once.
        event = await c.nodes[publisher].publish(key, b"lonely", command=1)
        chain = await c.settle(key)
        assert [e.payload for e in chain] == [b"before", b"lonely"]
        assert chain[1] == event


# -- forks -------------------------------------------------------------------------


class ForkRecorder:
    def __init__(self) -> None:
        self.resolved: list[tuple[str, list[bytes], bytes | None]] = []

    @hookimpl
    def ketten_fork_resolved(self, node: Node, criterion: bytes, orphaned: list[Event],
                             head: Event | None) -> None:
        self.resolved.append((node.address, [e.payload for e in orphaned],
                              None if head is None else head.payload))


async def test_a_deposed_leaders_branch_is_rolled_back_to_orphans(autojump_clock) -> None:
    recorder = ForkRecorder()
    pm = ketten.plugin_manager(extra=(recorder,))
    async with cluster(pm, 5) as c:
        key = criterion_key("fork")
        events = [await c.nodes[0].publish(key, b"%d" % i) for i in range(3)]
        chain = await c.settle(key)
        leader = next(i for i in c.brokers(key)
                      if c.nodes[i].replication_statistics().chains_led)
        majority_side = [i for i in c.nodes if i != leader]
        # The leader is cut off: what it takes cannot commit...
        c.cut(leader)
        with pytest.raises(PublishOutcomeUnknown):
            await c.nodes[leader].publish(key, b"rogue", deadline=2.0)
        # ...while the rest elect another leader and go on.
        winner = await c.nodes[majority_side[0]].publish(key, b"winner")
        c.heal()
        events.append(winner)
        events.append(await c.nodes[majority_side[0]].publish(key, b"after"))
        chain = await c.settle(key)
        assert chain == events
        assert [e.payload for e in await c.nodes[leader].orphans(key)] == [b"rogue"]
        assert any(address == f"n:{leader}" and orphaned == [b"rogue"]
                   for address, orphaned, _ in recorder.resolved)
        rogue = (await c.nodes[leader].orphans(key))[0]
        lost_branch = await c.nodes[leader].view(key, at=rogue.hash)
        assert list(lost_branch.replay()) == [*events[:3], rogue]


async def test_a_busy_chain_gets_a_new_leader_within_one_publish_deadline(
        plugins, autojump_clock) -> None:
    # The leader falls silent in the middle of a stream of publishes: its followers
    # heard from it just now, yet the next publish must not fail for that.
    async with cluster(plugins, 5, request_timeout=5.0) as c:  # the node's default
        key = criterion_key("busy")
        publisher = c.others(key)[0]
        events = [await c.nodes[publisher].publish(key, b"%d" % i) for i in range(20)]
        leader = next(i for i in c.brokers(key)
                      if c.nodes[i].replication_statistics().chains_led)
        c.cut(leader)
        started = trio.current_time()
        events.append(await c.nodes[publisher].publish(key, b"after the leader fell silent"))
        assert trio.current_time() - started < 10.0  # the default publish deadline
        events.append(await c.nodes[publisher].publish(key, b"and on"))
        c.heal()
        assert await c.settle(key) == events


async def test_a_restarted_leader_leads_again_without_waiting_out_its_followers(
        plugins, autojump_clock) -> None:
    # The leader crashes and is back at once: its followers heard from it just now,
    # yet its own request to lead again is no disruption to wait out.
    async with cluster(plugins, 5, request_timeout=5.0) as c:  # election timeout 5 s
        key = criterion_key("restarted")
        publisher = c.others(key)[0]
        events = [await c.nodes[publisher].publish(key, b"%d" % i) for i in range(5)]
        leader = next(i for i in c.brokers(key)
                      if c.nodes[i].replication_statistics().chains_led)
        await c.stop(leader)
        await c.start(leader)
        with trio.fail_after(1.0):
            events.append(await c.nodes[publisher].publish(key, b"after the restart"))
        assert await c.settle(key) == events


async def test_a_flush_under_way_does_not_store_a_given_up_chain_state_again(
        plugins, autojump_clock) -> None:
    # A commit mark waits for the flush; meanwhile the broker retires from the chain.
    # The flush, holding the replica it found, must not write the old configuration
    # back over the state the retirement left (the node would be a member again).
    async with cluster(plugins, 4) as c:
        key = criterion_key("given up")
        await c.nodes[c.others(key)[0]].publish(key, b"x")
        node = c.nodes[c.brokers(key)[0]]
        replicator = node._replicator
        replica = replicator.loaded(key)
        assert replica is not None and replica.config is not None
        replicator._dirty_states[key] = None
        async with trio.open_nursery() as nursery, node._chains.lock(key):
            nursery.start_soon(replicator.flush)  # waits for the chain's lock
            await trio.sleep(0.1)
            await replicator._release(replica, -1)
        state = await node._chains.state(key)
        assert state is not None and state.config is None


# -- idempotent commands ------------------------------------------------------------


async def test_the_same_command_is_applied_once(plugins, autojump_clock) -> None:
    async with cluster(plugins, 4) as c:
        key = criterion_key("commands")
        first = await c.nodes[0].publish(key, b"pay 10", command=7)
        await c.nodes[1].publish(key, b"other")
        again = await c.nodes[0].publish(key, b"pay 10", command=7)
        assert again == first
        chain = await c.settle(key)
        assert [e.payload for e in chain] == [b"pay 10", b"other"]
        with pytest.raises(CommandIdReused, match="command 7"):
            await c.nodes[0].publish(key, b"pay 20", command=7)
        assert await c.settle(key) == chain


async def test_an_agent_counter_survives_a_restart(plugins, autojump_clock, tmp_path) -> None:
    async with cluster(plugins, 4) as c:
        key = criterion_key("agent")
        author = Identity.from_seed(b"\7" * 32)
        agent = await Agent.open(c.nodes[3], identity=author)
        first = await agent.publish(key, b"a")
        second = await agent.publish(key, b"b")
        assert (first.command, second.command) == (1, 2)
        assert first.author == author.public_key
        await c.stop(3)
        await c.start(3)
        agent = await Agent.open(c.nodes[3], identity=author)
        third = await agent.publish(key, b"c")
        assert third.command == 3
        assert await agent.publish(key, b"b", command=2) == second

        filed = await Agent.open(c.nodes[3], identity=author, path=tmp_path / "counter")
        assert [await filed.next_command() for _ in range(3)] == [1, 2, 3]
        reopened = await Agent.open(c.nodes[3], identity=author,
                                           path=tmp_path / "counter")
        assert await reopened.next_command() == 4


# -- writers ------------------------------------------------------------------------


async def test_a_genesis_can_restrict_writers(plugins, autojump_clock) -> None:
    async with cluster(plugins, 4) as c:
        key = criterion_key("private")
        owner = c.nodes[0]
        await owner.publish(key, b"genesis", writers=[owner.identity.public_key])
        await owner.publish(key, b"mine")
        with pytest.raises(WriterNotAllowed):
            await c.nodes[1].publish(key, b"intruder")
        with pytest.raises(UsageError, match="genesis"):
            await owner.publish(key, b"again", writers=[owner.identity.public_key])
        assert [e.payload for e in await c.settle(key)] == [b"genesis", b"mine"]


# -- network-wide replication factor --------------------------------------------------


async def test_a_node_with_another_replication_factor_is_refused(
        plugins, autojump_clock) -> None:
    async with cluster(plugins, 4) as c:
        odd = await c.start(7, replication=5)
        await trio.sleep(3.0)
        assert odd.overlay is not None and odd.overlay.statistics().members == 0
        assert all(c.nodes[i].overlay.statistics().refused > 0 for i in range(1))
        key = criterion_key("r")
        with pytest.raises(QuorumUnavailable):
            await odd.publish(key, b"x", deadline=2.0)


# -- faults ----------------------------------------------------------------------------


async def test_publishing_through_loss_and_duplication(plugins, autojump_clock) -> None:
    faults = Faults(latency=0.005, jitter=0.01, loss=0.2, duplicate=0.2, reorder=0.2)
    async with cluster(plugins, 5, faults=faults, request_timeout=0.3) as c:
        key = criterion_key("lossy")
        acked = []
        for i in range(60):
            try:
                acked.append(await c.nodes[i % 5].publish(key, b"%d" % i, command=i))
            except ketten.Unavailable:
                pass
        chain = await c.settle(key, 30.0)
        assert len(acked) > 40
        for event in acked:
            assert chain[event.seq] == event
        assert len({(e.author, e.command) for e in chain}) == len(chain)


# -- group commit -----------------------------------------------------------------------


class CountingStore(ketten.plugins.memory_store.MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    async def append(self, events: Any) -> None:
        self.calls.append(len(events))
        await super().append(events)


async def test_concurrent_appends_share_store_transactions(autojump_clock) -> None:
    from ketten._node.local_chains import GroupCommit
    from ketten.errors import StoreConflict

    store = CountingStore()
    await store.open()
    commit = GroupCommit(store, lambda events: None)
    author = Identity.from_seed(b"\4" * 32)
    events = [Event.create(author, criterion=criterion_key(f"g{i}"), seq=0, prev=None,
                           payload=b"", time=0) for i in range(40)]
    clash = Event.create(author, criterion=criterion_key("g3"), seq=0, prev=None,
                         payload=b"clash", time=0)
    failures: list[Event] = []

    async def one(event: Event) -> None:
        try:
            await commit.append([event])
        except StoreConflict:
            failures.append(event)

    async with trio.open_nursery() as nursery:
        for event in events[:30]:
            nursery.start_soon(one, event)
    assert failures == []
    assert sum(store.calls) == 30
    assert len(store.calls) < 10 and max(store.calls) > 1  # waiting appends shared a write
    store.calls.clear()
    async with trio.open_nursery() as nursery:
        for event in events[30:]:
            nursery.start_soon(one, event)
        nursery.start_soon(one, clash)
    # A batch holding the clash is refused as a whole, then retried one by one:
    # only the clash fails.
    assert failures == [clash]
    for event in events:
        assert await store.head(event.criterion) == event


class GatedStore(ketten.plugins.memory_store.MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()

    async def append(self, events: Any) -> None:
        await self.gate.wait()
        await super().append(events)


async def test_group_commit_writes_what_it_took_and_drops_what_was_cancelled(
        autojump_clock) -> None:
    from ketten._node.local_chains import GroupCommit

    store = GatedStore()
    await store.open()
    reported: list[Event] = []
    commit = GroupCommit(store, reported.extend)
    author = Identity.from_seed(b"\5" * 32)
    events = [Event.create(author, criterion=criterion_key(f"c{i}"), seq=0, prev=None,
                           payload=b"", time=0) for i in range(4)]
    scopes = [trio.CancelScope() for _ in events]

    async def one(event: Event, scope: trio.CancelScope) -> None:
        with scope:
            await commit.append([event])

    async with trio.open_nursery() as nursery:
        for event, scope in zip(events, scopes, strict=True):
            nursery.start_soon(one, event, scope)
            await trio.testing.wait_all_tasks_blocked()
        # events[0] leads a transaction that waits in the store; the others are queued.
        scopes[0].cancel()  # taken by a transaction: written all the same
        scopes[1].cancel()  # still queued (and next to lead): taken out, not written
        await trio.testing.wait_all_tasks_blocked()
        store.gate.set()
    assert reported == [events[0], events[2], events[3]]
    for index, event in enumerate(events):
        assert await store.head(event.criterion) == (None if index == 1 else event)


# -- clocks --------------------------------------------------------------------------------


async def test_published_events_carry_clock_stamps_that_follow_causality(
        plugins, autojump_clock) -> None:
    from ketten.interfaces import ClockOrder

    async with cluster(plugins, 4) as c:
        for index in (4, 5):
            await c.start(index, clock="lamport")
        await trio.sleep(2.0)
        key = criterion_key("clocked")
        first = await c.nodes[4].publish(key, b"first")
        # Node 5 learns ``first`` (as a broker, or from a stale answer) and observes its stamp.
        second = await c.nodes[5].publish(key, b"second")
        clock = c.nodes[5].clock
        assert clock is not None and first.clock and second.clock
        assert clock.compare(first.clock, second.clock) is ClockOrder.BEFORE
        assert second.prev == first.hash


# -- the documented exception: one new criterion started on both sides of a partition ----


async def test_a_criterion_started_twice_is_settled_on_the_older_genesis(autojump_clock) -> None:
    recorder = ForkRecorder()
    pm = ketten.plugin_manager(extra=(recorder,))
    # A short creation memory: each side forgets the other's nodes before it publishes.
    async with cluster(pm, 7, evict_after=3.0, hysteresis=4.0,
                       options={"replication": {"creation_memory": 5.0}}) as c:
        key = criterion_key("started twice")
        c.network.cut([f"n:{i}" for i in (0, 1, 2)])
        await trio.sleep(10.0)  # each side's membership forgets the other side
        left = await c.nodes[0].publish(key, b"left")
        right = await c.nodes[4].publish(key, b"right")
        assert left.seq == right.seq == 0 and left.hash != right.hash
        c.heal()
        winner, loser = sorted([left, right], key=lambda e: (e.time, e.hash))
        assert winner == left  # started first
        with trio.fail_after(120):
            while True:
                await trio.sleep(1.0)
                # Every copy starts with the winner (a loser outside the final
                # configuration keeps no copy), and every member holds one.
                firsts = {i: (await c.nodes[i].store.range(key, 0, 1) or [None])[0]
                          for i in c.nodes}
                config = await c.nodes[3].configuration(key)
                members = {m.address for m in config.members()} if config else set()
                if (set(firsts.values()) - {None} == {winner}
                        and all(firsts[i] == winner for i in c.nodes
                                if c.nodes[i].address in members)):
                    break
        after = await c.nodes[3].publish(key, b"after the heal")
        chain = await c.settle(key, 60.0)
        assert chain[0] == winner and chain[-1] == after
        assert loser not in chain
        # The losing copy is reported, kept among the orphans, and counted.
        assert any(orphaned and orphaned[0] == loser.payload and head is None
                   for _, orphaned, head in recorder.resolved)
        yielded = [i for i, n in c.nodes.items() if n.replication_statistics().chains_yielded]
        assert yielded
        # A node remembers the chains it gave up across restarts: it refuses them.
        for i in yielded:
            assert key + loser.hash in await c.nodes[i].store.get_cursor("ketten/yielded")
        await c.stop(yielded[0])
        await c.start(yielded[0])
        again = await c.nodes[yielded[0]].publish(key, b"after a restart")
        chain = await c.settle(key, 60.0)
        assert chain[0] == winner and chain[-1] == again and loser not in chain


async def test_the_older_chain_wins_when_the_younger_holds_every_nearest_node(
        autojump_clock) -> None:
    # The younger chain was started on the r nodes nearest to the key; the older one
    # on nodes further away that the other side of the partition could see. A node
    # believes a rival held by one of the 2r nearest, so the older still wins.
    recorder = ForkRecorder()
    pm = ketten.plugin_manager(extra=(recorder,))
    async with cluster(pm, 7, evict_after=3.0, hysteresis=4.0,
                       options={"replication": {"creation_memory": 5.0}}) as c:
        key = next(k for k in (criterion_key(f"started twice {n}") for n in range(1000))
                   if set(c.brokers(k)) <= {3, 4, 5, 6})
        c.network.cut([f"n:{i}" for i in (0, 1, 2)])
        await trio.sleep(10.0)
        left = await c.nodes[0].publish(key, b"left")
        right = await c.nodes[4].publish(key, b"right")
        c.heal()
        assert min([left, right], key=lambda e: (e.time, e.hash)) == left
        with trio.fail_after(300):
            while True:
                await trio.sleep(1.0)
                firsts = {(await c.nodes[i].store.range(key, 0, 1) or [None])[0]
                          for i in c.nodes}
                if firsts - {None} == {left}:
                    break
        after = await c.nodes[5].publish(key, b"after the heal")
        chain = await c.settle(key, 60.0)
        assert chain[0] == left and chain[-1] == after and right not in chain


async def test_a_node_cut_off_from_the_nodes_near_a_key_does_not_start_its_chain(
        autojump_clock) -> None:
    # The overlays on both sides forget the other side; the nodes remember whom they
    # heard from, so only the side with most of the nodes nearest to the key may start
    # the chain, and the other side's publish fails without acknowledging anything.
    async with cluster(ketten.plugin_manager(), 7, evict_after=3.0, hysteresis=4.0) as c:
        key = criterion_key("started once")
        left, right = (0, 1, 2), (3, 4, 5, 6)
        nearest = sorted(c.nodes, key=lambda i: int.from_bytes(
            c.identity(i).node_id, "big") ^ int.from_bytes(key, "big"))[:3]
        majority_side = left if sum(i in left for i in nearest) >= 2 else right
        c.network.cut([f"n:{i}" for i in left])
        await trio.sleep(10.0)
        outcomes: dict[tuple[int, ...], Event | None] = {}
        for side in (left, right):
            try:
                outcomes[side] = await c.nodes[side[0]].publish(key, repr(side).encode(),
                                                                deadline=5.0)
            except QuorumUnavailable as exc:
                assert "heard from" in str(exc) or "answered" in str(exc)
                outcomes[side] = None
        started = outcomes[majority_side]
        assert started is not None and started.seq == 0
        assert [side for side, got in outcomes.items() if got is None] == [
            right if majority_side == left else left]
        c.heal()
        after = await c.nodes[3].publish(key, b"after the heal", deadline=30.0)
        chain = await c.settle(key, 60.0)
        assert chain[0] == started and chain[-1] == after


async def test_a_creation_whose_candidate_lost_once_can_still_be_finished(
        plugins, autojump_clock) -> None:
    # A candidate stood for a new chain, lost, and kept its configuration; the other
    # brokers heard of that configuration (it answers when asked where the chain is)
    # and so know "the chain exists". The same creation must still win their votes,
    # or the criterion keeps a chain by name only that nobody can ever lead.
    async with cluster(plugins, 5) as c:
        key = criterion_key("half made")
        brokers = c.brokers(key)
        members = tuple(Member(c.identity(i).public_key, f"n:{i}") for i in brokers)
        proposed = ChainConfig(1, members, (), -1, 0)
        candidate = brokers[2]
        for index in brokers[:2]:
            c.nodes[index]._sets.learn(key, Route(proposed, 1, None, None))
        assert await c.nodes[candidate]._replicator.campaign(key, proposed=proposed)
        event = await c.nodes[c.others(key)[0]].publish(key, b"first", deadline=5.0)
        assert event.seq == 0 and await c.settle(key) == [event]

    # A creation with another first configuration than the chain a broker knows of is
    # still refused: never a second chain.
    async with cluster(plugins, 5) as c:
        key = criterion_key("half made")
        brokers = c.brokers(key)
        members = tuple(Member(c.identity(i).public_key, f"n:{i}") for i in brokers)
        other = tuple(Member(c.identity(i).public_key, f"n:{i}") for i in c.others(key)[:1])
        known = ChainConfig(1, (*members[:2], *other), (), -1, 0)
        for index in brokers[:2]:
            c.nodes[index]._sets.learn(key, Route(known, 1, None, None))
        proposed = ChainConfig(1, members, (), -1, 0)
        assert not await c.nodes[brokers[2]]._replicator.campaign(key, proposed=proposed)


# -- operator recovery ------------------------------------------------------------------


async def test_operator_recovery_restarts_a_chain_that_lost_its_majority(
        plugins, autojump_clock) -> None:
    async with cluster(plugins, 6, options={"replication": {"allow_recovery": True}}) as c:
        key = criterion_key("recover me")
        publisher = c.others(key)[0]
        events = [await c.nodes[publisher].publish(key, b"%d" % i) for i in range(5)]
        await c.settle(key)
        brokers = c.brokers(key)
        survivor = brokers[0]
        for gone in brokers[1:]:
            await c.stop(gone)  # for good
        with pytest.raises((QuorumUnavailable, PublishOutcomeUnknown)):
            await c.nodes[publisher].publish(key, b"refused", deadline=3.0)
        before = await c.nodes[survivor].configuration(key)
        with pytest.raises(UsageError, match="confirm"):
            await c.nodes[survivor].recover(key, confirm="yes")
        config = await c.nodes[survivor].recover(key, confirm="may lose acknowledged events")
        assert before is not None and config.epoch == before.epoch + 1
        assert c.identity(survivor).public_key in config.voter_keys()
        assert len(config.voters) == 3
        after = await c.nodes[publisher].publish(key, b"after recovery", deadline=10.0)
        chain = await c.nodes[publisher].read(key)
        assert chain[:5] == events and chain[-1] == after
        assert c.nodes[survivor].replication_statistics().recoveries == 1


async def test_operator_recovery_is_off_by_default(plugins, autojump_clock) -> None:
    async with cluster(plugins, 4) as c:
        key = criterion_key("no recovery")
        await c.nodes[0].publish(key, b"x")
        broker = c.brokers(key)[0]
        with pytest.raises(UsageError, match="allow_recovery"):
            await c.nodes[broker].recover(key, confirm="may lose acknowledged events")


async def test_a_batch_never_holds_more_events_than_one_message_may_carry() -> None:
    """Appends to a catching-up broker and fetch replies are cut by bytes and by the
    event count a message may hold: small events used to fill a batch past it, the
    receiver refused the message, and a chain longer than that could be neither
    caught up by a new broker nor fetched by a reader."""
    from ketten._core.messages import MAX_EVENTS, AppendItem
    from ketten._node.local_chains import LocalChains
    from ketten.plugins.memory_store import MemoryStore

    author = Identity.from_seed(b"\x21" * 32)
    key = criterion_key("many small events")
    chain: list[Event] = []
    for n in range(MAX_EVENTS + 500):
        chain.append(Event.create(author, criterion=key, seq=n,
                                  prev=chain[-1].hash if chain else None,
                                  payload=b"%d" % n, time=n))
    store = MemoryStore()
    await store.open()
    await store.append(chain)
    chains = LocalChains(store, max_event_size=1 << 16)
    raws, more = await chains.read_batch(key, 0, 1 << 20)
    assert len(raws) == MAX_EVENTS and more
    assert sum(map(len, raws)) < 1 << 20, "the count, not the bytes, ended this batch"
    rest, more = await chains.read_batch(key, MAX_EVENTS, 1 << 20)
    assert len(rest) == 500 and not more
    config = ChainConfig(1, [Member(author.public_key, "n:0")])
    item = AppendItem(key, 1, None, None, tuple(raws), None, (config,), None)
    assert AppendItem.from_wire(item.to_wire()).events == tuple(raws)
    with pytest.raises(ketten.DecodeError, match="at most"):  # what a longer batch met
        AppendItem.from_wire(attrs.evolve(item, events=(*raws, *rest)).to_wire())


@pytest.mark.slow
async def test_a_chain_of_many_small_events_is_read_whole_by_a_node_without_a_copy(
        autojump_clock) -> None:
    async with open_cluster(4, seed=5) as c:
        key = criterion_key("long")
        brokers = c.brokers(key)
        reader = next(i for i in c.nodes if i not in brokers)
        for n in range(5000):
            await c.nodes[brokers[0]].publish(key, b"%d" % n)
        got = await c.nodes[reader].read(key, deadline=60.0)
        assert [e.seq for e in got] == list(range(5000))
