"""The tcp transport on real loopback sockets: framing, handshake, bad input, overlay."""

from __future__ import annotations

import hashlib
import logging
import random
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio
from hostile import RawClient, raw_connect
from hypothesis import given, settings
from hypothesis import strategies as st

import ketten
from ketten import (
    DecodeError,
    Identity,
    NodeConfig,
    PeerUnreachable,
    ProtocolError,
    RemoteError,
    UsageError,
    open_node,
)
from ketten.adapters._framing import (
    Auth,
    FrameDecoder,
    Hello,
    Message,
    Refuse,
    Reply,
    Request,
    encode_frame,
    parse_frame,
)
from ketten.adapters._tcp_handshake import Handshake, NetworkParams
from ketten.adapters.memory import MemoryNetwork, MemoryTransport
from ketten.adapters.tcp import TcpTransport, parse_address
from ketten.interfaces import Peer, Transport, address_proven

PM = ketten.plugin_manager()


@asynccontextmanager
async def tcp_node(*, replication: int = 3, overlay: dict[str, Any] | None = None,
                   transport: dict[str, Any] | None = None,
                   identity: Identity | None = None) -> AsyncIterator[ketten.Node]:
    options: dict[str, Any] = {"transport": transport or {}}
    if overlay is not None:
        options["overlay"] = overlay
    config = NodeConfig(transport="tcp", replication=replication, identity=identity,
                        overlay="kademlia" if overlay is not None else None, options=options)
    async with open_node(config, plugins=PM) as node:
        yield node


def echo_services(node: ketten.Node, inbox: list[Any],
                  arrived: trio.Event | None = None) -> None:
    async def echo(peer: Peer, body: Any) -> Any:
        return {"from": peer.public_key, "body": body}

    async def boom(peer: Peer, body: Any) -> Any:
        raise ProtocolError("no such thing")

    async def take(peer: Peer, body: Any) -> None:
        inbox.append((peer.public_key, body))
        if arrived is not None:
            arrived.set()

    node.register_service("echo", echo)
    node.register_service("boom", boom)
    node.register_message_service("inbox", take)


async def test_requests_messages_errors_and_reuse() -> None:
    inbox: list[Any] = []
    arrived = trio.Event()
    async with tcp_node() as a, tcp_node() as b:
        echo_services(b, inbox, arrived)
        assert isinstance(a.transport, Transport)
        for i in range(5):
            answer = await a.call(b.address, "echo", i)
            assert answer == {"from": a.identity.public_key, "body": i}
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(a.call, b.address, "echo", [i] * 100)
        with pytest.raises(RemoteError) as failed:
            await a.call(b.address, "boom", None)
        assert failed.value.code == "ProtocolError" and "no such thing" in str(failed.value)
        with pytest.raises(RemoteError, match="unknown service"):
            await a.call(b.address, "nothing", None)
        await a.notify(b.address, "inbox", "hello")
        with trio.fail_after(5):
            await arrived.wait()
        assert inbox == [(a.identity.public_key, "hello")]
        reply = await a.transport.request(b.address, ketten.wire.encode_message("echo", 1))
        assert reply.peer == Peer(b.address, b.identity.public_key)
        stats = a.transport.statistics()
        assert stats.connections_dialed == 1 and stats.requests_sent >= 27
        assert b.transport.statistics().error_replies_sent == 2
        echo_services(a, inbox)
        assert (await a.call(a.address, "echo", 7))["body"] == 7
        with pytest.raises(UsageError, match="frame limit"):
            await a.transport.request(b.address, bytes(5 << 20))


