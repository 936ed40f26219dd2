"""A small library of hostile peers: authenticated on real loopback TCP, they send
what no well-behaved node would.

* :class:`RawClient` and :func:`raw_connect` - the handshake run by hand (or
  spoiled on purpose), then raw frames;
* :class:`HostilePeer` - an authenticated peer that sends any request or
  message body to any service and reports what came back;
* :func:`mutations` - seeded, replayable mutations of honest message bodies;
* :func:`retained_memory` - the Python memory a flood leaves allocated.
"""

from __future__ import annotations

import contextlib
import gc
import random
import secrets
import tracemalloc
from collections.abc import Iterator
from typing import Any

import attrs
import trio

from ketten import DecodeError, Identity
from ketten.adapters._framing import (
    Auth,
    ErrorReply,
    FrameDecoder,
    Hello,
    Message,
    Refuse,
    Reply,
    Request,
    encode_body,
    encode_frame,
    frame_body,
    framed,
    parse_frame,
)
from ketten.adapters._tcp_cipher import Session
from ketten.adapters._tcp_handshake import Handshake, HandshakeRefused, NetworkParams
from ketten.adapters.tcp import parse_address
from ketten.wire import MAX_UINT, encode_message


class RawClient:
    """A hand-driven peer for feeding a node bytes no well-behaved node would send.

    Once the handshake is done, ``session`` (if the node encrypts) seals what
    :meth:`send` and :meth:`send_body` write and opens what :meth:`frame` reads;
    ``stream.send_all`` writes bytes as they are.
    """

    def __init__(self, stream: trio.SocketStream, decoder: FrameDecoder) -> None:
        self.stream = stream
        self.decoder = decoder
        self.session: Session | None = None

    async def frame(self) -> Any:
        """The node's next frame, or ``None`` once it closed the connection."""
        while (body := self.decoder.next_body()) is None:
            data = await self._receive()
            if not data:
                return None
            self.decoder.feed(data)
        if self.session is not None:
            try:
                body = self.session.open(body)
            except DecodeError:
                # A refusal of our auth comes in clear: the handshake is not over yet.
                refusal = parse_frame(body, max_size=len(body))
                if not isinstance(refusal, Refuse):
                    raise
                return refusal
        return parse_frame(body, max_size=len(body))

    async def send(self, frame: Any) -> None:
        await self.send_body(frame_body(frame))

    async def send_body(self, body: bytes) -> None:
        """``body`` as one frame, sealed like an honest peer's (whatever it holds)."""
        if self.session is not None:
            body = self.session.seal(body)
        await self.stream.send_all(framed(body))

    async def closed(self) -> bool:
        """True once the node closed the connection (anything it still sends is skipped)."""
        with trio.fail_after(5):
            while await self._receive():
                pass
        return True

    async def _receive(self) -> bytes:
        """The next bytes from the node (empty once it closed or broke the connection)."""
        try:
            return await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            return b""


async def raw_connect(address: str, *, identity: Identity | None = None,
                      params: NetworkParams | None = None, hello: Hello | None = None,
                      signature: bytes | None = None,
                      local_address: str | None = None,
                      claimed: str = "127.0.0.1:1") -> tuple[RawClient, Any]:
    """Connect (from ``local_address``, an IP of this host) and run the handshake by
    hand; returns the client and the node's last frame."""
    host, port = parse_address(address)
    stream = await trio.open_tcp_stream(host, port, local_address=local_address)
    client = RawClient(stream, FrameDecoder(1 << 22))
    shake = Handshake(identity or Identity.generate(), params or NetworkParams(),
                      claimed, initiator=True, nonce=secrets.token_bytes(32))
    await stream.send_all(encode_frame(hello or shake.hello()))
    theirs = await client.frame()
    if not isinstance(theirs, Hello):
        return client, theirs
    try:
        auth = shake.receive_hello(theirs, encode_body(theirs))
    except HandshakeRefused:
        return client, await client.frame()
    await stream.send_all(encode_frame(Auth(signature) if signature is not None else auth))
    answer = await client.frame()
    if isinstance(answer, Auth):
        client.session = shake.session()
    return client, answer


