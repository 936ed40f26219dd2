"""Frames of the TCP transport, sans-IO.

On the wire every frame is a 4-byte big-endian length followed by that many
bytes of canonical CBOR: ``[kind, ...fields]``. The length is checked
against the limit before any of the body is buffered, so a peer announcing a
huge frame is refused without the memory being allocated.
"""

from __future__ import annotations

import struct
from typing import Any

import attrs

from ketten import wire as _codec
from ketten.errors import DecodeError

__all__ = [
    "HEADER_SIZE",
    "Auth",
    "ErrorReply",
    "Frame",
    "FrameDecoder",
    "Hello",
    "Message",
    "Refuse",
    "Reply",
    "Request",
    "encode_frame",
    "frame_body",
    "framed",
    "parse_frame",
]

HEADER = struct.Struct(">I")
HEADER_SIZE = HEADER.size
_MAX_ID = 2**63 - 1

REQUEST, REPLY, ERROR, MESSAGE, HELLO, AUTH, REFUSE = range(7)


@attrs.frozen
class Request:
    req_id: int
    data: bytes


@attrs.frozen
class Reply:
    req_id: int
    data: bytes


@attrs.frozen
class ErrorReply:
    req_id: int
    code: str
    message: str


@attrs.frozen
class Message:
    data: bytes


@attrs.frozen
class Hello:
    """The first frame of each side: who it claims to be and the network's parameters."""

    version: int
    public_key: bytes
    node_id: bytes
    nonce: bytes
    replication: int
    difficulty: int
    address: str
    ephemeral: bytes = b""
    """The sender's X25519 key for frame encryption (empty: it sends frames in clear)."""


@attrs.frozen
class Auth:
    """Proof of key ownership: a signature over both hellos (see the handshake)."""

    signature: bytes


@attrs.frozen
class Refuse:
    reason: str


Frame = Request | Reply | ErrorReply | Message | Hello | Auth | Refuse


def encode_frame(frame: Frame) -> bytes:
    return framed(frame_body(frame))


def frame_body(frame: Frame) -> bytes:
    """A frame's body, without its length."""
    if isinstance(frame, Hello | Auth | Refuse):
        return encode_body(frame)  # the handshake transcript covers these bytes
    return _codec.dumps(_fields(frame))


def framed(body: bytes) -> bytes:
    """``body`` behind its length prefix."""
    return HEADER.pack(len(body)) + body


def encode_body(frame: Frame) -> bytes:
    return _codec.dumps_canonical(_fields(frame))


def _fields(frame: Frame) -> list[Any]:
    match frame:
        case Request(req_id, data):
            return [REQUEST, req_id, data]
        case Reply(req_id, data):
            return [REPLY, req_id, data]
        case ErrorReply(req_id, code, message):
            return [ERROR, req_id, code, message]
        case Message(data):
            return [MESSAGE, data]
        case Hello():
            return [HELLO, frame.version, frame.public_key, frame.node_id, frame.nonce,
                    frame.replication, frame.difficulty, frame.address, frame.ephemeral]
        case Auth(signature):
            return [AUTH, signature]
        case Refuse(reason):
            return [REFUSE, reason]
    raise TypeError(f"not a frame: {frame!r}")


_SHAPES: dict[int, tuple[type, ...]] = {
    REQUEST: (int, bytes),
    REPLY: (int, bytes),
    ERROR: (int, str, str),
    MESSAGE: (bytes,),
    HELLO: (int, bytes, bytes, bytes, int, int, str, bytes),
    AUTH: (bytes,),
    REFUSE: (str,),
}


def parse_frame(body: bytes, *, max_size: int) -> Frame:
    """Decode a frame body (without its length). Raises only :class:`DecodeError`."""
    value = _codec.loads(body, max_size=max_size, where="frame")
    if type(value) is not list or not value or type(value[0]) is not int:
        raise DecodeError("expected [kind, ...]", where="frame")
    kind, fields = value[0], value[1:]
    shape = _SHAPES.get(kind)
    if shape is None:
        raise DecodeError(f"unknown frame kind {kind}", where="frame")
    if len(fields) != len(shape) or any(type(f) is not t for f, t in zip(fields, shape)):
        raise DecodeError(f"malformed frame of kind {kind}", where="frame")
    if shape[0] is int and not 0 <= fields[0] <= _MAX_ID:
        raise DecodeError("integer field out of range", where="frame")
    match kind:
        case 0:
            return Request(*fields)
        case 1:
            return Reply(*fields)
        case 2:
            return ErrorReply(*fields)
        case 3:
            return Message(*fields)
        case 4:
            hello = Hello(*fields)
            if not (0 <= hello.replication <= _MAX_ID and 0 <= hello.difficulty <= 256):
                raise DecodeError("hello parameter out of range", where="hello")
            if len(hello.ephemeral) not in (0, 32):
                raise DecodeError("an ephemeral key must be 32 bytes", where="hello")
            return hello
        case 5:
            return Auth(*fields)
    return Refuse(*fields)


@attrs.define(eq=False)
class FrameDecoder:
    """Splits a byte stream into frame bodies; the limit is checked on the length prefix."""

    max_frame_size: int
    _buffer: bytearray = attrs.field(factory=bytearray, init=False)
    _need: int | None = attrs.field(default=None, init=False)

    def feed(self, data: bytes | bytearray) -> None:
        self._buffer += data

    def next_body(self) -> bytes | None:
        """The next complete frame body, or ``None`` if more bytes are needed.

        Raises :class:`DecodeError` for an empty or oversized frame (announced
        by its length prefix, before its body arrives).
        """
        buffer = self._buffer
        if self._need is None:
            if len(buffer) < HEADER_SIZE:
                return None
            (size,) = HEADER.unpack_from(buffer)
            if size == 0:
                raise DecodeError("empty frame", where="frame")
            if size > self.max_frame_size:
                raise DecodeError(
                    f"frame of {size} bytes exceeds the limit of {self.max_frame_size}",
                    where="frame",
                )
            del buffer[:HEADER_SIZE]
            self._need = size
        if len(buffer) < self._need:
            return None
        body = bytes(buffer[: self._need])
        del buffer[: self._need]
        self._need = None
        return body

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def in_frame(self) -> bool:
        """Whether part of a frame (its length prefix or body) has arrived but not all of it."""
        return bool(self._buffer) or self._need is not None