async def test_unreachable_and_stopped_peers() -> None:
    async with tcp_node() as a:
        async with tcp_node() as b:
            echo_services(b, [])
            address = b.address
            await a.call(address, "echo", 1)
        with pytest.raises(PeerUnreachable):
            await a.call(address, "echo", 1)
        with pytest.raises(PeerUnreachable):
            await a.call("not an address", "echo", 1)
        # Addresses peers claim: unencodable, over-long or out of range, each
        # refused as unreachable before it reaches the resolver.
        for claimed in ("\udcff:1", "b\u00fccher.example:1", "a" * 64 + ".example:1",
                        "x..y:1", "[not-v6]:1", "127.0.0.1:0", "127.0.0.1:70000", "h:\u0661"):
            with pytest.raises(PeerUnreachable, match="not a host:port address"):
                await a.call(claimed, "echo", 1)


@pytest.mark.parametrize(("theirs", "words"), [
    ({"replication": 5}, "replication factor r=5 differs from ours (r=3)"),
    ({"overlay": {"puzzle_difficulty": 1}}, "puzzle difficulty"),
])
async def test_mismatched_network_parameters_are_refused_and_logged(
    caplog: pytest.LogCaptureFixture, theirs: dict[str, Any], words: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="ketten.tcp")
    both_logged = trio.Event()

    class BothSides(logging.Handler):
        seen = 0

        def emit(self, record: logging.LogRecord) -> None:
            self.seen += 1
            if self.seen >= 2:
                both_logged.set()

    watcher = BothSides(logging.WARNING)
    logging.getLogger("ketten.tcp").addHandler(watcher)
    identity = ketten.plugins.kademlia._ids.solve_puzzle(1, random.Random(5))
    try:
        async with tcp_node() as a, tcp_node(identity=identity, **theirs) as b:
            echo_services(b, [])
            with pytest.raises(PeerUnreachable, match="handshake"):
                await a.call(b.address, "echo", 1)
            with trio.fail_after(5):
                await both_logged.wait()
    finally:
        logging.getLogger("ketten.tcp").removeHandler(watcher)
    messages = [r.getMessage() for r in caplog.records if r.name == "ketten.tcp"]
    assert any(m.startswith("refusing") for m in messages)
    assert any("refused us" in m or m.startswith("refusing an incoming") or
               m.startswith("refusing") for m in messages)
    assert sum(1 for m in messages if "differs" in m) >= 2, messages
    if "replication" in words:
        assert any(words in m for m in messages)


async def test_forged_ids_and_bad_proofs_are_refused(caplog: pytest.LogCaptureFixture) -> None:
    async with tcp_node() as node:
        echo_services(node, [])
        mine = Identity.generate()
        other = Identity.generate()
        good = Handshake(mine, NetworkParams(), "127.0.0.1:1", True, bytes(32)).hello()
        forged = Hello(good.version, mine.public_key, other.node_id, bytes(32), 3, 0, "x:1",
                       good.ephemeral)
        client, answer = await raw_connect(node.address, identity=mine, hello=forged)
        assert isinstance(answer, Refuse) and "not the hash of its key" in answer.reason
        assert await client.closed()
        client, answer = await raw_connect(node.address, identity=mine, signature=bytes(64))
        assert isinstance(answer, Auth)  # the node's own proof; our bad one comes back refused
        answer = await client.frame()
        assert isinstance(answer, Refuse) and "bad signature" in answer.reason
        assert await client.closed()
        stolen = Hello(good.version, other.public_key, other.node_id, bytes(32), 3, 0, "x:1",
                       good.ephemeral)
        client, answer = await raw_connect(node.address, identity=mine, hello=stolen)
        answer = await client.frame()
        assert isinstance(answer, Refuse) and "bad signature" in answer.reason
        assert await client.closed()
        client, answer = await raw_connect(node.address, params=NetworkParams(version=9))
        assert isinstance(answer, Refuse) and "protocol version 9" in answer.reason
        assert await client.closed()
        assert node.transport.statistics().handshakes_failed == 4
        async with tcp_node() as peer:
            assert (await peer.call(node.address, "echo", 1))["body"] == 1
    assert "not the hash of its key" in caplog.text