class HostilePeer:
    """An authenticated peer of one node that sends whatever it is given.

    Every request waits for its answer: ``("reply", body)``, ``("error", code)``
    or ``("closed", None)`` when the node cut the connection (the peer then
    connects again for the next request). ``closes`` counts those.
    """

    def __init__(self, address: str, identity: Identity | None = None,
                 params: NetworkParams | None = None, claimed: str = "127.0.0.1:1") -> None:
        self.address = address
        self.claimed = claimed
        self.identity = identity or Identity.generate()
        self.params = params or NetworkParams()
        self.closes = 0
        self._client: RawClient | None = None
        self._next = 0

    async def _connected(self) -> RawClient:
        if self._client is None:
            client, answer = await raw_connect(self.address, identity=self.identity,
                                               params=self.params, claimed=self.claimed)
            if not isinstance(answer, Auth):
                raise AssertionError(f"the handshake with {self.address} failed: {answer}")
            self._client = client
        return self._client

    async def request_raw(self, data: bytes, *, timeout: float) -> tuple[str, Any]:
        client = await self._connected()
        self._next += 1
        await client.send(Request(self._next, data))
        with trio.fail_after(timeout):
            while True:
                frame = await client.frame()
                if frame is None:
                    await self.aclose()
                    self.closes += 1
                    return "closed", None
                if isinstance(frame, Reply) and frame.req_id == self._next:
                    return "reply", frame.data
                if isinstance(frame, ErrorReply) and frame.req_id == self._next:
                    return "error", frame.code
                # Anything else (the node's own requests, older answers) is ignored.

    async def request(self, service: str, body: Any, *, timeout: float) -> tuple[str, Any]:
        return await self.request_raw(encode_message(service, body), timeout=timeout)

    async def message(self, service: str, body: Any) -> None:
        client = await self._connected()
        await client.send(Message(encode_message(service, body)))

    async def aclose(self) -> None:
        if self._client is not None:
            await trio.aclose_forcefully(self._client.stream)
            self._client = None


# -- mutations of honest bodies --------------------------------------------------------


def _odd_value(rng: random.Random) -> Any:
    return rng.choice([
        lambda: None, lambda: True, lambda: -1, lambda: 0, lambda: MAX_UINT,
        lambda: -MAX_UINT - 1, lambda: 2**63, lambda: rng.randrange(-10, 1 << 40),
        lambda: 1.5, lambda: float("nan"), lambda: "", lambda: "x" * rng.randrange(300),
        lambda: b"", lambda: secrets.token_bytes(rng.choice([1, 31, 32, 33, 64, 200])),
        lambda: [], lambda: {}, lambda: [0] * rng.randrange(1, 5000),
        lambda: {"c": b"\0" * 32}, lambda: [[[[[[[[[[[]]]]]]]]]]],
    ])()


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*path, index))


def _replace(value: Any, path: tuple[Any, ...], make: Any) -> Any:
    if not path:
        return make(value)
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        copy = dict(value)
        copy[head] = _replace(value[head], rest, make)
        return copy
    copy_list = list(value)
    copy_list[head] = _replace(value[head], rest, make)
    return copy_list


def mutate(body: Any, rng: random.Random) -> Any:
    """One random change of ``body``: a value of another type or size, a field
    dropped or added, a list cut short or repeated, a byte string flipped."""
    path = rng.choice(list(_paths(body)))

    def change(old: Any) -> Any:
        kind = rng.randrange(6)
        if kind == 0 and isinstance(old, dict) and old:
            copy = dict(old)
            del copy[rng.choice(list(copy))]
            return copy
        if kind == 1 and isinstance(old, dict):
            return {**old, rng.choice(["x", "c", 0, b"k"]): _odd_value(rng)}
        if kind == 2 and isinstance(old, list) and old:
            return old[: rng.randrange(len(old))] if rng.random() < 0.5 else old * 50
        if kind == 3 and isinstance(old, bytes) and old:
            flipped = bytearray(old)
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            return bytes(flipped)
        if kind == 4 and isinstance(old, int) and not isinstance(old, bool):
            return old + rng.choice([-1, 1, 1 << 32, -(1 << 32)])
        return _odd_value(rng)

    return _replace(body, path, change)


def mutations(bodies: list[tuple[str, Any]], count: int, seed: int,
              ) -> Iterator[tuple[str, Any]]:
    """``count`` mutated ``(service, body)`` pairs drawn from ``bodies``; the same seed
    gives the same sequence."""
    rng = random.Random(seed)
    for _ in range(count):
        service, body = rng.choice(bodies)
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            body = mutate(body, rng)
        yield service, body


@attrs.define
class Retained:
    """Bytes still allocated when a :func:`retained_memory` block ended, and its peak."""

    bytes: int = 0
    peak: int = 0


@contextlib.contextmanager
def retained_memory() -> Iterator[Retained]:
    """Measure the Python allocations made inside the block that are still alive after
    it (a garbage collection first): what a flood costs a node in memory that stays.
    Everything in the process counts, the nodes and the flooding peer alike."""
    gc.collect()
    tracemalloc.start()
    result = Retained()
    try:
        yield result
    finally:
        gc.collect()
        result.bytes, result.peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
