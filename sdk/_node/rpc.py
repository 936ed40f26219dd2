"""``Rpc``: typed request/response between nodes over the transport.

Requests are typed messages (:mod:`ketten._core.messages`) or, for plugins,
plain CBOR bodies under a service name, in the ``[service, body]``
envelope. ``Rpc`` is the transport's handler: it decodes each incoming
frame at the edge, dispatches it to the registered service and isolates
failures: a :class:`~ketten.KettenError` becomes an error reply, and any
other exception (a bug of ours or of a plugin) is counted, logged with a
rate limit and answered as :class:`~ketten.errors.InternalError`; it ends
that one request, never the node.

Timeouts sit at the call site (``timeout=``); on transports that may lose
frames a request may be retransmitted (``retransmit=True``, for requests a
peer may safely handle twice).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import trio

from .._core.identity import node_id_of
from .._core.messages import Request
from .._wire import decode_envelope, encode_message
from ..errors import (
    DecodeError,
    InternalError,
    KettenError,
    PeerUnreachable,
    ProtocolError,
    StoreCorrupted,
    UsageError,
)
from ..interfaces import Peer, Reply, Transport
from ..logs import RateLimitedLog

__all__ = ["Rpc", "RpcStatistics", "guarded"]

_log = logging.getLogger("ketten.rpc")
_task_log = logging.getLogger("ketten.node")
R = TypeVar("R")
RawService = Callable[[Peer, Any], Awaitable[Any]]
RawMessageService = Callable[[Peer, Any], Awaitable[None]]


@attrs.frozen
class RpcStatistics:
    """Counters of a node's request handling."""

    requests_served: int
    requests_refused: int
    decode_errors: int
    internal_errors: int
    messages_taken: int
    wrong_responders: int
    """Answers refused because another node than the one asked answered."""


_BUG_LOG = RateLimitedLog(_task_log)


