"""The ipfs overlay on real nodes over the memory transport (virtual time): provider
records, chains fetched from several providers, hostile and silent providers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pluggy
import pytest
import trio
import trio.testing

import ketten
from ketten import ConfigError, Event, Identity, criterion_key
from ketten.errors import QuorumUnavailable
from ketten.interfaces import Peer
from ketten.plugins.ipfs import IpfsOptions, IpfsOverlay
from ketten.testing import Cluster, open_cluster

NAME = "ipfs-chain"
KEY = criterion_key(NAME)


def overlay_of(node: ketten.Node) -> IpfsOverlay:
    overlay = node.overlay
    assert isinstance(overlay, IpfsOverlay)
    return overlay


async def publish(cluster: Cluster, count: int) -> list[Event]:
    for n in range(count):
        await cluster[0].publish(NAME, b"event %d" % n, command=n, deadline=30.0)
    return await cluster[0].read(NAME, deadline=30.0)


def reader_of(cluster: Cluster) -> ketten.Node:
    brokers = set(cluster.brokers(KEY))
    return next(cluster[i] for i in sorted(cluster.nodes) if i not in brokers)


async def test_brokers_provide_their_chains_and_a_reader_fetches_from_several(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(8, plugins=plugins, overlay="ipfs", settle=5.0,
                            options={"overlay": {"segment": 16}}) as cluster:
        chain = await publish(cluster, 120)
        await trio.sleep(5.0)  # announcements go out
        reader = reader_of(cluster)
        overlay = overlay_of(reader)
        providers = await overlay.find_providers(KEY)
        brokers = {cluster.identity(i).public_key for i in cluster.brokers(KEY)}
        assert brokers <= {p.public_key for p in providers}
        head = chain[-1]
        fetched = await overlay.fetch_chain(KEY, head=(head.seq, head.hash))
        assert fetched == chain
        served = [overlay_of(cluster[i]).statistics().blocks_served for i in cluster.nodes]
        assert sum(1 for s in served if s) >= 2, served  # segments came from several
        assert overlay.statistics().blocks_fetched == len(chain)
        # Only what follows a held event is fetched.
        more = await overlay.fetch_chain(KEY, head=(head.seq, head.hash), after=chain[99])
        assert more == chain[100:]
        # Without a head: the highest tip named, every signature checked.
        assert await overlay.fetch_chain(KEY) == chain


async def test_a_reader_that_fetched_a_chain_provides_it(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(8, plugins=plugins, overlay="ipfs", settle=5.0) as cluster:
        chain = await publish(cluster, 30)
        await trio.sleep(5.0)
        reader = reader_of(cluster)
        await overlay_of(reader).fetch_chain(KEY, head=(chain[-1].seq, chain[-1].hash))
        await trio.sleep(5.0)
        others = [cluster[i] for i in cluster.nodes if cluster[i] is not reader]
        found = await overlay_of(others[-1]).find_providers(KEY)
        assert reader.identity.public_key in {p.public_key for p in found}
        # It serves the chain alone.
        again = await overlay_of(others[-1]).fetch_chain(
            KEY, head=(chain[-1].seq, chain[-1].hash),
            providers=[Peer(reader.address, reader.identity.public_key)])
        assert again == chain


@attrs.define(eq=False)
class LyingIpfs(IpfsOverlay):
    """Serves every block with one byte changed."""

    async def _want(self, key: bytes, root: bytes, seq: int, count: int) -> list[bytes]:
        blocks = await super()._want(key, root, seq, count)
        return [data[:-1] + bytes([data[-1] ^ 0x55]) for data in blocks]


class LiarPlugin:
    @ketten.hookimpl
    def ketten_make_overlay(self, name: str, options: Mapping[str, Any],
                            node: ketten.Node) -> Any:
        if name != "lying-ipfs":
            return None
        return LyingIpfs(node=node, options=IpfsOptions.parse(options, node.config.replication))

    @ketten.hookimpl
    def ketten_plugin_names(self) -> Mapping[str, list[str]]:
        return {"overlay": ["lying-ipfs"]}

    @ketten.hookimpl
    def ketten_plugin_spec(self, kind: str, name: str) -> ketten.PluginSpec | None:
        if (kind, name) != ("overlay", "lying-ipfs"):
            return None
        from ketten.plugins.ipfs import ketten_plugin_spec

        return ketten_plugin_spec(kind="overlay", name="ipfs")


async def test_wrong_blocks_are_rejected_and_fetched_from_an_honest_provider(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    plugins.register(LiarPlugin())
    async with open_cluster(7, plugins=plugins, overlay="ipfs", settle=5.0,
                            options={"overlay": {"segment": 8}}) as cluster:
        chain = await publish(cluster, 60)
        head = (chain[-1].seq, chain[-1].hash)
        liar = await cluster.start(7, overlay="lying-ipfs")
        await overlay_of(liar).fetch_chain(KEY, head=head)  # it holds the chain, honestly
        reader = reader_of(cluster)
        honest = [Peer(cluster[i].address, cluster.identity(i).public_key)
                  for i in cluster.brokers(KEY)]
        providers = [Peer(liar.address, liar.identity.public_key), *honest]
        fetched = await overlay_of(reader).fetch_chain(KEY, head=head, providers=providers)
        assert fetched == chain
        stats = overlay_of(reader).statistics()
        assert stats.blocks_rejected >= 1
        assert overlay_of(liar).statistics().blocks_served >= 1


async def test_a_silent_provider_does_not_stall_a_fetch(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(6, plugins=plugins, overlay="ipfs", settle=5.0,
                            options={"overlay": {"segment": 8, "rpc_timeout": 1.0}}) as cluster:
        chain = await publish(cluster, 40)
        head = (chain[-1].seq, chain[-1].hash)
        reader = reader_of(cluster)
        silent = Peer("n:nobody", Identity.from_seed(b"\x01" * 32).public_key)
        honest = [Peer(cluster[i].address, cluster.identity(i).public_key)
                  for i in cluster.brokers(KEY)]
        started = trio.current_time()
        fetched = await overlay_of(reader).fetch_chain(KEY, head=head,
                                                       providers=[silent, *honest],
                                                       timeout=60.0)
        assert fetched == chain
        assert trio.current_time() - started < 10.0
        # Only silent providers: a clear error at the deadline, not a hang.
        with pytest.raises(QuorumUnavailable):
            await overlay_of(reader).fetch_chain(KEY, head=head, providers=[silent],
                                                 timeout=5.0)


async def test_provider_records_lapse_when_not_renewed(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(6, plugins=plugins, overlay="ipfs", settle=5.0,
                            options={"overlay": {"provider_ttl": 60.0,
                                                 "republish_interval": 20.0}}) as cluster:
        await publish(cluster, 5)
        await trio.sleep(5.0)
        reader = reader_of(cluster)
        brokers = cluster.brokers(KEY)
        gone = brokers[0]
        key_gone = cluster.identity(gone).public_key
        assert key_gone in {p.public_key for p in await overlay_of(reader).find_providers(KEY)}
        await trio.sleep(100.0)  # renewed meanwhile
        assert key_gone in {p.public_key for p in await overlay_of(reader).find_providers(KEY)}
        await cluster.stop(gone)
        await trio.sleep(70.0)
        found = {p.public_key for p in await overlay_of(reader).find_providers(KEY)}
        assert key_gone not in found
        assert {cluster.identity(i).public_key for i in brokers[1:]} <= found


async def test_hostile_requests_end_the_request_not_the_node(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(4, plugins=plugins, overlay="ipfs", settle=5.0) as cluster:
        chain = await publish(cluster, 5)
        target = cluster[cluster.brokers(KEY)[0]]
        asker = cluster[next(i for i in cluster.nodes if cluster[i] is not target)]
        bad = [
            {"op": "want", "key": KEY, "root": b"x" * 36, "seq": -1, "count": 1},
            {"op": "want", "key": KEY, "root": b"x" * 36, "seq": 0, "count": 10**9},
            {"op": "have", "key": KEY, "root": b"x" * 36, "seq": 0, "stride": 0, "count": 1},
            {"op": "tip", "key": b"k" * 1000},
            {"op": "provide"},
            {"op": "no-such-op"},
            ["not", "a", "map"],
        ]
        for body in bad:
            with pytest.raises(ketten.KettenError):
                await asker.request(target.address, "ipfs", body, timeout=5.0)
        # Nothing held at an unknown CID or seq: empty answers, no error.
        _, answer = await asker.request(target.address, "ipfs", {
            "op": "want", "key": KEY, "root": b"x" * 36, "seq": 3, "count": 4}, timeout=5.0)
        assert answer == {"blocks": []}
        _, answer = await asker.request(target.address, "ipfs", {
            "op": "want", "key": KEY, "root": b"x" * 36, "seq": 10**6, "count": 4}, timeout=5.0)
        assert answer == {"blocks": []}
        assert await overlay_of(asker).fetch_chain(
            KEY, head=(chain[-1].seq, chain[-1].hash)) == chain


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="republish_interval"):
        IpfsOptions.parse({"provider_ttl": 10.0, "republish_interval": 20.0}, 3)
    with pytest.raises(ConfigError, match="segment"):
        IpfsOptions.parse({"segment": 0}, 3)
    with pytest.raises(ConfigError, match="unknown kademlia options"):
        IpfsOptions.parse({"no_such": 1}, 3)
    parsed = IpfsOptions.parse({"k": 8, "segment": 64, "provider_ttl": 100.0}, 3)
    assert parsed.kademlia.k == 8 and parsed.segment == 64
    assert parsed.republish_interval == 50.0


def long_chain(count: int) -> list[Event]:
    author = Identity.from_seed(b"\x42" * 32)
    events: list[Event] = []
    prev = None
    for seq in range(count):
        event = Event.create(author, criterion=KEY, seq=seq, prev=prev,
                             payload=b"block %d" % seq, time=seq)
        events.append(event)
        prev = event.hash
    return events


async def read_scaling(plugins: pluggy.PluginManager, *, nodes: int, events: int,
                       readers: int, waves: int) -> float:
    """``readers`` nodes fetch a chain of ``events`` events that 3 nodes hold, in
    ``waves`` (readers of a wave at once); the largest share of the blocks served
    that any one node served."""
    chain = long_chain(events)
    head = (chain[-1].seq, chain[-1].hash)
    async with open_cluster(nodes, plugins=plugins, overlay="ipfs", settle=10.0,
                            options={"overlay": {"rpc_timeout": 2.0}}) as cluster:
        holders = [cluster[i] for i in range(3)]
        for holder in holders:
            overlay_of(holder).add_chain(chain, pin=True)
        await trio.sleep(10.0)
        chosen = [cluster[i] for i in range(nodes - readers, nodes)]
        got: dict[int, list[Event]] = {}
        per_wave = -(-readers // waves)
        for wave in range(waves):
            async with trio.open_nursery() as nursery:
                for n, reader in enumerate(chosen[wave * per_wave:(wave + 1) * per_wave]):
                    async def read(index: int = wave * per_wave + n,
                                   node: ketten.Node = reader) -> None:
                        got[index] = await overlay_of(node).fetch_chain(KEY, head=head,
                                                                        timeout=300.0)
                    nursery.start_soon(read)
            await trio.sleep(10.0)  # the wave's readers announce themselves
        assert len(got) == readers and all(events_ == chain for events_ in got.values())
        served = [overlay_of(cluster[i]).statistics().blocks_served for i in cluster.nodes]
        total = sum(served)
        assert total >= readers * events
        assert sum(1 for s in served if s) > 3  # readers served other readers
        return max(served) / total


async def test_readers_spread_the_load_beyond_the_first_providers(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    share = await read_scaling(plugins, nodes=40, events=2000, readers=12, waves=3)
    # If only the 3 holders served, one of them would serve at least a third of the
    # blocks; readers serving later readers bring it to about 0.2 (0.18-0.22 seen).
    assert share <= 0.28, share


@pytest.mark.sim
async def test_fifty_readers_of_a_ten_thousand_event_chain_among_two_hundred_nodes(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    share = await read_scaling(plugins, nodes=200, events=10_000, readers=50, waves=5)
    assert share <= 0.15, share


async def test_node_read_fetches_a_long_stretch_from_providers_and_a_short_tail_from_brokers(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(8, plugins=plugins, overlay="ipfs", settle=5.0,
                            options={"overlay": {"segment": 64}}) as cluster:
        chain = await publish(cluster, 300)
        await trio.sleep(5.0)
        reader = reader_of(cluster)
        assert await reader.read(NAME, deadline=30.0) == chain
        stats = overlay_of(reader).statistics()
        assert stats.fetches == 1 and stats.blocks_fetched == 300
        assert [e async for e in reader.replay(NAME)] == chain  # kept as the reader's copy
        for n in range(300, 310):
            await cluster[0].publish(NAME, b"event %d" % n, command=n, deadline=30.0)
        assert len(await reader.read(NAME, deadline=30.0)) == 310
        assert overlay_of(reader).statistics().fetches == 1  # ten events: from a broker
        # The reader's copy is in its store: it provides the chain from there.
        await trio.sleep(5.0)
        found = await overlay_of(cluster[0]).find_providers(KEY)
        assert reader.identity.public_key in {p.public_key for p in found}


async def test_head_records_name_the_committed_head_and_a_newer_one_replaces_it(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(7, plugins=plugins, overlay="ipfs", settle=5.0,
                            options={"overlay": {"head_interval": 5.0}}) as cluster:
        chain = await publish(cluster, 20)
        await trio.sleep(12.0)
        reader = reader_of(cluster)
        record = await overlay_of(reader).head_record(KEY)
        assert record is not None and record.event == chain[-1]
        assert sum(overlay_of(cluster[i]).statistics().head_records
                   for i in cluster.nodes) >= 3
        more = [await cluster[0].publish(NAME, b"more %d" % n, command=100 + n)
                for n in range(5)]
        await trio.sleep(12.0)
        record = await overlay_of(reader).head_record(KEY)
        assert record is not None and record.event == more[-1]
        # Without a head, a fetch goes up to the newest head record.
        assert await overlay_of(reader).fetch_chain(KEY) == chain + more
        # A broker's commit mark, a reader's copy: both only committed positions.
        broker = cluster[cluster.brokers(KEY)[0]]
        assert await broker.local_commit(NAME) == (more[-1].seq, more[-1].hash)
        # The reader's copy (from an earlier read, or none) is committed as far as it goes.
        before = await reader.local_commit(NAME)
        assert before is None or (before[1] == (chain + more)[before[0]].hash)
        await reader.read(NAME)
        assert await reader.local_commit(NAME) == (more[-1].seq, more[-1].hash)


async def test_forged_or_stale_head_records_are_refused(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    from ketten.ipld import event_block

    async with open_cluster(4, plugins=plugins, overlay="ipfs", settle=5.0,
                            options={"overlay": {"head_interval": 5.0}}) as cluster:
        chain = await publish(cluster, 3)
        await trio.sleep(12.0)
        target = cluster[cluster.brokers(KEY)[0]]
        asker = cluster[next(i for i in cluster.nodes if cluster[i] is not target)]
        blocks = [event_block(chain[0], None)]
        for event in chain[1:]:
            blocks.append(event_block(event, blocks[-1].binary))

        async def put(key: bytes, cid: bytes, data: bytes) -> Any:
            _, answer = await asker.request(target.address, "ipfs", {
                "op": "put_head", "key": key, "cid": cid, "block": data}, timeout=5.0)
            return answer

        # An older head is not taken; the record held stays.
        assert await put(KEY, blocks[1].binary, blocks[1].data) == {"ok": False}
        for key, cid, data in [
            (KEY, blocks[1].binary, blocks[2].data),          # not the CID's block
            (criterion_key("other"), blocks[2].binary, blocks[2].data),  # another chain's
        ]:
            with pytest.raises(ketten.KettenError):
                await put(key, cid, data)
        forger = Identity.from_seed(b"\x66" * 32)
        forged = Event.create(forger, criterion=KEY, seq=50, prev=chain[-1].hash,
                              payload=b"forged", time=1)
        tampered = attrs.evolve(forged, sig=bytes(64))
        bad = event_block(tampered, blocks[-1].binary)
        with pytest.raises(ketten.KettenError):
            await put(KEY, bad.binary, bad.data)  # a signature that does not verify
        _, answer = await asker.request(target.address, "ipfs", {"op": "get_head", "key": KEY},
                                        timeout=5.0)
        assert answer["cid"] == blocks[-1].binary


async def test_a_dropped_reader_copy_is_no_longer_provided(
        plugins: pluggy.PluginManager, autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(8, plugins=plugins, overlay="ipfs", settle=5.0,
                            options={"replication": {"copies_events": 40}}) as cluster:
        outside = [i for i in sorted(cluster.nodes) if i not in cluster.brokers(KEY) and i]
        other, index = next((name, i) for name in (f"other-{n}" for n in range(100))
                            for i in outside if i not in cluster.brokers(criterion_key(name)))
        reader = cluster[index]
        await publish(cluster, 30)
        for n in range(30):
            await cluster[0].publish(other, b"other %d" % n, command=n, deadline=30.0)

        def providing() -> int:
            return overlay_of(reader).statistics().providing

        before = providing()
        assert len(await reader.read(NAME)) == 30
        await trio.sleep(5.0)
        assert providing() == before + 1
        assert len(await reader.read(other)) == 30  # 60 events in copies: NAME's goes
        await trio.sleep(5.0)
        assert await reader.store.head(KEY) is None
        assert reader.copy_statistics().copies_dropped == 1
        assert providing() == before + 1  # other's, no longer NAME's
        assert overlay_of(reader).tip(KEY) is None
