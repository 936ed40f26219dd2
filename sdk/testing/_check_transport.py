"""``check_transport``: the conformance suite for transport plugins."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from .._core.identity import Identity
from ..errors import KettenError, PeerUnreachable, RemoteError, UsageError
from ..interfaces import Peer, Transport

__all__ = ["TransportFactory", "check_transport"]

TransportFactory = Callable[[Identity], Transport | Awaitable[Transport]]
"""Builds an unstarted transport owned by an identity (all of one test's transports must
reach each other)."""


def _fail(part: str, message: str) -> None:
    raise AssertionError(f"check_transport [{part}]: {message}")


@attrs.define(eq=False)
class _Echo:
    """A handler: answers requests, collects one-way messages."""

    messages: list[tuple[Peer, bytes]] = attrs.field(factory=list)
    arrived: trio.Event = attrs.field(factory=trio.Event)
    seen: list[Peer] = attrs.field(factory=list)

    async def handle_request(self, peer: Peer, data: bytes) -> bytes:
        self.seen.append(peer)
        if data == b"fail":
            raise UsageError("asked to fail")
        if data.startswith(b"sleep"):
            await trio.sleep(float(data[5:].decode()))
        return b"echo:" + data

    async def handle_message(self, peer: Peer, data: bytes) -> None:
        self.messages.append((peer, data))
        self.arrived.set()


async def check_transport(factory: TransportFactory, *, large: int = 1 << 20,
                          unreachable: str | None = None, timeout: float = 10.0) -> None:
    """Check a transport plugin against what ketten relies on.

    ``factory(identity)`` builds an unstarted transport (sync or async); the
    suite serves two of them and talks between them. ``unreachable`` is an
    address nothing serves at, if the transport has one to offer. Raises
    :class:`AssertionError` naming the part that failed:

    * ``serve`` - ``serve()`` reports the address it serves at with
      ``task_status.started(address)`` and matches ``transport.address``;
    * ``request`` - a request is answered, and the handler and the caller each
      see the other's authenticated identity (:class:`~ketten.interfaces.Peer`
      with the right key);
    * ``errors`` - a handler's :class:`~ketten.errors.KettenError` comes back as
      :class:`~ketten.errors.RemoteError` naming it; an address nothing
      serves at is :class:`~ketten.errors.PeerUnreachable` (or silence:
      callers time out);
    * ``concurrency`` - fifty requests in flight at once each get their own
      answer, a slow one does not hold up the others;
    * ``large`` - a ``large``-byte request and its answer arrive intact;
    * ``message`` - a one-way message arrives with its sender's identity;
    * ``statistics`` - ``statistics()`` returns a snapshot.

    Call it from your own tests, in trio::

        async def test_my_transport_conforms():
            await ketten.testing.check_transport(lambda identity: MyTransport(identity))
    """
    identities = [Identity.from_seed(bytes([i + 70]) * 32) for i in range(2)]

    async def make(identity: Identity) -> Transport:
        made = factory(identity)
        if isinstance(made, Awaitable):
            made = await made
        return made

    transports = [await make(identity) for identity in identities]
    handlers = [_Echo(), _Echo()]
    try:
        await _serve_and_check(transports, handlers, identities, large, unreachable, timeout)
    except BaseExceptionGroup as group:
        failures = [e for e in group.exceptions if isinstance(e, AssertionError)]
        if failures:
            raise failures[0] from None
        raise


async def _serve_and_check(transports: list[Transport], handlers: list[_Echo],
                           identities: list[Identity], large: int, unreachable: str | None,
                           timeout: float) -> None:
    with trio.fail_after(timeout):
        async with trio.open_nursery() as nursery:
            addresses: list[str] = []
            for transport, handler in zip(transports, handlers, strict=True):
                address = await nursery.start(transport.serve, handler)
                if not isinstance(address, str) or not address:
                    _fail("serve", f"serve() must report its address, got {address!r}")
                if transport.address != address:
                    _fail("serve", f"address is {transport.address!r}, serve() said {address!r}")
                addresses.append(address)
            a, b = transports
            await _requests(a, b, addresses, identities, handlers, large, unreachable)
            await _messages(a, addresses, identities, handlers)
            for transport in transports:
                stats: Any = transport.statistics()
                if stats is None:
                    _fail("statistics", "statistics() returned None")
            nursery.cancel_scope.cancel()


async def _requests(a: Transport, b: Transport, addresses: list[str],
                    identities: list[Identity], handlers: list[_Echo], large: int,
                    unreachable: str | None) -> None:
    reply = await a.request(addresses[1], b"hello")
    if reply.data != b"echo:hello":
        _fail("request", f"the answer was {reply.data!r:.60}, not b'echo:hello'")
    if reply.peer.public_key != identities[1].public_key:
        _fail("request", "the answer does not come with the answering node's identity")
    if not handlers[1].seen or handlers[1].seen[-1].public_key != identities[0].public_key:
        _fail("request", "the handler did not see the caller's identity")
    try:
        await a.request(addresses[1], b"fail")
    except RemoteError as exc:
        if "UsageError" not in str(exc) and exc.code != "UsageError":
            _fail("errors", f"a handler's UsageError came back as {exc!r}")
    else:
        _fail("errors", "a handler's error did not come back as RemoteError")
    if unreachable is not None:
        with trio.move_on_after(5.0):
            try:
                await a.request(unreachable, b"anyone?")
            except PeerUnreachable:
                pass
            except KettenError as exc:
                _fail("errors", f"an unreachable address raised {type(exc).__name__}, "
                      "not PeerUnreachable")
            else:
                _fail("errors", "a request to an unreachable address was answered")
    answers: list[bytes | None] = [None] * 50

    async def one(index: int) -> None:
        data = b"sleep0.5" if index == 0 else b"n%d" % index
        answers[index] = (await b.request(addresses[0], data)).data

    with trio.move_on_after(3.0) as scope:
        async with trio.open_nursery() as nursery:
            for index in range(50):
                nursery.start_soon(one, index)
    if scope.cancelled_caught:
        _fail("concurrency", "fifty concurrent requests were not all answered in 3 s")
    for index, answer in enumerate(answers[1:], start=1):
        if answer != b"echo:n%d" % index:
            _fail("concurrency", f"request {index} got the answer {answer!r:.40}")
    payload = bytes(range(256)) * (large // 256)
    reply = await a.request(addresses[1], payload)
    if reply.data != b"echo:" + payload:
        _fail("large", f"a {len(payload)}-byte request did not round-trip intact")


async def _messages(a: Transport, addresses: list[str], identities: list[Identity],
                    handlers: list[_Echo]) -> None:
    await a.send(addresses[1], b"one way")
    with trio.move_on_after(5.0):
        await handlers[1].arrived.wait()
    if not handlers[1].messages:
        _fail("message", "a one-way message did not arrive")
    peer, data = handlers[1].messages[0]
    if data != b"one way" or peer.public_key != identities[0].public_key:
        _fail("message", "the message or its sender's identity was changed on the way")
