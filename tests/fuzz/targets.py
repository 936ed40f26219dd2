"""Fuzz targets: every decoder of bytes from the network or from disk.

Each target takes arbitrary bytes and may fail only with the errors its
format documents (``ALLOWED``); anything else is a bug. ``fuzz.py`` runs them
coverage-guided under atheris; ``tests/test_fuzz.py`` replays the checked-in
corpus (``corpus/<target>/``) in the default run and fuzzes each target for
a bounded time in CI.
"""

from __future__ import annotations

from collections.abc import Callable

from ketten import DecodeError, Event, Identity, InvalidEvent
from ketten._core import messages
from ketten._core.leases import CursorState, LeaseTable
from ketten._core.membership import ChainState
from ketten.adapters._framing import FrameDecoder, parse_frame
from ketten.adapters._tcp_handshake import Handshake, HandshakeRefused, NetworkParams
from ketten.errors import StoreCorrupted
from ketten.plugins.file_store import _format as file_format
from ketten.wire import decode_message, loads

_HANDSHAKE_ID = Identity.from_seed(b"\x05" * 32)
_MESSAGE_TYPES: list[type] = [
    messages.Offer, messages.OfferReply, messages.Append, messages.AppendReply,
    messages.Vote, messages.VoteReply, messages.CommitQuery, messages.CommitReply,
    messages.Fetch, messages.FetchReply, messages.Locate, messages.LocateReply,
    messages.Digest, messages.DigestReply,
]


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
    if data[:1] == b"c":
        file_format.decode_cursor("fuzz", data[1:])
    elif data[:1] == b"q":
        file_format.decode_spans("fuzz", data[1:])


TARGETS: dict[str, Callable[[bytes], None]] = {
    "frames": frames, "cbor": cbor, "event": event, "message": message,
    "handshake": handshake, "stored_state": stored_state, "file_records": file_records,
}
ALLOWED: dict[str, tuple[type[BaseException], ...]] = {
    "frames": (DecodeError,), "cbor": (DecodeError,), "event": (DecodeError, InvalidEvent),
    "message": (DecodeError,), "handshake": (DecodeError, HandshakeRefused),
    "stored_state": (DecodeError,), "file_records": (StoreCorrupted,),
}


def run(name: str, data: bytes) -> None:
    """Feed ``data`` to target ``name``; an error outside its ``ALLOWED`` escapes."""
    try:
        TARGETS[name](data)
    except ALLOWED[name]:
        pass
