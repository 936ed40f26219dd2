"""One author starts chains as fast as it can, on loopback TCP: each broker lets it
start a burst, then a few per second, and refuses the rest with a clear error
that stores nothing; other authors keep starting theirs."""

from __future__ import annotations

import pluggy
import pytest
from hostile import HostilePeer

from ketten import (
    ConfigError,
    Event,
    Identity,
    NodeConfig,
    QuotaExceeded,
    criterion_key,
    open_node,
)
from ketten._core.membership import Member
from ketten._core.messages import Answer, Offer, OfferItem, OfferReply
from ketten.adapters.memory import MemoryNetwork
from ketten.testing import open_cluster
from ketten.wire import decode_message


async def test_one_author_starts_a_bounded_number_of_chains(
    plugins: pluggy.PluginManager,
) -> None:
    burst = 10
    limits = {"replication": {"creation_burst": burst, "creations_per_second": 0.01}}
    async with open_cluster(4, plugins=plugins, transport="tcp", overlay="static",
                            settle=1.0, options=limits) as c:
        flooder, other = c.nodes[0], c.nodes[1]
        started, refused = [], []
        for i in range(80):
            key = criterion_key(f"flood {i}")
            try:
                await flooder.publish(key, b"genesis")
                started.append(key)
            except QuotaExceeded as exc:
                assert "chains at this broker" in str(exc) and "nothing was stored" in str(exc)
                refused.append(key)
        # Each of the four brokers lets the author start a burst, no more.
        assert len(started) <= 4 * burst and refused, (len(started), len(refused))
        for key in refused:
            for node in c.nodes.values():
                assert await node.store.head(key) is None
        # A chain already started takes appends as before; other authors start theirs.
        await flooder.publish(started[0], b"second")
        for i in range(5):
            await other.publish(f"other {i}", b"fine")
        with pytest.raises(QuotaExceeded):
            await flooder.publish("one more", b"refused")
        stats = [n.statistics() for n in c.nodes.values()]
        assert all(s.internal_errors == 0 for s in stats)


async def test_one_author_stores_a_bounded_number_of_bytes_per_interval(
    plugins: pluggy.PluginManager,
) -> None:
    burst = 1 << 20  # at least the largest event: one event must always fit
    limits = {"replication": {"author_bytes_burst": burst, "author_bytes_per_second": 1.0}}
    async with open_cluster(3, plugins=plugins, transport="tcp", overlay="static",
                            settle=1.0, options=limits) as c:
        flooder, other = c.nodes[0], c.nodes[1]
        key = criterion_key("bytes")
        block = bytes(64 << 10)
        accepted = 0
        with pytest.raises(QuotaExceeded) as refused:
            for _ in range(40):
                await flooder.publish(key, block)
                accepted += 1
        assert "bytes of events" in str(refused.value) and "nothing was stored" in str(
            refused.value)
        assert 10 <= accepted < 16, accepted  # 1 MiB of 64 KiB events, with their headers
        for node in c.nodes.values():
            head = await node.store.head(key)
            assert head is not None and head.seq <= accepted - 1
        # Another author writes to the same chain at the same leader.
        await other.publish(key, block)
        with pytest.raises(QuotaExceeded):
            await flooder.publish(key, block)
        stats = [n.statistics() for n in c.nodes.values()]
        assert all(s.internal_errors == 0 for s in stats)


@pytest.mark.parametrize("options", [
    {"author_bytes_burst": 1000}, {"author_bytes_burst": 2.5e6},
    {"author_bytes_per_second": 0}])
async def test_bad_byte_quotas_are_refused(plugins: pluggy.PluginManager,
                                           options: dict[str, object]) -> None:
    config = NodeConfig(identity=Identity.generate(), overlay="static",
                        options={"transport": {"network": MemoryNetwork()},
                                 "replication": options})
    with pytest.raises(ConfigError, match="author_bytes"):
        async with open_node(config, plugins=plugins):
            pass


def _forged(author: Identity, key: bytes, seq: int, prev: bytes | None, payload: bytes) -> bytes:
    """An event in ``author``'s name whose signature does not verify."""
    event = Event.create(author, criterion=key, seq=seq, prev=prev, payload=payload, time=1)
    raw = event.to_bytes()
    return raw.replace(event.sig, bytes(b ^ 1 for b in event.sig))


async def test_forged_events_do_not_use_up_an_honest_authors_quotas(
    plugins: pluggy.PluginManager,
) -> None:
    burst = 2
    limits = {"replication": {"creation_burst": burst, "creations_per_second": 0.01,
                              "author_bytes_burst": 1 << 20, "author_bytes_per_second": 1.0}}
    async with open_cluster(4, plugins=plugins, transport="tcp", overlay="static",
                            settle=1.0, options=limits) as c:
        victim = c.nodes[1]
        author = victim.identity
        chain = criterion_key("victim's chain")
        first = await victim.publish(chain, b"genesis")
        hostiles = [HostilePeer(node.address) for node in c.nodes.values()]
        answers = []
        for i in range(3 * burst):
            key = criterion_key(f"forged {i}")
            members = tuple(Member(c.nodes[j].identity.public_key, c.nodes[j].address)
                            for j in c.brokers(key))
            genesis = OfferItem(_forged(author, key, 0, None, b"forged"), create=members)
            append = OfferItem(_forged(author, chain, 1, first.hash, bytes(300 << 10)))
            for hostile in hostiles:
                for item in (genesis, append):
                    kind, reply = await hostile.request("offer", Offer((item,)).to_wire(),
                                                        timeout=10.0)
                    if kind == "reply":
                        _, body = decode_message(reply)
                        answers.extend(a.kind for a in OfferReply.from_wire(body).answers)
        assert answers and Answer.LIMITED not in answers, answers
        assert Answer.INVALID in answers
        # The honest author still has its whole burst of chains and of bytes.
        for i in range(burst):
            await victim.publish(f"honest {i}", b"genesis")
        for _ in range(3):
            await victim.publish(chain, bytes(300 << 10))
        for hostile in hostiles:
            await hostile.aclose()
