"""The ``gosskip`` service's messages, encoded and checked at the edge.

* ``{"op": "gossip", "level": i, "order": o, "entries": [contact, ...]}`` ->
  ``{"order": o, "succ": [contact, ...][, "notify": contact]}``
* ``{"op": "find", "target": <32 bytes>, "at": o}`` (the ring point
  ``(target, o)``) -> ``{"order": o, "succ": [contact, ...], "pred": [contact, ...], "closer": [contact, ...]}``

A contact is ``[address, 32-byte public key, order]``. Every list has a
bound; anything malformed raises :class:`~ketten.errors.DecodeError`, a
list over its bound :class:`~ketten.errors.ProtocolError`, for that message
only. ``order`` values are the answering or sending node's own, paired with
the peer the transport authenticated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ketten.errors import DecodeError, ProtocolError
from ketten.interfaces import Peer
from ketten.wire import field

from ._lookup import Found
from ._names import ORDER_BITS, Contact, point
from ._ring import MAX_ENTRIES, Answer

__all__ = [
    "MAX_CLOSER",
    "FindRequest",
    "GossipRequest",
    "decode_answer",
    "decode_found",
    "decode_request",
    "encode_answer",
    "encode_contacts",
    "encode_find",
    "encode_found",
    "encode_gossip",
]

MAX_CLOSER = 8
"""How many links nearer a target a find answer may name."""


@attrs.frozen
class GossipRequest:
    level: int
    order: int
    entries: tuple[Contact, ...]


@attrs.frozen
class FindRequest:
    target: int
    """A ring position."""


def encode_contact(contact: Contact) -> list[Any]:
    return [contact.peer.address, contact.peer.public_key, contact.order]


def encode_contacts(contacts: Sequence[Contact]) -> list[list[Any]]:
    return [encode_contact(c) for c in contacts]


def _order(value: Any, where: str) -> int:
    if type(value) is not int or not 0 <= value < 1 << ORDER_BITS:
        raise DecodeError("an order must be an integer of 64 bits", where=where)
    return value


def _contact(item: Any, where: str) -> Contact:
    if (type(item) is not list or len(item) != 3 or type(item[0]) is not str or not item[0]
            or type(item[1]) is not bytes or len(item[1]) != 32):
        raise DecodeError("a contact must be [address, 32-byte public key, order]",
                          where=where)
    return Contact(Peer(item[0], item[1]), _order(item[2], where))


def _contacts(body: Any, name: str, limit: int, where: str) -> tuple[Contact, ...]:
    items = field(body, name, list, where=where)
    if len(items) > limit:
        raise ProtocolError(f"{where}: {len(items)} contacts in {name!r}, at most {limit}")
    return tuple(_contact(item, where) for item in items)


def encode_gossip(level: int, order: int, entries: Sequence[Contact]) -> dict[str, Any]:
    return {"op": "gossip", "level": level, "order": order, "entries": encode_contacts(entries)}


def encode_find(key: bytes, at: int = 0) -> dict[str, Any]:
    return {"op": "find", "target": key, "at": at}


def decode_request(body: Any) -> GossipRequest | FindRequest:
    """A request to the ``gosskip`` service."""
    op = field(body, "op", str, where="gosskip request")
    if op == "gossip":
        where = "gosskip gossip"
        level = field(body, "level", int, where=where)
        if level < 0:
            raise DecodeError("a level must not be negative", where=where)
        return GossipRequest(level, _order(field(body, "order", int, where=where), where),
                             _contacts(body, "entries", MAX_ENTRIES, where))
    if op == "find":
        where = "gosskip find"
        target = field(body, "target", bytes, where=where)
        if len(target) != 32:
            raise DecodeError("a target must be 32 bytes", where=where)
        return FindRequest(point(target, _order(field(body, "at", int, where=where), where)))
    raise ProtocolError(f"unknown gosskip operation {op!r}")


def encode_answer(order: int, answer: Answer) -> dict[str, Any]:
    body: dict[str, Any] = {"order": order, "succ": encode_contacts(answer.successors)}
    if answer.notify is not None:
        body["notify"] = encode_contact(answer.notify)
    return body


def decode_answer(peer: Peer, body: Any) -> tuple[Contact, Answer]:
    """The authenticated responder and its answer to a gossip message."""
    where = "gosskip gossip answer"
    order = _order(field(body, "order", int, where=where), where)
    successors = _contacts(body, "succ", MAX_ENTRIES, where)
    notify = _contact(body["notify"], where) if "notify" in body else None
    return Contact(peer, order), Answer(successors, notify)


def encode_found(order: int, successors: Sequence[Contact], predecessors: Sequence[Contact],
                 closer: Sequence[Contact]) -> dict[str, Any]:
    return {"order": order, "succ": encode_contacts(successors[:MAX_ENTRIES]),
            "pred": encode_contacts(predecessors[:MAX_ENTRIES]),
            "closer": encode_contacts(closer[:MAX_CLOSER])}


def decode_found(peer: Peer, body: Any) -> Found:
    """A find answer, its sender as the transport authenticated it."""
    where = "gosskip find answer"
    order = _order(field(body, "order", int, where=where), where)
    return Found(Contact(peer, order), _contacts(body, "succ", MAX_ENTRIES, where),
                 _contacts(body, "closer", MAX_CLOSER, where),
                 _contacts(body, "pred", MAX_ENTRIES, where))
