"""Fuzz targets: every decoder of bytes from the network or from disk.

Each target takes arbitrary bytes and may fail only with the errors its
format documents (``ALLOWED``); anything else is a bug. ``fuzz.py`` runs them
coverage-guided under atheris; ``tests/test_fuzz.py`` replays the checked-in
corpus (``corpus/<target>/``) in the default run and fuzzes each target for
a bounded time in CI.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import Any

import trio

from ketten import DecodeError, Event, Identity, InvalidEvent, ProtocolError
from ketten._core import messages
from ketten._core.car import read_car_header, read_car_sections
from ketten._core.chain_car import chain_from_car
from ketten._core.ipld import decode_block
from ketten._core.leases import CursorState, LeaseTable
from ketten._core.membership import ChainState, Member
from ketten._node.feeds import Feeds
from ketten.adapters._framing import FrameDecoder, parse_frame
from ketten.adapters._tcp_handshake import Handshake, HandshakeRefused, NetworkParams
from ketten.errors import StoreCorrupted
from ketten.interfaces import Peer
from ketten.plugins import ipfs, kademlia
from ketten.plugins import static_overlay as static
from ketten.plugins.file_store import _format as file_format
from ketten.plugins.file_store._index import Index, Segment, layout, replay
from ketten.plugins.gosskip import _messages as gosskip
from ketten.plugins.ipfs._blocks import Blockstore
from ketten.plugins.ipfs._heads import HeadRecords
from ketten.plugins.ipfs._index import ChainIndex
from ketten.plugins.ipfs._providers import ProviderRecords
from ketten.wire import decode_message, loads

_HANDSHAKE_ID = Identity.from_seed(b"\x05" * 32)
_MESSAGE_TYPES: list[type] = [
    messages.Offer, messages.OfferReply, messages.Append, messages.AppendReply,
    messages.Vote, messages.VoteReply, messages.CommitQuery, messages.CommitReply,
    messages.Fetch, messages.FetchReply, messages.Locate, messages.LocateReply,
    messages.Digest, messages.DigestReply, messages.Handover, messages.HandoverReply,
    messages.CommitNotice, messages.Retire, messages.Ping, messages.Pong,
]


_PEER = Peer("127.0.0.1:7", Identity.from_seed(b"\x06" * 32).public_key)
"""The authenticated sender of every request body the plugin targets serve."""


def _served(call: Awaitable[Any]) -> Any:
    """Run a service handler that never waits (its fakes answer at once) to its end."""
    coro: Any = call
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError("a handler under fuzzing waited for something")


def _body(data: bytes) -> Any:
    return loads(data, max_size=1 << 20, where="fuzz")


def frames(data: bytes) -> None:
    decoder = FrameDecoder(1 << 16)
    decoder.feed(data)
    while (body := decoder.next_body()) is not None:
        parse_frame(body, max_size=1 << 16)


def cbor(data: bytes) -> None:
    loads(data, max_size=1 << 20, where="fuzz")


def event(data: bytes) -> None:
    Event.from_bytes(data).verify()


def message(data: bytes) -> None:
    if not data:
        return
    # The first byte picks the type; its top bit: the rest is a [service, body] envelope.
    kind = _MESSAGE_TYPES[(data[0] & 0x7F) % len(_MESSAGE_TYPES)]
    if data[0] & 0x80:
        _, body = decode_message(data[1:])
    else:
        body = loads(data[1:], max_size=1 << 20, where="fuzz")
    kind.from_wire(body)  # type: ignore[attr-defined]


def handshake(data: bytes) -> None:
    # Two bytes give the length of the peer's hello; its auth follows.
    split = 2 + int.from_bytes(data[:2], "big")
    hello, auth = data[2:split], data[split:]
    shake = Handshake(_HANDSHAKE_ID, NetworkParams(), "127.0.0.1:1", False, bytes(32))
    shake.receive_hello(parse_frame(hello, max_size=4096), hello)
    shake.receive_auth(parse_frame(auth, max_size=4096), None)
    shake.session()


def stored_state(data: bytes) -> None:
    which = data[:1]
    rest = data[1:]
    if which == b"s":
        ChainState.decode(rest)
    elif which == b"l":
        LeaseTable.decode(rest, max_leases=64, max_per_subscriber=8)
    else:
        CursorState.decode(rest, where="fuzz")


def file_records(data: bytes) -> None:
    size = len(data)
    for pos in range(0, min(size, 64)):
        file_format.parse_frame(data, pos, size)
        file_format.plausible_length(data, pos, size)
    file_format.find_commit(data, 0, size)
    if data[:1] == b"s":  # a segment as the store replays it at open
        rest = data[1:]
        file_format.is_base(rest, len(rest))
        index = Index()
        replay(index, [Segment(0, "fuzz", rest, len(rest))], {})
        index.finish()
        layout(index.freeze())
    elif data[:1] == b"c":
        file_format.decode_cursor("fuzz", data[1:])
    elif data[:1] == b"q":
        file_format.decode_spans("fuzz", data[1:])


class _KadServer:
    """Just what ``KademliaOverlay._serve`` reads: options, a routing table with a
    few contacts, counters; the address a requester claims is not checked."""

    _serve = kademlia.KademliaOverlay._serve

    def __init__(self) -> None:
        self.options = kademlia.KademliaOptions.parse({}, 3)
        own = int.from_bytes(_HANDSHAKE_ID.node_id, "big")
        self._table = kademlia.RoutingTable(own, k=self.options.k,
                                            sibling_size=self.options.siblings,
                                            difficulty=0, stale_after=3)
        for i in range(12):
            key = Identity.from_seed(bytes([i + 16]) * 32).public_key
            self._table.observe(kademlia.Contact.of(Peer(f"127.0.0.1:{1000 + i}", key)), 0.0)
        self._counts = {"requests_served": 0}

    def _claimed(self, peer: Peer) -> None:
        pass


def kad(data: bytes) -> None:
    # The first byte: even, a request to the "kad" service; odd, a find answer
    # decoded for that many contacts (at least one).
    if not data:
        return
    body = _body(data[1:])
    if data[0] & 1:
        kademlia.decode_contacts(body, data[0] % 3, max(1, data[0] >> 1))
    else:
        _served(_KadServer()._serve(_PEER, body))


def static_hello(data: bytes) -> None:
    # The first byte: even, a hello to the "static" service; odd, the known
    # members of a hello reply.
    if not data:
        return
    node = SimpleNamespace(
        identity=_HANDSHAKE_ID, address="127.0.0.1:2", config=SimpleNamespace(replication=3),
        register_service=lambda name, handler: None,
        nursery=SimpleNamespace(start_soon=lambda *args: None),  # the dial-back of a claim
        plugins=SimpleNamespace(hook=SimpleNamespace(ketten_peer_joined=lambda **kw: None)))
    overlay = static.StaticOverlay(node=node, seeds=[])  # type: ignore[arg-type]
    body = _body(data[1:])
    if data[0] & 1:
        overlay._learn(body, "hello reply")
    else:
        _served(overlay._serve(_PEER, body))


def gosskip_message(data: bytes) -> None:
    # The first byte picks the decoder: a request, a gossip answer, a find answer.
    if not data:
        return
    body = _body(data[1:])
    which = data[0] % 3
    if which == 0:
        gosskip.decode_request(body)
    elif which == 1:
        gosskip.decode_answer(_PEER, body)
    else:
        gosskip.decode_found(_PEER, body)


class _SubscriptionBroker:
    """Just what the ``sub`` service handlers of :class:`Feeds` read: a broker of
    every criterion whose other broker is the sender; leases go to a real table."""

    _serve = Feeds._serve
    _serve_lease = Feeds._serve_lease
    _serve_merge = Feeds._serve_merge
    max_leases = 64

    def __init__(self) -> None:
        self._table = LeaseTable(max_leases=self.max_leases, max_per_subscriber=16,
                                 max_per_chain=4)

    def now_ms(self) -> int:
        return 10**9

    async def is_broker(self, key: bytes) -> bool:
        return True

    async def members(self, key: bytes) -> list[Member]:
        return [Member(_PEER.public_key, _PEER.address)]

    def local_commit(self, key: bytes) -> None:
        return None

    async def put_leases(self, leases: Sequence[tuple[bytes, Any]]) -> None:
        for key, lease in leases:
            self._table.put(key, lease, self.now_ms())


def subscription(data: bytes) -> None:
    _served(_SubscriptionBroker()._serve(_PEER, _body(data)))


def car(data: bytes) -> None:
    # A CAR file given to ``ketten car import`` or ``ketten store check``.
    roots, offset = read_car_header(data)
    chain_from_car(roots, read_car_sections(data, offset))


_EVENT_CID_PREFIX = b"\x01\x71\x12\x20"  # CIDv1, dag-cbor, sha2-256, 32 bytes


def ipld_block(data: bytes) -> None:
    # A block a Bitswap-style peer sent: under the CID of its own bytes, so the
    # decoder gets past the hash check and reads the content.
    decode_block(_EVENT_CID_PREFIX + hashlib.sha256(data).digest(), data)


class _IpfsServer:
    """Just what ``IpfsOverlay._serve`` reads: real provider and head records, a real
    chain index and blockstore (empty), a store that holds no events."""

    _serve = ipfs.IpfsOverlay._serve
    _tip = ipfs.IpfsOverlay._tip
    _want = ipfs.IpfsOverlay._want

    def __init__(self) -> None:
        self._records = ProviderRecords(ttl=60.0)
        self._heads = HeadRecords(ttl=60.0)
        self._index = ChainIndex()
        self._blocks = Blockstore(max_bytes=1 << 20)
        self._counts = {"blocks_served": 0}
        self._node = SimpleNamespace(store=SimpleNamespace(range=self._no_events))

    @staticmethod
    async def _no_events(key: bytes, start: int, stop: int) -> list[Event]:
        return []

    async def _indexed(self, key: bytes) -> None:
        return None


def ipfs_request(data: bytes) -> None:
    # A request to the "ipfs" service (provide, providers, tip, put_head,
    # get_head, have, want); a head block carried in put_head is decoded too.
    body = _body(data)
    trio.run(_IpfsServer()._serve, _PEER, body)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "frames": frames, "cbor": cbor, "event": event, "message": message,
    "handshake": handshake, "stored_state": stored_state, "file_records": file_records,
    "kad": kad, "static_hello": static_hello, "gosskip_message": gosskip_message,
    "subscription": subscription, "car": car, "ipld_block": ipld_block,
    "ipfs_request": ipfs_request,
}
ALLOWED: dict[str, tuple[type[BaseException], ...]] = {
    "frames": (DecodeError,), "cbor": (DecodeError,), "event": (DecodeError, InvalidEvent),
    "message": (DecodeError,), "handshake": (DecodeError, HandshakeRefused),
    "stored_state": (DecodeError,), "file_records": (StoreCorrupted,),
    "kad": (DecodeError, ProtocolError), "static_hello": (DecodeError, ProtocolError),
    "gosskip_message": (DecodeError, ProtocolError),
    "subscription": (DecodeError, ProtocolError),
    "car": (DecodeError, InvalidEvent), "ipld_block": (DecodeError,),
    "ipfs_request": (DecodeError, InvalidEvent, ProtocolError),
}


def run(name: str, data: bytes) -> None:
    """Feed ``data`` to target ``name``; an error outside its ``ALLOWED`` escapes."""
    try:
        TARGETS[name](data)
    except ALLOWED[name]:
        pass
