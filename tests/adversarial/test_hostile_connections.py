"""One host floods a node with connections on loopback TCP: silent ones that
never finish the handshake, and authenticated ones that stay idle. It gets at
most its share of the slots; honest peers from other addresses keep working."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from hostile import RawClient, raw_connect

import ketten
from ketten import Identity, NodeConfig, open_node
from ketten.adapters._framing import Auth, FrameDecoder, Hello, Refuse, Reply, Request
from ketten.adapters.tcp import TcpTransport, parse_address, source_of
from ketten.wire import encode_message

PM = ketten.plugin_manager()


@asynccontextmanager
async def node_at(host: str, **transport: Any) -> AsyncIterator[ketten.Node]:
    config = NodeConfig(transport="tcp",
                        options={"transport": {"listen": f"{host}:0", **transport}})
    async with open_node(config, plugins=PM) as node:

        async def echo(peer: Any, body: Any) -> Any:
            return body

        node.register_service("echo", echo)
        yield node


async def _silent(address: str, source: str) -> RawClient:
    host, port = parse_address(address)
    stream = await trio.open_tcp_stream(host, port, local_address=source)
    return RawClient(stream, FrameDecoder(4096))


async def test_silent_handshakes_from_one_address_take_only_their_share() -> None:
    async with node_at("127.0.0.1", handshake_timeout=30.0, max_connections=64) as node:
        floods = [await _silent(node.address, "127.0.0.2") for _ in range(40)]
        first = [await c.frame() for c in floods]
        # Eight wait in the handshake; the rest are refused at once.
        assert sum(isinstance(f, Hello) for f in first) == 8
        refused = [c for c, f in zip(floods, first, strict=True) if not isinstance(f, Hello)]
        assert all(isinstance(f, Refuse) for f in first if not isinstance(f, Hello))
        assert all([await c.closed() for c in refused])
        # Peers from other addresses connect and are served while the flood waits.
        async with node_at("127.0.0.3") as honest:
            for i in range(3):
                assert await honest.call(node.address, "echo", i) == i
        stats = node.transport.statistics()
        assert stats.refused_per_source == 32
        for c in floods:
            await trio.aclose_forcefully(c.stream)


async def test_silent_handshakes_from_many_addresses_cannot_keep_honest_peers_out() -> None:
    """Forty addresses hold eight silent handshakes each (more than every slot): at most
    a quarter of the slots are in the handshake, a new one ends the oldest, and an
    honest peer connects and is served while the flood goes on."""
    async with node_at("127.0.0.1", handshake_timeout=30.0, max_connections=64) as node:
        floods = []
        for n in range(40):
            for _ in range(8):
                floods.append(await _silent(node.address, f"127.0.1.{n + 1}"))
        with trio.fail_after(10):
            while node.transport.statistics().handshakes_evicted < 40 * 8 - 16:
                await trio.sleep(0.01)
        async with node_at("127.0.0.3") as honest:
            for i in range(3):
                with trio.fail_after(10):
                    assert await honest.call(node.address, "echo", i) == i
        assert node.transport.statistics().handshakes_evicted >= 40 * 8 - 16
        for c in floods:
            await trio.aclose_forcefully(c.stream)


async def test_a_full_handshake_table_ends_the_crowding_sources_handshakes_first() -> None:
    """Sixteen slots, four for handshakes: one host keeps opening silent ones; a slow
    peer from another address that is in the handshake keeps its place."""
    async with node_at("127.0.0.1", handshake_timeout=30.0, max_connections=16) as node:
        flood = [await _silent(node.address, "127.0.0.2") for _ in range(3)]
        slow = await _silent(node.address, "127.0.0.3")
        assert isinstance(await slow.frame(), Hello)
        for _ in range(10):
            flood.append(await _silent(node.address, "127.0.0.2"))
            await flood[-1].frame()
        assert node.transport.statistics().handshakes_evicted >= 9
        with trio.move_on_after(0.3):
            assert await slow._receive() != b"", "the slow peer's handshake was ended"
        for c in [*flood, slow]:
            await trio.aclose_forcefully(c.stream)


def test_an_ipv6_source_is_its_64_network() -> None:
    assert source_of("2001:db8::1") == source_of("2001:db8::ffff:1") == "2001:db8::/64"
    assert source_of("2001:db8:0:1::1") != source_of("2001:db8::1")
    assert source_of("::ffff:10.0.0.1") == source_of("10.0.0.1") == "10.0.0.1"
    assert source_of("10.0.0.1") != source_of("10.0.0.2")


async def test_idle_authenticated_connections_from_one_address_are_capped() -> None:
    async with node_at("127.0.0.1", max_per_source=10, max_connections=64) as node:
        held = []
        for _ in range(30):
            client, answer = await raw_connect(node.address, identity=Identity.generate(),
                                               local_address="127.0.0.4")
            assert isinstance(answer, Auth)
            held.append(client)
        # The node closed the least recently used idle ones to stay at ten.
        with trio.fail_after(5):
            while node.transport.statistics().connections_open > 10:
                await trio.sleep(0.01)
        closed = 0
        for client in held[:20]:
            closed += await client.closed()
        assert closed == 20
        async with node_at("127.0.0.5") as honest:
            assert await honest.call(node.address, "echo", "still here") == "still here"
        for client in held:
            await trio.aclose_forcefully(client.stream)


@pytest.mark.parametrize("option", ["max_per_source", "max_handshakes_per_source"])
async def test_per_source_options_are_checked(option: str) -> None:
    with pytest.raises(ketten.ConfigError, match=f"{option}.* must be an integer >= 1"):
        async with node_at("127.0.0.1", **{option: 0}):
            pass


async def test_the_bytes_waiting_for_a_slow_reader_are_an_option() -> None:
    with pytest.raises(ketten.ConfigError, match=r"max_unsent_bytes.* must be an integer >= 1024"):
        async with node_at("127.0.0.1", max_unsent_bytes=10):
            pass  # pragma: no cover
    async with node_at("127.0.0.1", max_unsent_bytes=4096) as node:
        assert isinstance(node.transport, TcpTransport)
        assert node.transport.max_unsent_bytes == 4096


async def _flood(client: RawClient, service: str, bodies: list[Any]) -> int:
    """Send every body as a request at once; count the replies until all came."""
    for req_id, body in enumerate(bodies, 1):
        await client.send(Request(req_id, encode_message(service, body)))
    replies = 0
    while replies < len(bodies):
        frame = await client.frame()
        assert frame is not None, "the node closed a connection that did nothing wrong"
        replies += isinstance(frame, Reply)
    return replies


def _gated(node: ketten.Node) -> tuple[dict[str, int], trio.Event]:
    """A service that holds every request until the gate opens; counts what it holds."""
    seen = {"now": 0, "peak": 0, "bytes": 0, "peak_bytes": 0}
    gate = trio.Event()

    async def held(peer: Any, body: Any) -> Any:
        size = len(body) if isinstance(body, bytes) else 0
        seen["now"] += 1
        seen["bytes"] += size
        seen["peak"] = max(seen["peak"], seen["now"])
        seen["peak_bytes"] = max(seen["peak_bytes"], seen["bytes"])
        try:
            await gate.wait()
        finally:
            seen["now"] -= 1
            seen["bytes"] -= size
        return len(body) if isinstance(body, bytes) else body

    node.register_service("held", held)
    return seen, gate


async def test_one_peer_over_many_connections_gets_one_share_of_request_slots() -> None:
    """``max_concurrent_requests`` bounds one peer's requests in flight over all its
    connections; the rest wait (their connections are not read), and others are served."""
    async with node_at("127.0.0.1", max_concurrent_requests=8) as node:
        seen, gate = _gated(node)
        flooder = Identity.generate()
        clients = []
        for _ in range(3):
            client, answer = await raw_connect(node.address, identity=flooder)
            assert isinstance(answer, Auth)
            clients.append(client)
        counts: list[int] = []
        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(_flood_into, client, counts)
            with trio.fail_after(10):
                while seen["now"] < 8:
                    await trio.sleep(0.01)
            await trio.sleep(0.3)
            assert seen["now"] == 8, "one peer's requests beyond its share ran"
            async with node_at("127.0.0.6") as honest:  # another peer: its own share
                with trio.fail_after(10):
                    assert await honest.call(node.address, "echo", "served") == "served"
            gate.set()
        assert seen["peak"] == 8 and sum(counts) == 3 * 20
        for client in clients:
            await trio.aclose_forcefully(client.stream)


async def _flood_into(client: RawClient, counts: list[int]) -> None:
    counts.append(await _flood(client, "held", list(range(20))))


async def test_requests_in_flight_are_bounded_in_bytes_over_all_peers() -> None:
    async with node_at("127.0.0.1", max_inflight_bytes=64 * 1024) as node:
        seen, gate = _gated(node)
        counts: list[int] = []
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                client, answer = await raw_connect(node.address, identity=Identity.generate())
                assert isinstance(answer, Auth)
                nursery.start_soon(_flood_bytes, client, counts)
            with trio.fail_after(10):
                while seen["now"] < 3:
                    await trio.sleep(0.01)
            await trio.sleep(0.3)
            # Each request is 20 KB: three fit in 64 KiB, a fourth waits.
            assert seen["now"] == 3 and seen["bytes"] <= 64 * 1024
            gate.set()
        assert seen["peak_bytes"] <= 64 * 1024
        assert sum(counts) == 5 * 4


async def _flood_bytes(client: RawClient, counts: list[int]) -> None:
    counts.append(await _flood(client, "held", [bytes(20_000)] * 4))
    await trio.aclose_forcefully(client.stream)


async def test_a_peer_that_stops_reading_holds_up_only_its_own_answers() -> None:
    """A peer asks for 200 answers of 256 KB each and reads none: the node writes what
    the socket takes, queues a bounded amount behind it, and stops taking that
    peer's requests; the answers never pile up in memory, and others are served."""
    async with node_at("127.0.0.1", max_concurrent_requests=8) as node:
        answered = {"count": 0}

        async def big(peer: Any, body: Any) -> Any:
            answered["count"] += 1
            return bytes(256 * 1024)

        node.register_service("big", big)
        hog, answer = await raw_connect(node.address, identity=Identity.generate())
        assert isinstance(answer, Auth)
        for req_id in range(1, 201):
            await hog.send(Request(req_id, encode_message("big", None)))
        await trio.sleep(2.0)
        # What the sockets hold (a few MB on loopback), 1 MiB queued, 8 slots waiting.
        assert answered["count"] < 100, "answers to a peer that reads none piled up"
        async with node_at("127.0.0.6") as honest:
            with trio.fail_after(10):
                assert await honest.call(node.address, "echo", "served") == "served"
        # Once it reads again, every answer comes.
        replies = 0
        with trio.fail_after(30):
            while replies < 200:
                frame = await hog.frame()
                assert frame is not None
                replies += isinstance(frame, Reply)
        assert answered["count"] == 200
        await trio.aclose_forcefully(hog.stream)