async def test_huge_length_prefix_is_refused_without_allocating() -> None:
    async with tcp_node() as node:
        echo_services(node, [])
        client, answer = await raw_connect(node.address)
        assert isinstance(answer, Auth)
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            await client.stream.send_all(b"\xff\xff\xff\xf0" + b"\x00" * 1000)
            assert await client.closed()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20
        assert node.transport.statistics().malformed_frames == 1
        fresh = await trio.open_tcp_stream(*parse_address(node.address))
        await fresh.send_all(b"\x7f\xff\xff\xff")
        assert await RawClient(fresh, FrameDecoder(4096)).closed()
        async with tcp_node() as peer:
            assert (await peer.call(node.address, "echo", 2))["body"] == 2


def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, position, value in edits:
        if not out:
            break
        i = position % len(out)
        if kind == 0:
            out[i] ^= value or 1
        elif kind == 1:
            del out[i:]
        else:
            out.insert(i, value)
    return bytes(out)


valid_frames = [
    encode_frame(Request(1, ketten.wire.encode_message("echo", [1, 2]))),
    encode_frame(Message(ketten.wire.encode_message("inbox", "x"))),
    encode_frame(Reply(5, b"abc")),
]


@settings(max_examples=40, deadline=None)
@given(
    payload=st.one_of(
        st.binary(min_size=1, max_size=200),
        st.tuples(st.sampled_from(valid_frames),
                  st.lists(st.tuples(st.integers(0, 2), st.integers(0, 400),
                                     st.integers(0, 255)), min_size=1, max_size=4))
        .map(lambda pair: mutate(*pair)),
    ),
    sealed=st.booleans(),
)
async def test_random_and_mutated_frames_close_only_that_connection(payload: bytes,
                                                                    sealed: bool) -> None:
    # In clear the bytes fail to authenticate; sealed like an honest peer's frame,
    # they reach the frame parser.
    inbox: list[Any] = []
    async with tcp_node() as node:
        echo_services(node, inbox)
        async with tcp_node() as friend:
            assert (await friend.call(node.address, "echo", 0))["body"] == 0
            client, answer = await raw_connect(node.address)
            assert isinstance(answer, Auth)
            if sealed:
                await client.send_body(payload)
            else:
                await client.stream.send_all(payload)
            await client.stream.send_eof()
            assert await client.closed()
            stats = node.transport.statistics()
            # the node keeps serving the connection it already had, and new ones
            assert (await friend.call(node.address, "echo", 1))["body"] == 1
            async with tcp_node() as late:
                assert (await late.call(node.address, "echo", 2))["body"] == 2
            assert stats.connections_accepted == 2


@given(st.binary(max_size=300))
def test_parse_frame_raises_only_decode_error(data: bytes) -> None:
    try:
        parse_frame(data, max_size=1 << 20)
    except DecodeError:
        pass


@given(st.lists(st.binary(min_size=1, max_size=50), min_size=1, max_size=10),
       st.lists(st.integers(1, 30), min_size=1, max_size=20))