async def guarded(fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """Await ``fn(*args)``; an exception that is not a cancellation ends it, logged with a
    rate limit (a bug of ours or of a plugin degrades one task, never the node)."""
    try:
        await fn(*args)
    except KettenError as exc:
        _task_log.debug("%s ended: %s", getattr(fn, "__name__", fn), exc)
    except Exception as exc:
        name = str(getattr(fn, "__qualname__", fn))
        _BUG_LOG.warning("task_failed", "background task %s failed: %s: %s", name,
                         type(exc).__name__, exc, key=f"task:{name}", exc_info=True, task=name)



def _never(peer: Peer) -> bool:
    return False

@attrs.define(eq=False, repr=False)
class Rpc:
    """Request/response for the node's parts, and the transport's frame handler."""

    transport: Transport
    request_timeout: float
    seen: Callable[[Peer, bool], None] = lambda peer, reached: None
    """Called with every peer that sent an authenticated request, message or reply,
    unless it is a client node; ``reached``: its address is proven, because it
    answered a request sent there or the transport knows it listens there (see
    :func:`~ketten.interfaces.address_proven`); otherwise it only claims it."""
    damaged: Callable[[StoreCorrupted], None] = lambda exc: None
    """Called when serving a request found damaged stored data."""
    client: bool = False
    """This node is a client: every envelope it sends says so, and peers do not
    remember it as a member of the network."""
    _services: dict[str, RawService] = attrs.field(factory=dict, init=False)
    _messages: dict[str, RawMessageService] = attrs.field(factory=dict, init=False)
    _counts: dict[str, int] = attrs.field(init=False)
    _log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(_log), init=False)
    _vouches: Callable[[Peer], bool] = attrs.field(init=False)
    _resending: Callable[[str, bytes, float], Awaitable[Reply]] = attrs.field(init=False)
    _lossy: bool = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._counts = dict.fromkeys(attrs.fields_dict(RpcStatistics), 0)
        self.attach(self.transport)

    def attach(self, transport: Transport) -> None:
        """Carry frames over ``transport`` from now on."""
        self.transport = transport
        # Its optional parts, resolved once (not per message).
        vouches = getattr(transport, "address_proven", None)
        self._vouches = vouches if callable(vouches) else _never
        # A transport that resends by itself (the memory network) does it without
        # a task per copy; others get copies sent from here.
        resending = getattr(transport, "request_resending", None)
        self._resending = resending if callable(resending) else self._with_retransmits
        # A transport that cannot lose frames (TCP) gets nothing from a second copy
        # of a request but the extra work of answering it.
        self._lossy = bool(getattr(transport, "loses_frames", True))

    def statistics(self) -> RpcStatistics:
        return RpcStatistics(**self._counts)

    # -- registration ----------------------------------------------------------

    def serve(self, request_type: type[Request],
              handler: Callable[[Peer, Any], Awaitable[Any]]) -> None:
        """Answer ``request_type`` requests with ``handler(peer, request)`` (a typed reply)."""

        async def raw(peer: Peer, body: Any) -> Any:
            request = request_type.from_wire(body)
            reply = await handler(peer, request)
            return reply.to_wire()

        self.serve_raw(request_type.SERVICE, raw)

    def serve_raw(self, name: str, handler: RawService) -> None:
        """Answer requests to service ``name`` with ``handler(peer, body)`` (CBOR values)."""
        if name in self._services:
            raise UsageError(f"service {name!r} is already registered")
        self._services[name] = handler

    def serve_messages(self, name: str, handler: RawMessageService) -> None:
        """Take one-way messages to ``name`` with ``handler(peer, body)``."""
        if name in self._messages:
            raise UsageError(f"message service {name!r} is already registered")
        self._messages[name] = handler

    def has_service(self, name: str) -> bool:
        return name in self._services

    # -- calling ---------------------------------------------------------------

    async def call(self, address: str, request: Request, *, timeout: float | None = None,
                   retransmit: bool = False, expect: bytes | None = None) -> tuple[Peer, Any]:
        """Send ``request`` and return the authenticated peer that answered and its
        decoded reply.

        ``expect``: the public key of the node meant; an answer authenticated
        by another key (the address now belongs to someone else, or a peer
        claimed it) is a failure, so that one node's answer is never counted
        as another's.

        Raises :class:`~ketten.errors.PeerUnreachable` (refused, no reply in
        ``timeout``, or answered by a node other than ``expect``),
        :class:`~ketten.errors.RemoteError` (the peer answered with an error),
        :class:`~ketten.errors.DecodeError` (a malformed reply).
        """
        peer, body = await self.call_raw(address, request.SERVICE, request.to_wire(),
                                         timeout=timeout, retransmit=retransmit, expect=expect)
        try:
            return peer, request.Reply.from_wire(body)
        except DecodeError as exc:
            raise DecodeError(f"from {address}: {exc}") from None

    async def call_raw(self, address: str, service: str, body: Any, *,
                       timeout: float | None = None,
                       retransmit: bool = False,
                       expect: bytes | None = None) -> tuple[Peer, Any]:
        """Like :meth:`call` with a plain body under a service name."""
        limit = self.request_timeout if timeout is None else timeout
        data = encode_message(service, body, client=self.client)
        with trio.move_on_after(limit):
            if retransmit and self._lossy:
                # A fixed interval: with loss p per copy and its answer, a request
                # gets no answer in time with probability about (1 - (1 - p)^2)^8.
                reply = await self._resending(address, data, limit / 8)
            else:
                reply = await self.transport.request(address, data)
            if expect is not None and reply.peer.public_key != expect:
                self._counts["wrong_responders"] += 1
                raise PeerUnreachable(
                    f"{address} answered as node {reply.peer.node_id.hex()[:16]}, not as "
                    f"the node it was asked as ({node_id_of(expect).hex()[:16]})")
            name, reply_body, from_client = decode_envelope(reply.data)
            if not from_client:
                self.seen(reply.peer, True)
            if name != service:
                raise ProtocolError(f"{address} answered a {service!r} request as {name!r}")
            return reply.peer, reply_body
        raise PeerUnreachable(f"no reply from {address} within {limit} s")

    async def _with_retransmits(self, address: str, data: bytes, interval: float) -> Reply:
        # Earlier copies stay outstanding: a reply that is merely slow still
        # counts, whichever copy it answers.
        replies: list[Reply] = []
        failures: list[KettenError] = []
        async with trio.open_nursery() as nursery:

            async def attempt() -> None:
                try:
                    replies.append(await self.transport.request(address, data))
                except KettenError as exc:
                    failures.append(exc)
                nursery.cancel_scope.cancel()

            while True:
                nursery.start_soon(attempt)
                await trio.sleep(interval)
        if replies:
            return replies[0]
        raise failures[0]

    async def notify(self, address: str, service: str, body: Any) -> None:
        """Send a one-way message (it may be lost)."""
        await self.transport.send(address, encode_message(service, body, client=self.client))

    # -- the transport's handler ---------------------------------------------------

    async def handle_request(self, peer: Peer, data: bytes) -> bytes:
        try:
            service, body, from_client = decode_envelope(data)
        except DecodeError:
            self._counts["decode_errors"] += 1
            raise
        if not from_client:
            self.seen(peer, self._vouches(peer))
        handler = self._services.get(service)
        if handler is None:
            self._counts["requests_refused"] += 1
            raise ProtocolError(f"unknown service {service!r}")
        try:
            answer = await handler(peer, body)
            encoded = encode_message(service, answer, client=self.client)
        except DecodeError:
            self._counts["decode_errors"] += 1
            raise
        except KettenError as exc:
            self._counts["requests_refused"] += 1
            if isinstance(exc, StoreCorrupted):
                self.damaged(exc)
            raise
        except Exception as exc:
            self._counts["internal_errors"] += 1
            self._log.warning("internal_error", "%s request from %s failed: %s: %s",
                              service, peer.address, type(exc).__name__, exc,
                              key=f"internal:{service}", exc_info=True, service=service,
                              peer=peer.address)
            raise InternalError(f"the {service!r} request failed on this node "
                                f"({type(exc).__name__})") from None
        self._counts["requests_served"] += 1
        return encoded

    async def handle_message(self, peer: Peer, data: bytes) -> None:
        try:
            service, body, from_client = decode_envelope(data)
        except DecodeError:
            self._counts["decode_errors"] += 1
            return
        if not from_client:
            self.seen(peer, self._vouches(peer))
        handler = self._messages.get(service)
        if handler is None:
            self._counts["requests_refused"] += 1
            return
        try:
            await handler(peer, body)
            self._counts["messages_taken"] += 1
        except KettenError:
            self._counts["requests_refused"] += 1
        except Exception as exc:
            self._counts["internal_errors"] += 1
            self._log.warning("internal_error", "%s message from %s failed: %s: %s",
                              service, peer.address, type(exc).__name__, exc,
                              key=f"internal-msg:{service}", exc_info=True, service=service,
                              peer=peer.address)
