"""A peer floods a broker with subscription leases on loopback TCP: its share of
the subscriber lists is bounded, the broker keeps few table writes for it, and
an honest subscriber still gets every event pushed."""

from __future__ import annotations

import secrets

import pluggy
import trio
from hostile import HostilePeer, retained_memory

from ketten import criterion_key
from ketten.testing import open_cluster


async def test_a_lease_flood_gets_one_subscribers_share(plugins: pluggy.PluginManager) -> None:
    share = 50
    bounds = {"max_per_subscriber": share, "max_per_chain": 1000}
    async with open_cluster(3, plugins=plugins, transport="tcp", overlay="static",
                            settle=1.0, options={"subscriptions": bounds}) as c:
        key = criterion_key("leased")
        writer, victim = c.nodes[0], c.nodes[c.brokers(key)[0]]
        await writer.publish(key, b"first")
        hostile = HostilePeer(victim.address)
        answers = []
        with retained_memory() as kept:
            for version in range(1, 2001):
                body = {"op": "lease", "s": secrets.token_bytes(16), "c": [key], "v": version,
                        "t": 60_000, "live": True}
                answers.append((await hostile.request("sub", body, timeout=5.0))[0])
        # 2,000 unbounded leases keep about 1.4 MB; the 50 kept and the refusals far less.
        assert kept.bytes < 1 << 20, kept
        assert answers.count("reply") == 2000  # refused quietly: the answer carries no hint
        stats = victim.subscription_statistics()
        assert stats.leases <= share + 10, stats
        assert stats.leases_refused >= 2000 - share, stats
        assert stats.table_writes <= share + 10, stats
        reader = c.nodes[next(i for i in c.nodes if c.nodes[i] is not victim)]
        async with reader.subscribe(key, start=0) as feed:
            await writer.publish(key, b"second")
            got = []
            with trio.fail_after(20):
                async for event in feed:
                    got.append(event.payload)
                    if len(got) == 2:
                        break
        assert got == [b"first", b"second"]
        await hostile.aclose()


async def test_one_subscriber_holds_few_leases_on_one_chain(
    plugins: pluggy.PluginManager,
) -> None:
    # Every lease costs a notification per committed event: one peer must not make
    # each commit of a chain cost hundreds of them.
    async with open_cluster(3, plugins=plugins, transport="tcp", overlay="static",
                            settle=1.0) as c:
        key = criterion_key("amplified")
        writer, victim = c.nodes[0], c.nodes[c.brokers(key)[0]]
        await writer.publish(key, b"first")
        hostile = HostilePeer(victim.address)
        for version in range(1, 501):
            body = {"op": "lease", "s": secrets.token_bytes(16), "c": [key], "v": version,
                    "t": 60_000, "live": True}
            await hostile.request("sub", body, timeout=5.0)
        stats = victim.subscription_statistics()
        assert stats.leases <= 16 and stats.leases_refused >= 484, stats
        await writer.publish(key, b"second")
        assert victim.subscription_statistics().notifications_sent <= 16
        await hostile.aclose()


async def test_a_stranger_cannot_slip_an_event_into_a_subscription(
    plugins: pluggy.PluginManager,
) -> None:
    """A durable subscription's id follows from the subscriber's public key and the
    subscription's name, so anyone can address notifications to it. A stranger
    notifies an event of its own that extends the subscriber's copy: only the
    criterion's brokers make an event committed, so the subscriber neither stores
    nor returns it, and gets the real next event."""
    import hashlib

    from ketten import Event, Identity

    async with open_cluster(4, plugins=plugins, transport="tcp", overlay="static",
                            settle=1.0) as c:
        key = criterion_key("slipped")
        writer = c.nodes[c.brokers(key)[0]]
        reader = c.nodes[next(i for i in c.nodes if i not in c.brokers(key))]
        first = await writer.publish(key, b"first")
        sub = await reader.durable_subscription("orders", key)
        with trio.fail_after(20):
            assert (await sub.get()).payload == b"first"
        stranger = Identity.generate()
        forged = Event.create(stranger, criterion=key, seq=1, prev=first.hash,
                              payload=b"FORGED", time=first.time + 1)
        sid = hashlib.sha256(b"ketten-durable\0" + reader.identity.public_key
                             + b"orders").digest()[:16]
        hostile = HostilePeer(reader.address, identity=stranger)
        for _ in range(3):
            await hostile.message("subev", {"s": sid, "c": key, "e": forged.to_bytes()})
        await trio.sleep(1.0)
        await writer.publish(key, b"second")
        with trio.fail_after(20):
            second = await sub.get()
        assert second.payload == b"second" and second.author == writer.identity.public_key
        assert [e.payload for e in await reader.store.range(key, 0, 10)] == [b"first",
                                                                             b"second"]
        assert sub.statistics().refused >= 3
        await sub.aclose()
        await hostile.aclose()
