"""Frame encryption of the tcp transport: keys from the handshake, sealed frames,
nothing readable or replayable on the wire."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

import ketten
from ketten import DecodeError, Identity, NodeConfig, PeerUnreachable, open_node
from ketten.adapters._framing import encode_body
from ketten.adapters._tcp_handshake import Handshake, HandshakeRefused, NetworkParams
from ketten.adapters.tcp import parse_address

PM = ketten.plugin_manager()


def handshake_pair(**params: Any) -> tuple[Handshake, Handshake]:
    a = Handshake(Identity.generate(), NetworkParams(**params), "127.0.0.1:1", True,
                  secrets.token_bytes(32))
    b = Handshake(Identity.generate(), NetworkParams(**params), "127.0.0.1:2", False,
                  secrets.token_bytes(32))
    auth_b = b.receive_hello(a.hello(), encode_body(a.hello()))
    auth_a = a.receive_hello(b.hello(), encode_body(b.hello()))
    a.receive_auth(auth_b, "127.0.0.1:2")
    b.receive_auth(auth_a, None)
    return a, b


def test_both_sides_derive_the_same_keys_and_frames_open_only_in_order() -> None:
    a, b = handshake_pair()
    sa, sb = a.session(), b.session()
    assert sa is not None and sb is not None
    first, second = sa.seal(b"one"), sa.seal(b"two")
    assert b"one" not in first and len(first) == 3 + 16
    assert sb.open(first) == b"one"
    with pytest.raises(DecodeError, match="failed authentication"):
        sb.open(first)  # replayed
    assert sb.open(second) == b"two"
    assert sa.open(sb.seal(b"back")) == b"back"
    tampered = bytearray(sa.seal(b"three"))
    tampered[0] ^= 1
    with pytest.raises(DecodeError, match="failed authentication"):
        sb.open(bytes(tampered))
    # Another connection of the same two nodes has other keys.
    c, _ = handshake_pair()
    sc = c.session()
    assert sc is not None
    with pytest.raises(DecodeError):
        sb.open(sc.seal(b"x"))
    with pytest.raises(DecodeError, match="shorter than its tag"):
        sb.open(b"short")


def test_encryption_must_match_and_can_be_off() -> None:
    a = Handshake(Identity.generate(), NetworkParams(encrypt=True), "h:1", True, bytes(32))
    b = Handshake(Identity.generate(), NetworkParams(encrypt=False), "h:2", False, bytes(32))
    with pytest.raises(HandshakeRefused, match="encryption is off here and on at the peer"):
        b.receive_hello(a.hello(), encode_body(a.hello()))
    with pytest.raises(HandshakeRefused, match="encryption is on here and off at the peer"):
        a.receive_hello(b.hello(), encode_body(b.hello()))
    plain, other = handshake_pair(encrypt=False)
    assert plain.session() is None and other.session() is None


@asynccontextmanager
async def tcp_node(encrypt: bool = True) -> AsyncIterator[ketten.Node]:
    config = NodeConfig(transport="tcp", options={"transport": {"encrypt": encrypt}})
    async with open_node(config, plugins=PM) as node:

        async def echo(peer: Any, body: Any) -> Any:
            return body

        node.register_service("echo", echo)
        yield node


@asynccontextmanager
async def wiretap(target: str, replay: bool = False) -> AsyncIterator[tuple[str, bytearray]]:
    """A TCP relay to ``target`` that records what the dialer sends; ``replay``: it
    also sends the dialer's first frame after the handshake a second time."""
    seen = bytearray()

    async def relay(client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream(*parse_address(target))
        chunks = 0

        async def up() -> None:
            nonlocal chunks
            while data := await client.receive_some(65536):
                seen.extend(data)
                await server.send_all(data)
                chunks += 1
                if replay and chunks == 3:  # hello, auth, then the first request
                    await server.send_all(data)

        async def down() -> None:
            while data := await server.receive_some(65536):
                await client.send_all(data)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(up)
                nursery.start_soon(down)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(server)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            lambda task_status: trio.serve_tcp(relay, 0, host="127.0.0.1",
                                               task_status=task_status))
        port = listeners[0].socket.getsockname()[1]
        yield f"127.0.0.1:{port}", seen
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("encrypt", [True, False])
async def test_nothing_readable_crosses_the_wire(encrypt: bool) -> None:
    secret = "attack at dawn " * 4
    async with tcp_node(encrypt) as node, tcp_node(encrypt) as peer:
        async with wiretap(node.address) as (tap, seen):
            assert await peer.call(tap, "echo", secret) == secret
        assert (secret.encode() in bytes(seen)) is not encrypt


async def test_a_replayed_frame_ends_its_connection_only() -> None:
    async with tcp_node() as node, tcp_node() as peer:
        async with wiretap(node.address, replay=True) as (tap, _):
            with trio.fail_after(10):
                try:
                    await peer.call(tap, "echo", 1)
                except PeerUnreachable:
                    pass  # the replay may close the connection before the answer
                with trio.move_on_after(1):
                    while node.transport.statistics().malformed_frames == 0:
                        await trio.sleep(0.01)
        assert node.transport.statistics().malformed_frames == 1
        assert await peer.call(node.address, "echo", 2) == 2


async def test_nodes_that_disagree_on_encryption_refuse_each_other() -> None:
    async with tcp_node(True) as node, tcp_node(False) as plain:
        with pytest.raises(PeerUnreachable, match="encryption"):
            await plain.call(node.address, "echo", 1)