def test_decoder_splits_any_chunking(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    decoder = FrameDecoder(64)
    out: list[bytes] = []
    position = 0
    turn = 0
    while position < len(stream):
        size = cuts[turn % len(cuts)]
        turn += 1
        decoder.feed(stream[position:position + size])
        position += size
        while (body := decoder.next_body()) is not None:
            out.append(body)
    assert out == bodies and decoder.buffered == 0
    with pytest.raises(DecodeError, match="exceeds the limit"):
        big = FrameDecoder(64)
        big.feed((65).to_bytes(4, "big"))
        big.next_body()


async def test_connection_cap_evicts_idle_connections() -> None:
    async with tcp_node(transport={"max_connections": 2}) as hub:
        echo_services(hub, [])
        for _ in range(2):
            async with tcp_node() as a, tcp_node() as b, tcp_node() as c:
                for peer in (a, b, c, a):
                    assert (await peer.call(hub.address, "echo", 1))["body"] == 1
                    assert hub.transport.statistics().connections_open <= 2


async def test_a_request_on_a_connection_the_peer_ended_unread_goes_out_again() -> None:
    """A node ends a connection in order (as idle, or for room) only when it has
    read no request on it that it left unanswered, so a request that was on its
    way then is sent once more, on a new connection. Here a hand-driven peer
    ends the first connection when the request arrives and answers on the second."""
    server_id = Identity.generate()
    accepted: list[trio.SocketStream] = []

    async def body_of(client: RawClient) -> bytes:
        while (body := client.decoder.next_body()) is None:
            client.decoder.feed(await client.stream.receive_some(65536))
        return body

    async def serve(stream: trio.SocketStream) -> None:
        accepted.append(stream)
        client = RawClient(stream, FrameDecoder(1 << 22))
        shake = Handshake(server_id, NetworkParams(), "127.0.0.1:1", initiator=False,
                          nonce=bytes(32))
        hello = await body_of(client)
        await stream.send_all(encode_frame(shake.hello()))
        auth = shake.receive_hello(parse_frame(hello, max_size=len(hello)), hello)
        theirs = await body_of(client)
        shake.receive_auth(parse_frame(theirs, max_size=len(theirs)), None)
        await stream.send_all(encode_frame(auth))
        client.session = shake.session()
        request = await client.frame()
        assert isinstance(request, Request)
        if len(accepted) == 1:
            await stream.aclose()  # in order, as a node closing an idle connection
            return
        await client.send(Reply(request.req_id, b"answered on " + request.data))
        await client.closed()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with tcp_node() as node:
            assert isinstance(node.transport, TcpTransport)
            with trio.fail_after(10):
                reply = await node.transport.request(f"127.0.0.1:{port}", b"the second")
            assert reply.data == b"answered on the second"
            assert reply.peer.public_key == server_id.public_key
            assert len(accepted) == 2
            assert node.transport.statistics().requests_resent == 1
        nursery.cancel_scope.cancel()


def test_bad_transport_options() -> None:
    with pytest.raises(UsageError):
        TcpTransport(identity=Identity.generate(), params=NetworkParams(), listen="nohost")


async def test_bad_options_refuse_to_open() -> None:
    for options in ({"max_frame_size": 5}, {"listen": 3}, {"nope": 1},
                    {"handshake_timeout": 0}, {"frame_timeout": -1}, {"idle_timeout": True}):
        with pytest.raises(BaseException) as refused:
            async with tcp_node(transport=options):
                pass
        assert refused.group_contains(ketten.ConfigError) if isinstance(
            refused.value, BaseExceptionGroup) else isinstance(refused.value, ketten.ConfigError)


async def test_twenty_nodes_on_loopback_find_each_other() -> None:
    rng = random.Random(20)
    async with trio.open_nursery() as nursery:
        nodes: list[ketten.Node] = []

        async def run(boot: list[str], paths: int,
                      task_status: trio.TaskStatus[ketten.Node]) -> None:
            async with tcp_node(overlay={"bootstrap": boot, "paths": paths}) as node:
                task_status.started(node)
                await trio.sleep_forever()

        nodes.append(await nursery.start(run, [], 1))
        for i in range(19):
            nodes.append(await nursery.start(run, [rng.choice(nodes).address], 1 + i % 2))
        ids = [n.identity.node_id for n in nodes]
        for node in nodes:
            assert node.overlay is not None
            key = hashlib.sha256(node.address.encode()).digest()
            target = int.from_bytes(key, "big")
            truth = sorted(ids, key=lambda i: int.from_bytes(i, "big") ^ target)[:3]
            found = await node.overlay.closest(key, 3)
            assert [p.node_id for p in found] == truth
            everyone = await node.overlay.closest(node.identity.node_id, 20)
            assert sorted(p.node_id for p in everyone) == sorted(ids)
            assert {p.address for p in everyone} == {n.address for n in nodes}
        nursery.cancel_scope.cancel()


async def test_silent_and_stalled_handshakes_free_their_slots() -> None:
    # Eight slots: two may be in the handshake at once (a third would end the oldest).
    async with tcp_node(transport={"max_connections": 8, "handshake_timeout": 0.3}) as node:
        echo_services(node, [])
        silent = RawClient(await trio.open_tcp_stream(*parse_address(node.address)),
                           FrameDecoder(4096))
        assert isinstance(await silent.frame(), Hello)
        partial = RawClient(await trio.open_tcp_stream(*parse_address(node.address)),
                            FrameDecoder(4096))
        assert isinstance(await partial.frame(), Hello)
        hello = Handshake(Identity.generate(), NetworkParams(), "127.0.0.1:1", True,
                          bytes(32)).hello()
        await partial.stream.send_all(encode_frame(hello)[:20])
        assert await silent.closed() and await partial.closed()
        async with tcp_node() as late:
            assert (await late.call(node.address, "echo", 2))["body"] == 2
        stats = node.transport.statistics()
        assert stats.handshakes_timed_out == 2 and stats.connections_refused == 2
        assert stats.handshakes_evicted == 0


@pytest.mark.parametrize("friend_smaller", [False, True])
async def test_stalled_frames_and_idle_peers_are_closed_busy_ones_kept(
        friend_smaller: bool) -> None:
    timeouts = {"frame_timeout": 0.3, "idle_timeout": 0.3}
    smaller, larger = sorted((Identity.from_seed(b"a" * 32), Identity.from_seed(b"b" * 32)),
                             key=lambda i: i.public_key)
    mine, friends = (larger, smaller) if friend_smaller else (smaller, larger)
    async with tcp_node(transport=timeouts, identity=mine) as node:
        echo_services(node, [])

        async def slow(peer: Peer, body: Any) -> Any:
            await trio.sleep(1.0)
            return body

        node.register_service("slow", slow)
        stalled, answer = await raw_connect(node.address)
        assert isinstance(answer, Auth)
        frame = encode_frame(Request(1, ketten.wire.encode_message("echo", "x" * 50)))
        await stalled.stream.send_all(frame[:30])
        idle, answer = await raw_connect(node.address)
        assert isinstance(answer, Auth)
        async with tcp_node(transport=timeouts, identity=friends) as friend:
            assert await stalled.closed()
            assert node.transport.statistics().stalled_frames == 1
            # busy for longer than the idle timeout on both sides, yet kept open
            assert await friend.call(node.address, "slow", 3) == 3
            assert await idle.closed()
            stats = node.transport.statistics()
            # The node pinged the address the friend claims (once, to check it). If
            # the friend's key is the smaller, its own connection carries the ping and
            # the node's closes at once; else the node's falls idle.
            own_kept = not friend_smaller
            assert stats.connections_dialed == 1
            assert stats.requests_on_accepted == (0 if own_kept else 1)
            idle = 1 + own_kept  # the raw idle peer, and maybe the node's own
            assert stats.idle_closed == idle and stats.stalled_frames == 1
            dialed = friend.transport._dialed[node.address]
            with trio.fail_after(5):
                await dialed.finished.wait()
            assert node.transport.statistics().idle_closed == idle, "the dialer closes first"
            assert (await friend.call(node.address, "echo", 4))["body"] == 4
            assert friend.transport.statistics().connections_dialed == 2
        assert node.transport.statistics().malformed_frames == 0


async def test_the_transport_vouches_only_for_addresses_it_dialed() -> None:
    async with tcp_node() as a, tcp_node() as b:
        echo_services(b, [])
        a_peer = Peer(a.address, a.identity.public_key)
        b_peer = Peer(b.address, b.identity.public_key)
        assert not address_proven(a.transport, b_peer)
        await a.call(b.address, "echo", 1)
        assert address_proven(a.transport, b_peer)
        assert not address_proven(a.transport, Peer(b.address, Identity.generate().public_key))
        assert not address_proven(b.transport, a_peer)  # b was only told a's address
    net = MemoryNetwork(seed=1)
    memory = MemoryTransport(network=net, identity=Identity.generate(), address="mem:1")
    other = MemoryTransport(network=net, identity=Identity.generate(), address="mem:2")
    async with trio.open_nursery() as nursery:
        await nursery.start(other.serve, lambda *args: None)
        # The network knows which key serves at each address.
        assert address_proven(memory, other.peer)
        assert not address_proven(memory, Peer("mem:2", b_peer.public_key))
        assert not address_proven(memory, Peer("mem:3", other.peer.public_key))
        nursery.cancel_scope.cancel()
    assert not address_proven(object(), b_peer)  # type: ignore[arg-type]


async def test_two_nodes_talking_both_ways_keep_one_connection() -> None:
    # The connection the smaller key dialed carries the requests of both; the larger
    # uses it once it has dialed the smaller's address itself (the hello only claims
    # it), and its own connection falls idle and closes.
    smaller, larger = sorted((Identity.from_seed(b"s" * 32), Identity.from_seed(b"l" * 32)),
                             key=lambda i: i.public_key)
    idle = {"idle_timeout": 1.0}
    async with tcp_node(identity=smaller, transport=idle) as s, \
            tcp_node(identity=larger, transport=idle) as big:
        echo_services(s, [])
        echo_services(big, [])
        assert (await big.call(s.address, "echo", "first"))["body"] == "first"
        assert (await s.call(big.address, "echo", "back"))["body"] == "back"
        own = big.transport._dialed[s.address]
        with trio.fail_after(10):
            # The side that accepted the idle connection sees it close a moment later.
            while not own.closed or any(n.transport.statistics().connections_open != 1
                                        for n in (s, big)):
                for node, other in ((big, s), (s, big)):
                    answer = await node.call(other.address, "echo", "both ways")
                    assert answer == {"from": node.identity.public_key, "body": "both ways"}
                await trio.sleep(0.05)
        for node in (s, big):
            stats = node.transport.statistics()
            assert stats.connections_open == 1 and stats.connections_dialed == 1
        assert big.transport.statistics().requests_on_accepted > 0
        assert s.transport.statistics().requests_on_accepted == 0
        for _ in range(5):
            await big.call(s.address, "echo", "more")
            await s.call(big.address, "echo", "more")
        assert [n.transport.statistics().connections_dialed for n in (s, big)] == [1, 1]


async def test_a_peer_claiming_another_nodes_address_never_carries_its_requests() -> None:
    # The liar's key is the smallest, so its connection would win if its claim counted.
    keys = sorted((Identity.from_seed(bytes([i]) * 32) for i in range(1, 4)),
                  key=lambda i: i.public_key)
    liar_id, honest_id, node_id = keys
    async with tcp_node(identity=node_id) as node, tcp_node(identity=honest_id) as honest:
        echo_services(honest, [])
        echo_services(node, [])
        liar, answer = await raw_connect(node.address, identity=liar_id,
                                         claimed=honest.address)
        assert isinstance(answer, Auth)
        await liar.send(Request(1, ketten.wire.encode_message("echo", "hi")))
        assert isinstance(await liar.frame(), Reply)

        async def who(peer: Peer, body: Any) -> Any:
            return honest.identity.public_key

        honest.register_service("who", who)
        for _ in range(3):
            with trio.fail_after(5):
                assert await node.call(honest.address, "who", None) == honest_id.public_key
        with trio.move_on_after(0.3):
            extra = await liar.frame()
            assert not isinstance(extra, Request), "a request reached the liar"
        await trio.aclose_forcefully(liar.stream)


async def test_a_frame_trickling_in_byte_by_byte_is_cut_off_at_frame_timeout() -> None:
    # Every byte arrives well within the timeout, but the frame as a whole does not:
    # the clock runs from the frame's first byte, not from the last read.
    async with tcp_node(transport={"frame_timeout": 0.4}) as node:
        echo_services(node, [])
        slow, answer = await raw_connect(node.address)
        assert isinstance(answer, Auth)
        frame = encode_frame(Request(1, ketten.wire.encode_message("echo", "x" * 200)))
        started = trio.current_time()
        with trio.move_on_after(5):
            for byte in frame:
                try:
                    await slow.stream.send_all(bytes([byte]))
                except trio.BrokenResourceError:
                    break
                await trio.sleep(0.05)
        assert await slow.closed()
        assert trio.current_time() - started < 2.0
        stats = node.transport.statistics()
        assert stats.stalled_frames == 1 and stats.malformed_frames == 0
        _, answer = await raw_connect(node.address)
        assert isinstance(answer, Auth)


async def test_a_peer_that_stops_reading_is_cut_off_at_frame_timeout() -> None:
    # Its requests ask for more than the sockets' buffers hold, and it reads none of
    # the answers: the node's write blocks, and its watcher ends the connection.
    async with tcp_node(transport={"frame_timeout": 0.4}) as node:
        echo_services(node, [])
        mute, answer = await raw_connect(node.address)
        assert isinstance(answer, Auth)
        big = "x" * (1 << 20)
        started = trio.current_time()
        try:
            for req_id in range(1, 41):
                await mute.send(Request(req_id, ketten.wire.encode_message("echo", big)))
        except trio.BrokenResourceError:
            pass  # on a busy machine the node may cut it off before it has sent them all
        with trio.fail_after(10):
            while node.transport.statistics().stalled_sends == 0:
                await trio.sleep(0.05)
        assert trio.current_time() - started < 5.0  # the frame timeout, not the default 30 s
        assert await mute.closed()
        stats = node.transport.statistics()
        assert stats.stalled_sends == 1 and stats.stalled_frames == 0
        assert stats.connections_open == 0
        # The node goes on serving others.
        talker, answer = await raw_connect(node.address)
        assert isinstance(answer, Auth)
        await talker.send(Request(1, ketten.wire.encode_message("echo", "still here")))
        assert isinstance(await talker.frame(), Reply)


async def test_cancelled_requests_leave_the_shared_connection_whole() -> None:
    # Requests cancelled at every stage, big frames among them, share one
    # connection with requests that must keep getting exact answers.
    async with tcp_node() as a, tcp_node() as b:
        echo_services(b, [])
        big = bytes(range(256)) * (12 * 1024)  # 3 MiB
        for wait in (0.0, 0.0005, 0.002, 0.01):
            with trio.move_on_after(wait):
                await a.call(b.address, "echo", big)
            assert await a.call(b.address, "echo", "after") == {
                "from": a.identity.public_key, "body": "after"}
        answer = await a.call(b.address, "echo", big[:1000], retransmit=True)
        assert answer["body"] == big[:1000]
        assert a.transport.statistics().connections_dialed == 1


async def test_a_bug_in_the_handler_ends_one_request_never_the_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception that is not a ketten error (a bug, here or in a plugin) from the
    node's handler is answered as an internal error, or drops one message; the
    transport counts it and keeps serving."""
    inbox: list[Any] = []
    async with tcp_node() as a, tcp_node() as b:
        echo_services(b, inbox)
        real_request, real_message = ketten.Node.handle_request, ketten.Node.handle_message

        async def buggy_request(self: ketten.Node, peer: Peer, data: bytes) -> bytes:
            if self is b and ketten.wire.decode_message(data)[1] == "bug":
                raise RuntimeError("a bug")
            return await real_request(self, peer, data)

        async def buggy_message(self: ketten.Node, peer: Peer, data: bytes) -> None:
            if self is b:
                raise ZeroDivisionError("another bug")
            await real_message(self, peer, data)

        monkeypatch.setattr(ketten.Node, "handle_request", buggy_request)
        monkeypatch.setattr(ketten.Node, "handle_message", buggy_message)
        for _ in range(3):
            with pytest.raises(RemoteError, match="failed on this node") as failed:
                await a.call(b.address, "echo", "bug")
            assert failed.value.code == "InternalError"
            await a.notify(b.address, "inbox", "x")
        assert (await a.call(b.address, "echo", "fine"))["body"] == "fine"
        await trio.sleep(0.2)
        assert b.transport.statistics().internal_errors == 6
        assert inbox == []
