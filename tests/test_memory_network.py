"""The simulated network: faults behave as configured, in virtual time, reproducibly."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from ketten import (
    ConfigError,
    Identity,
    NodeConfig,
    PeerUnreachable,
    RemoteError,
    UsageError,
    open_node,
)
from ketten.adapters._netmodel import Faults, NetworkModel
from ketten.adapters.memory import MemoryNetwork, MemoryTransport
from ketten.interfaces import Peer


def test_model_loss_and_duplication_rates() -> None:
    model = NetworkModel(Faults(loss=0.1, duplicate=0.2), seed=7)
    copies = [len(model.route("a", "b", float(i))) for i in range(20_000)]
    lost = copies.count(0) / len(copies)
    doubled = copies.count(2) / (len(copies) - copies.count(0))
    assert 0.09 < lost < 0.11
    assert 0.18 < doubled < 0.22
    stats = model.statistics()
    assert stats.sent == 20_000 and stats.lost == copies.count(0)


def test_model_is_reproducible() -> None:
    def fates(seed: int) -> list[list[float]]:
        model = NetworkModel(Faults(loss=0.2, jitter=0.01, duplicate=0.1, reorder=0.3), seed=seed)
        return [model.route("a", "b", i * 0.001) for i in range(500)]

    assert fates(3) == fates(3)
    assert fates(3) != fates(4)


def test_model_partitions() -> None:
    model = NetworkModel(Faults(), seed=1)
    model.cut({"a", "b"})
    assert model.route("a", "c", 0.0) == [] and model.route("c", "b", 0.0) == []
    assert model.route("a", "b", 0.0) != []
    model.cut({"c"}, {"d"})
    assert model.is_cut("d", "c") and not model.is_cut("c", "e")
    model.heal({"a", "b"})
    assert not model.is_cut("a", "c") and model.is_cut("c", "d")
    model.heal()
    assert not model.is_cut("c", "d")


def test_model_links_are_fifo_unless_reordered() -> None:
    model = NetworkModel(Faults(latency=0.01, jitter=0.5), seed=5)
    arrivals = [model.route("a", "b", 0.0)[0] for _ in range(1000)]
    assert arrivals == sorted(arrivals)
    model = NetworkModel(Faults(latency=0.01, reorder=0.3, reorder_window=0.5), seed=5)
    arrivals = [model.route("a", "b", i * 0.001)[0] for i in range(1000)]
    assert arrivals != sorted(arrivals)
    assert 0.25 < model.statistics().reordered / 1000 < 0.35


def test_faults_are_validated() -> None:
    with pytest.raises(ConfigError, match="loss"):
        Faults(loss=1.5)
    with pytest.raises(ConfigError, match="latency"):
        Faults(latency=-1)


class Recorder:
    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes]] = []

    async def handle_request(self, peer: Peer, data: bytes) -> bytes:
        if data == b"fail":
            raise UsageError("you asked for it")
        return b"re:" + data

    async def handle_message(self, peer: Peer, data: bytes) -> None:
        self.messages.append((peer.address, data))


async def with_pair(
    net: MemoryNetwork, body: Callable[[MemoryTransport, MemoryTransport, Recorder], Awaitable[None]]
) -> None:
    a = net.endpoint(Identity.from_seed(b"\x01" * 32))
    b = net.endpoint(Identity.from_seed(b"\x02" * 32))
    recorder = Recorder()
    async with trio.open_nursery() as nursery:
        await nursery.start(a.serve, Recorder())
        await nursery.start(b.serve, recorder)
        await body(a, b, recorder)
        nursery.cancel_scope.cancel()


async def test_request_reply_in_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=1, faults=Faults(latency=0.25))

    async def body(a: MemoryTransport, b: MemoryTransport, _: Recorder) -> None:
        start = trio.current_time()
        reply = await a.request(b.address, b"hello")
        assert reply.data == b"re:hello"
        assert reply.peer == b.peer and reply.peer.node_id == Identity.from_seed(b"\x02" * 32).node_id
        assert trio.current_time() - start == pytest.approx(0.5)
        with pytest.raises(RemoteError, match="UsageError"):
            await a.request(b.address, b"fail")
        with pytest.raises(PeerUnreachable):
            await a.request("mem:404", b"x")

    await with_pair(net, body)


async def test_loss_duplication_reordering_measured(autojump_clock: trio.testing.MockClock) -> None:
    faults = Faults(latency=0.01, loss=0.1, duplicate=0.1, reorder=0.2, reorder_window=0.5)
    net = MemoryNetwork(seed=11, faults=faults)

    async def body(a: MemoryTransport, b: MemoryTransport, recorder: Recorder) -> None:
        for i in range(5000):
            await a.send(b.address, i.to_bytes(4, "big"))
            await trio.sleep(0.001)
        await trio.sleep(2)
        received = [int.from_bytes(d, "big") for _, d in recorder.messages]
        distinct = set(received)
        assert 0.08 < 1 - len(distinct) / 5000 < 0.12  # loss
        assert 0.08 < (len(received) - len(distinct)) / len(distinct) < 0.12  # duplicates
        inversions = sum(1 for x, y in zip(received, received[1:]) if y < x)
        assert inversions > 200  # reordering happened
        assert all(addr == a.address for addr, _ in recorder.messages)

    await with_pair(net, body)


async def test_no_faults_means_fifo_exactly_once(autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=2, faults=Faults(latency=0.01))

    async def body(a: MemoryTransport, b: MemoryTransport, recorder: Recorder) -> None:
        for i in range(1000):
            await a.send(b.address, i.to_bytes(4, "big"))
        await trio.sleep(1)
        assert [int.from_bytes(d, "big") for _, d in recorder.messages] == list(range(1000))

    await with_pair(net, body)


async def test_partition_cuts_and_heals(autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=3, faults=Faults(latency=0.01))

    async def body(a: MemoryTransport, b: MemoryTransport, recorder: Recorder) -> None:
        net.cut({a.address})
        with trio.move_on_after(5) as scope:
            await a.request(b.address, b"x")
        assert scope.cancelled_caught
        await a.send(b.address, b"lost")
        net.heal()
        assert (await a.request(b.address, b"y")).data == b"re:y"
        await a.send(b.address, b"kept")
        await trio.sleep(1)
        assert [d for _, d in recorder.messages] == [b"kept"]
        assert net.statistics().cut == 2

    await with_pair(net, body)


async def test_same_seed_same_history(autojump_clock: trio.testing.MockClock) -> None:
    async def history(seed: int) -> list[tuple[float, int]]:
        net = MemoryNetwork(seed=seed, faults=Faults(latency=0.01, jitter=0.05, loss=0.2, duplicate=0.2))
        log: list[tuple[float, int]] = []

        async def body(a: MemoryTransport, b: MemoryTransport, recorder: Recorder) -> None:
            for i in range(300):
                await a.send(b.address, bytes([i % 256]))
            await trio.sleep(1)
            log.extend((0.0, d[0]) for _, d in recorder.messages)

        await with_pair(net, body)
        return log

    assert await history(5) == await history(5)
    assert await history(5) != await history(6)


async def test_thousands_of_endpoints(autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=4, faults=Faults(latency=0.02, jitter=0.01))
    endpoints = [net.endpoint(Identity.from_seed(i.to_bytes(32, "big"))) for i in range(1, 2001)]
    recorders = [Recorder() for _ in endpoints]
    async with trio.open_nursery() as nursery:
        for endpoint, recorder in zip(endpoints, recorders):
            await nursery.start(endpoint.serve, recorder)
        start = trio.current_time()
        for i, endpoint in enumerate(endpoints):
            await endpoint.send(endpoints[(i + 1) % len(endpoints)].address, b"ring")
        await trio.sleep(0.1)
        assert all(len(r.messages) == 1 for r in recorders)
        assert trio.current_time() - start < 0.2
        nursery.cancel_scope.cancel()


async def test_resent_requests_until_one_copy_is_answered(
        autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(seed=7, faults=Faults(latency=0.01, loss=0.6))

    async def body(a: MemoryTransport, b: MemoryTransport, _: Recorder) -> None:
        for i in range(20):
            reply = await a.request_resending(b.address, b"q%d" % i, 0.1)
            assert reply.data == b"re:q%d" % i
        sent = a.statistics().requests_sent
        assert sent > 20  # copies went out again: with loss 0.6 most first copies fail
        await trio.sleep(5)
        assert a.statistics().requests_sent == sent  # nothing resent once answered
        with trio.move_on_after(0.35):
            net.cut({a.address})
            await a.request_resending(b.address, b"cut off", 0.1)
        assert a.statistics().requests_sent == sent + 4  # at 0, 0.1, 0.2 and 0.3 s
        net.heal()
        await trio.sleep(5)
        assert a.statistics().requests_sent == sent + 4  # a request given up is not resent
        with pytest.raises(RemoteError, match="UsageError"):
            await a.request_resending(b.address, b"fail", 0.1)

    await with_pair(net, body)


async def test_a_node_takes_a_memory_peer_at_its_address_without_checking_it(
        autojump_clock: trio.testing.MockClock) -> None:
    # The network names every sender by the address it serves at: the node asked
    # needs no ping of its own to believe where the asking node listens.
    net = MemoryNetwork(seed=8, faults=Faults(latency=0.01))
    configs = [NodeConfig(transport="memory", options={"transport": {"network": net}})
               for _ in range(2)]
    async with open_node(configs[0]) as a, open_node(configs[1]) as b:

        async def echo(peer: Peer, body: object) -> object:
            return body

        a.register_service("echo", echo)
        assert await b.call(a.address, "echo", 5) == 5
        await trio.sleep(1)
        assert a.transport.statistics().requests_sent == 0
