"""The node's message envelope: ``[service, body]`` in CBOR."""

from __future__ import annotations

from typing import Any

from ._core import codec as _codec
from .errors import DecodeError

__all__ = ["MAX_MESSAGE_SIZE", "decode_message", "encode_message"]

MAX_MESSAGE_SIZE = 4 << 20


def encode_message(service: str, body: Any, *, client: bool = False) -> bytes:
    """The ``[service, body]`` envelope of a request, reply or message, as CBOR bytes.

    ``client``: the sender is a client node (:attr:`ketten.NodeConfig.client`),
    which the receiver must not remember as a member of the network; the
    envelope then has a third element, ``1``.
    """
    return _codec.dumps_wire([service, body, 1] if client else [service, body])


def decode_message(data: bytes, *, max_size: int = MAX_MESSAGE_SIZE) -> tuple[str, Any]:
    """Split an envelope. Raises :class:`~ketten.errors.DecodeError`."""
    service, body, _client = decode_envelope(data, max_size=max_size)
    return service, body


def decode_envelope(data: bytes, *,
                    max_size: int = MAX_MESSAGE_SIZE) -> tuple[str, Any, bool]:
    """Split an envelope into service, body and whether a client node sent it.

    Raises :class:`~ketten.errors.DecodeError`.
    """
    value = _codec.loads(data, max_size=max_size, where="message")
    if (type(value) is not list or len(value) not in (2, 3) or type(value[0]) is not str
            or (len(value) == 3 and value[2] != 1)):
        raise DecodeError("expected [service, body] or [service, body, 1]", where="message")
    return value[0], value[1], len(value) == 3


def field(body: Any, name: str, kind: type | tuple[type, ...], *, where: str) -> Any:
    """``body[name]``, checked to be of ``kind``. Raises :class:`~ketten.errors.DecodeError`."""
    if type(body) is not dict:
        raise DecodeError("expected a map", where=where)
    if name not in body:
        raise DecodeError(f"missing field {name!r}", where=where)
    value = body[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise DecodeError(f"field {name!r} has the wrong type {type(value).__name__}", where=where)
    return value
