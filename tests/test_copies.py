"""Reader copies: a node keeps copies of chains it does not replicate within
``copies_events``, dropping the least recently used, never a pinned one, one
with a subscription open, one being read, or a chain it replicates."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from ketten import Event, Node, criterion_key
from ketten._core.copies import CopyBudget
from ketten.errors import PublishOutcomeUnknown, QuorumUnavailable
from ketten.plugins.file_store import FileStore
from ketten.testing import Cluster, open_cluster

# -- the budget on its own ----------------------------------------------------------


def test_budget_gives_up_the_least_recently_used_copies_first() -> None:
    budget = CopyBudget(max_events=10)
    a, b, c = b"a" * 32, b"b" * 32, b"c" * 32
    nothing_kept = lambda key: False  # noqa: E731
    assert not budget.note(a, 4)
    assert not budget.note(b, 4)
    assert budget.note(c, 4)  # 12 > 10
    assert budget.surplus(nothing_kept) == [a]
    budget.touch(a)  # read again: b is the oldest now
    assert budget.surplus(nothing_kept) == [b]
    # A kept copy (pinned, subscribed) neither counts nor goes: 8 events fit.
    assert budget.surplus(lambda key: key == b) == []
    budget.note(c, 7)  # a copy's size is replaced, not added: 15
    assert budget.total == 15 and len(budget) == 3
    assert budget.surplus(lambda key: key == b) == [a]
    # A copy being read counts but is passed over, until every read of it ended.
    budget.use(a)
    budget.use(a)
    assert budget.surplus(nothing_kept) == [b, c]
    budget.done(a)
    assert budget.in_use(a)
    budget.done(a)
    assert not budget.in_use(a)
    assert budget.surplus(nothing_kept) == [b, c]  # a was touched by its reads
    budget.forget(b)
    assert budget.total == 11 and b not in budget
    assert budget.surplus(nothing_kept) == [c]
    budget.note(a, 30)
    assert budget.surplus(nothing_kept) == [c, a]  # everything, if need be


def test_kept_copies_over_the_bound_do_not_wake_the_collector_again_and_again() -> None:
    budget = CopyBudget(max_events=10)
    pinned, other = b"p" * 32, b"o" * 32
    keep = lambda key: key == pinned  # noqa: E731
    assert budget.note(pinned, 50)  # not yet known to be kept: it counts
    assert budget.surplus(keep) == []
    assert not budget.over()
    for size in range(51, 60):  # the pinned copy grows: nothing to collect
        assert not budget.note(pinned, size)
    assert not budget.note(other, 10)
    assert budget.note(other, 11)  # the copies that count are over the bound
    assert budget.surplus(keep) == [other]
    budget.forget(pinned)  # replicated now, say
    assert budget.total == 11 and budget.over()
    assert budget.surplus(lambda key: False) == [other]


def test_budget_of_zero_keeps_only_copies_in_use() -> None:
    budget = CopyBudget(max_events=0)
    a = b"a" * 32
    budget.use(a)
    assert budget.note(a, 1)
    assert budget.surplus(lambda key: False) == []
    budget.done(a)
    assert budget.surplus(lambda key: False) == [a]


# -- on a network -------------------------------------------------------------------


def _outside(cluster: Cluster, reader: int, count: int) -> list[str]:
    """``count`` criterion names that node ``reader`` is no broker of."""
    names = []
    for n in range(200):
        name = f"copy-{n}"
        if reader in cluster.others(criterion_key(name)):
            names.append(name)
            if len(names) == count:
                return names
    raise AssertionError("too few criteria outside the reader's replica sets")


async def _fill(cluster: Cluster, writer: int, names: list[str], count: int) -> None:
    """Publish ``count`` events on each name; again with the same command id while the
    outcome is open (disk stores work in threads, beside the virtual clock)."""
    for name in names:
        for n in range(count):
            while True:
                try:
                    await cluster.nodes[writer].publish(
                        name, b"%s-%d" % (name.encode(), n), command=n)
                    break
                except (PublishOutcomeUnknown, QuorumUnavailable):
                    await trio.sleep(1)


async def _until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait (virtual time) until ``condition()`` holds: a drop happens after the read
    that caused it, in the node's own task."""
    for _ in range(600):
        if await condition():
            return
        await trio.sleep(0.1)
    raise AssertionError(f"not within 60 s: {what}")


async def _gone(node: Node, name: str) -> bool:
    return await node.store.head(criterion_key(name)) is None


async def test_reads_keep_copies_within_the_bound_least_recently_used_going_first(
        autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(5, seed=31, options={"replication": {"copies_events": 50}}) as c:
        reader = 4
        a, b, d = _outside(c, reader, 3)
        writer = next(i for i in c.brokers(criterion_key(a)) if i != reader)
        await _fill(c, writer, [a, b, d], 30)
        node = c.nodes[reader]
        store = node.store

        assert [e.payload for e in await node.read(a)] == [b"%s-%d" % (a.encode(), n)
                                                           for n in range(30)]
        assert (await store.head(criterion_key(a))).seq == 29  # kept as a copy
        await node.read(b)  # 60 events in copies: a, the least recently used, goes
        await trio.sleep(1)
        assert await store.head(criterion_key(a)) is None
        assert (await store.head(criterion_key(b))).seq == 29
        stats = node.copy_statistics()
        assert (stats.copies, stats.copy_events) == (1, 30)
        assert (stats.copies_dropped, stats.copy_events_dropped) == (1, 30)

        # A dropped copy is read again from the brokers, whole.
        again = await node.read(a)
        assert len(again) == 30 and again[-1].seq == 29
        await trio.sleep(1)
        assert await store.head(criterion_key(b)) is None  # now b was the oldest

        # A pinned copy stays, whatever the bound; unpinned it counts again.
        await node.pin(a)
        await node.read(b)
        await node.read(d)
        await trio.sleep(1)
        assert (await store.head(criterion_key(a))).seq == 29
        assert await store.head(criterion_key(b)) is None
        assert (await store.head(criterion_key(d))).seq == 29
        await node.unpin(a)
        await trio.sleep(1)
        assert await store.head(criterion_key(a)) is None
        assert node.copy_statistics().copy_events <= 50

        # The brokers gave up nothing: they replicate these chains.
        for name in (a, b, d):
            assert reader not in c.brokers(criterion_key(name))
            for index in c.brokers(criterion_key(name)):
                head = await c.nodes[index].store.head(criterion_key(name))
                assert head is not None and head.seq == 29
                assert c.nodes[index].copy_statistics().copies_dropped == 0


async def test_pins_hold_across_restarts_and_subscriptions_keep_their_copies(
        autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(5, seed=32, options={"replication": {"copies_events": 20}}) as c:
        await _pins_and_subscriptions(c)


@pytest.mark.parametrize("store", ["sqlite", "file"])
async def test_pins_and_subscriptions_on_disk_stores(store: str, tmp_path: Path) -> None:
    # Real time: the disk stores work in threads, which a virtual clock would outrun.
    async with open_cluster(5, seed=32, store=store, path=str(tmp_path),
                            options={"replication": {"copies_events": 20}}) as c:
        await _pins_and_subscriptions(c)


async def _pins_and_subscriptions(c: Cluster) -> None:
    reader = 3
    a, b, d, e = _outside(c, reader, 4)
    writer = next(i for i in c.brokers(criterion_key(a)) if i != reader)
    await _fill(c, writer, [a, b, d, e], 15)
    node = c.nodes[reader]
    await node.read(a)
    await node.pin(a)
    await c.stop(reader)
    node = await c.start(reader)
    assert node.copy_statistics().pinned == 1
    await node.read(b)  # the pinned copy does not count: 15 events fit
    await trio.sleep(1)
    assert (await node.store.head(criterion_key(a))).seq == 14
    assert (await node.store.head(criterion_key(b))).seq == 14

    got: list[Event] = []
    async with trio.open_nursery() as nursery, node.subscribe(d, start=0) as sub:

        async def take() -> None:
            async for event in sub:
                got.append(event)

        nursery.start_soon(take)
        await _until(lambda: _delivered(got, 15), "the subscription delivered d")
        assert (await node.store.head(criterion_key(d))).seq == 14
        await node.read(e)  # over the bound: b goes; d is subscribed, a pinned
        await _until(lambda: _gone(node, b), "b was dropped")
        assert (await node.store.head(criterion_key(d))).seq == 14
        assert (await node.store.head(criterion_key(e))).seq == 14
        nursery.cancel_scope.cancel()
    assert (await node.store.head(criterion_key(a))).seq == 14
    assert node.copy_statistics().copies_dropped == 1


async def _delivered(got: list[Event], count: int) -> bool:
    await trio.lowlevel.checkpoint()
    return len(got) >= count


def test_pins_are_read_from_cursors_and_junk_is_passed_over() -> None:
    from ketten._node.copies import PIN_PREFIX, pins_of

    key = b"k" * 32
    found = pins_of({PIN_PREFIX + key.hex(): b"\x01", PIN_PREFIX + "zz": b"\x01",
                     PIN_PREFIX + "ab": b"\x01", PIN_PREFIX + (b"u" * 32).hex(): b"",
                     PIN_PREFIX + (b"v" * 32).hex(): b"\x07"})
    assert found == {key}


async def test_dropped_copies_give_their_disk_space_back_on_the_file_store(
        tmp_path: Path) -> None:
    # Real time: the file store works in threads, which a virtual clock would outrun.
    async with open_cluster(5, seed=33, store="file", path=str(tmp_path),
                            options={"replication": {"copies_events": 20},
                                     "store": {"segment_bytes": 4096}}) as c:
        reader = 2
        names = _outside(c, reader, 8)
        writer = next(i for i in c.brokers(criterion_key(names[0])) if i != reader)
        await _fill(c, writer, names, 15)
        node = c.nodes[reader]
        store = node.store
        assert isinstance(store, FileStore)
        assert store.log_bytes == 0  # it replicates none of these chains
        read = 0
        for name in names:
            events = await node.read(name)
            assert len(events) == 15
            read += sum(len(e.to_bytes()) for e in events)
            await _until(lambda: _within(node, 20), "the copies were trimmed")
        assert node.copy_statistics().copies_dropped == 7
        # Eight chains were read; little more than the one kept stays on disk.
        assert store.live_bytes < read / 6
        assert store.log_bytes < read / 2, (store.log_bytes, store.live_bytes, read)


async def _within(node: Node, events: int) -> bool:
    await trio.lowlevel.checkpoint()
    return node.copy_statistics().copy_events <= events


async def test_a_store_that_fails_to_drop_a_copy_does_not_stop_the_node(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    async with open_cluster(5, seed=34, options={"replication": {"copies_events": 10}}) as c:
        reader = 4
        a, b = _outside(c, reader, 2)
        writer = next(i for i in c.brokers(criterion_key(a)) if i != reader)
        await _fill(c, writer, [a, b], 8)
        node = c.nodes[reader]

        async def broken(self: object, criterion: bytes) -> int:
            raise RuntimeError("a bug in the store plugin")

        monkeypatch.setattr(type(node.store), "drop", broken)  # only readers ever drop
        assert len(await node.read(a)) == 8
        assert len(await node.read(b)) == 8  # 16 > 10: a should go, but the store fails
        await trio.sleep(1)
        assert "a bug of the store" in caplog.text
        assert (await node.store.head(criterion_key(a))).seq == 7
        stats = node.copy_statistics()
        assert (stats.copies, stats.copies_dropped) == (2, 0)
        # The node goes on serving; once the store works again the copy goes.
        monkeypatch.undo()
        assert len(await node.read(b)) == 8
        await _until(lambda: _dropped(node, 1), "a was dropped")
        assert await _gone(node, a)


async def _dropped(node: Node, copies: int) -> bool:
    await trio.lowlevel.checkpoint()
    return node.copy_statistics().copies_dropped >= copies


# -- former brokers --------------------------------------------------------------------


async def test_a_broker_the_chain_moved_away_from_keeps_it_only_as_a_reader_copy(
        autojump_clock: trio.testing.MockClock) -> None:
    """When a move is committed, its leader tells the brokers it left out to retire:
    they stop replicating the chain and keep its committed events as a reader's
    copy, within ``copies_events``. Nothing acknowledged is lost, the former broker
    still reads the chain, and when the chain moves back it catches up again."""
    async with open_cluster(4, seed=33, hysteresis=4.0, evict_after=3.0,
                            options={"replication": {"copies_events": 10}}) as c:
        newcomer = c.identity(9)
        key = newcomer.node_id  # the newcomer will be the closest node to this key
        events = [await c.nodes[i % 4].publish(key, b"%d" % i, command=i) for i in range(25)]
        before = c.brokers(key)
        await c.start(9)
        await c.moved(key)
        assert await c.settle(key) == events
        (former,) = [i for i in before if i not in c.brokers(key)]
        node = c.nodes[former]
        await _until(lambda: _retired(node, key), "the former broker retired")
        assert node.replication_statistics().retirements == 1
        # Loaded for its term and vote alone (a peer's query does that), the retired
        # state does not keep the copy.
        assert (await node._replicator.replica(key)) is not None
        # 25 events are more than its copies may hold: the copy went.
        await _until(lambda: _gone_key(node, key), "the former broker's copy was dropped")
        assert node.copy_statistics().copy_events_dropped == 25
        for index in c.brokers(key):
            assert c.nodes[index].replication_statistics().retirements == 0
            assert await c.chain(index, key) == events

        # Publishing goes on, and the former broker reads the whole chain.
        events.append(await c.nodes[former].publish(key, b"after the move"))
        assert await node.read(key) == events

        # The newcomer goes: the chain moves back, and the former broker catches up.
        await c.stop(9)
        await c.moved(key)
        assert former in c.brokers(key)
        assert await c.settle(key, 30.0) == events
        assert await c.chain(former, key) == events
        configuration = await node.configuration(key)
        assert configuration is not None
        assert c.identity(former).public_key in configuration.voter_keys()


async def _retired(node: Node, key: bytes) -> bool:
    return node.replication_statistics().retirements > 0


async def _gone_key(node: Node, key: bytes) -> bool:
    return await node.store.head(key) is None


async def test_when_the_whole_replica_set_moves_every_old_broker_retires(
        autojump_clock: trio.testing.MockClock) -> None:
    """Three closer nodes join: the chain moves to them whole. The brokers left out
    are told to retire, and the old leader, which hands the chain over, retires by
    itself (nobody else would tell it)."""
    async with open_cluster(4, seed=0, hysteresis=4.0) as c:
        ids = {i: int.from_bytes(c.identity(i).node_id, "big") for i in (0, 1, 2, 3, 9, 10, 11)}
        key = next(k for k in (criterion_key(f"whole-{n}") for n in range(10_000))
                   if set(sorted(ids, key=lambda i: ids[i] ^ int.from_bytes(k, "big"))[:3])
                   == {9, 10, 11})
        events = [await c.nodes[i % 4].publish(key, b"%d" % i, command=i) for i in range(12)]
        before = c.brokers(key)
        (leader,) = [i for i in before if c.nodes[i].replication_statistics().chains_led]
        for index in (9, 10, 11):
            await c.start(index)
        await c.moved(key)
        assert sorted(c.brokers(key)) == [9, 10, 11]
        assert await c.settle(key) == events
        for index in before:
            await _until(lambda index=index: _retired(c.nodes[index], key),  # type: ignore[misc]
                         f"broker {index} retired (the leader was {leader})")
            assert await c.nodes[index].configuration(key) is not None  # it still finds it
        events.append(await c.nodes[leader].publish(key, b"after the move"))
        assert await c.settle(key) == events
        for index in before:
            assert await c.nodes[index].read(key) == events


async def test_a_broker_that_missed_its_retire_message_is_told_again_by_digest(
        autojump_clock: trio.testing.MockClock) -> None:
    """A broker that was down while the chain moved without it comes back believing
    it is a member; the leader answers its next digest with a retire message."""
    async with open_cluster(4, seed=33, hysteresis=4.0, evict_after=3.0) as c:
        newcomer = c.identity(9)
        key = newcomer.node_id
        events = [await c.nodes[i % 4].publish(key, b"%d" % i, command=i) for i in range(10)]
        before = c.brokers(key)
        await c.start(9)
        stays = c.brokers(key)
        (former,) = [i for i in before if i not in stays]
        await c.stop(former)
        await c.moved(key)
        assert await c.settle(key) == events
        await trio.sleep(30)  # the move is committed: its retire message went nowhere
        node = await c.start(former)
        assert node.replication_statistics().retirements == 0
        await _until(lambda: _retired(node, key), "the returning broker retired")
        assert await node.read(key) == events
