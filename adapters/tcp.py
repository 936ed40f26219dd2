"""The ``tcp`` transport: authenticated, framed request/response over TCP (trio).

Frames are length-prefixed canonical CBOR (see :mod:`._framing`) carrying
request ids, so many requests share one connection. On connect both sides
run the handshake of :mod:`._tcp_handshake`: they prove ownership of their
Ed25519 key with signed nonces and must agree on the protocol version, the
replication factor ``r`` (``NodeConfig.replication``) and the id-puzzle
difficulty (``puzzle_difficulty`` of the **overlay** options, the same
value the kademlia overlay enforces). A mismatch refuses the peer with a
reason that both sides log (logger ``ketten.tcp``).

Between two nodes one connection carries the requests of both: the one
dialed by the node with the smaller key. A node sends its requests for an
address over a connection the peer dialed only once it has itself dialed
that address and found the same key there (the peer's hello only *claims*
its address), and only while that connection is in use (its dialer closes
it when idle). So a peer cannot capture the traffic meant for an address by
claiming it in its hello. Any other connection between the two falls idle
and is closed. A malformed frame closes only its connection.

A peer cannot hold a connection slot by saying nothing: connections still
in the handshake count against ``max_connections`` and are closed when the
handshake takes longer than ``handshake_timeout``. One source address
holds at most ``max_handshakes_per_source`` connections in the handshake
and ``max_per_source`` connections it dialed (the least recently used idle
one is closed to make room, as for ``max_connections``), so one host
cannot take every slot; an IPv6 source is its /64 network. At most a quarter
of ``max_connections`` incoming connections are in the handshake at once: a
new one ends the oldest of the source with the most under way, so hosts that
open connections and say nothing lose their own and cannot keep others out. A frame whose first byte
arrived must be complete within ``frame_timeout`` (and a frame being sent
must leave within it, else the connection is closed); a connection with no
request outstanding in either direction and no frame for ``idle_timeout``
is closed. Connections a peer dialed wait twice ``idle_timeout``, so the
dialer, which alone starts requests on a connection, normally closes it
first and never sends a request into a connection being closed.

Options (``NodeConfig.options["transport"]``):

``listen`` (``"host:port"``, default ``"127.0.0.1:0"``), ``advertise`` (the
address peers should dial, default the bound one), ``max_connections``
(256, including connections in the handshake), ``max_frame_size`` (bytes,
4 MiB, checked on the length prefix before the body is read),
``handshake_timeout`` (seconds, 10), ``frame_timeout`` (seconds, 30),
``idle_timeout`` (seconds, 300), ``max_concurrent_requests`` (64: requests
and messages of one peer handled at once, over all its connections),
``max_inflight_bytes`` (64 MiB: bytes of requests and messages handled at
once, all peers together; a frame beyond either bound waits, and its
connection is not read meanwhile), ``max_unsent_bytes`` (1 MiB: frames
waiting behind a write under way on one connection, beyond which their
senders wait: what a peer that stops reading pins in memory is this, its
requests' answers and the write under way, until ``frame_timeout`` cuts it
off), ``max_per_source`` (64) and ``max_handshakes_per_source`` (8):
incoming connections per source IP address; ``encrypt`` (true): seal
every frame after the handshake with ChaCha20-Poly1305 under keys from an
X25519 exchange in the handshake (:mod:`._tcp_cipher`); every node of a
network must use the same setting.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ketten import Identity, Option, PluginSpec, hookimpl
from ketten.errors import (
    ConfigError,
    DecodeError,
    KettenError,
    PeerUnreachable,
    ProtocolError,
    RemoteError,
    UsageError,
)
from ketten.interfaces import Handler, Peer, Reply
from ketten.logs import RateLimitedLog

from ._framing import (
    HEADER_SIZE,
    Auth,
    ErrorReply,
    FrameDecoder,
    Hello,
    Message,
    Refuse,
    Request,
    encode_frame,
    parse_frame,
)
from ._framing import Reply as ReplyFrame
from ._tcp_cipher import TAG_SIZE, Session
from ._tcp_connection import Connection
from ._tcp_handshake import PROTOCOL_VERSION, Handshake, HandshakeRefused, NetworkParams

if TYPE_CHECKING:
    from ketten import Node

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "PROTOCOL_VERSION",
    "NetworkParams",
    "TcpStatistics",
    "TcpTransport",
    "format_address",
    "parse_address",
]

DEFAULT_MAX_FRAME_SIZE = 4 << 20
_HANDSHAKE_FRAME_LIMIT = 4096
_READ_SIZE = 65536
_MAX_PROVEN = 4096
_log = logging.getLogger("ketten.tcp")


@attrs.frozen
class TcpStatistics:
    """Counters of one TCP transport."""

    connections_open: int
    connections_dialed: int
    requests_on_accepted: int
    """Requests and messages this node sent over a connection the peer dialed."""
    requests_resent: int
    """Requests sent again on a new connection because the peer had closed the one
    they went out on, as idle or for room, before it read them."""
    connections_accepted: int
    connections_refused: int
    refused_per_source: int
    handshakes_failed: int
    handshakes_timed_out: int
    handshakes_evicted: int
    """Incoming handshakes ended early for a newer one, when a quarter of
    ``max_connections`` were in the handshake (the oldest of the source with the
    most under way)."""
    malformed_frames: int
    stalled_frames: int
    """Connections closed because a frame of the peer's did not arrive whole in time."""
    stalled_sends: int
    """Connections closed because the peer did not take a write in time (it stopped
    reading)."""
    idle_closed: int
    requests_sent: int
    replies_received: int
    messages_sent: int
    requests_received: int
    messages_received: int
    error_replies_sent: int
    bytes_sent: int
    bytes_received: int
    internal_errors: int
    """Exceptions of a handler or of this transport that ended one request or one
    connection (a bug, counted and logged; never the node)."""


_HOSTNAME = re.compile(r"(?=.{1,253}$)(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
                       r"(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def parse_address(address: str, *, listen: bool = False) -> tuple[str, int]:
    """``"host:port"`` (``"[v6]:port"``) as ``(host, port)``.

    The host must be an IP address or an ASCII host name (peers claim
    addresses; an unencodable one must not reach the resolver). Port 0 (any
    free port) only where ``listen``. Raises :class:`UsageError`.
    """
    if type(address) is not str or len(address) > 300:
        raise UsageError(f"not a host:port address: {address!r:.80}")
    host, sep, port_text = address.rpartition(":")
    if (not sep or not host or not port_text.isascii() or not port_text.isdigit()
            or len(port_text) > 5 or not (0 if listen else 1) <= int(port_text) <= 65535):
        raise UsageError(f"not a host:port address: {address!r}")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if bracketed or not _HOSTNAME.fullmatch(host):
            raise UsageError(f"not a host:port address (bad host {host!r}): {address!r}") from None
    return host, int(port_text)


_MAX_CLAIMED = 255
"""The longest address a member entry on the wire may carry."""


def _check_claimed(address: str | None) -> None:
    """A peer's claimed address must be one that others can dial and carry in
    messages (at most 255 bytes); anything else ends the handshake."""
    try:
        if address is None or len(address.encode("utf-8", "replace")) > _MAX_CLAIMED:
            raise UsageError("too long")
        parse_address(address)
    except UsageError:
        raise HandshakeRefused(f"the address the peer claims ({address!r:.80}) is not a "
                               "host:port of at most 255 bytes") from None


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _option_int(options: Mapping[str, Any], name: str, default: int, low: int) -> int:
    value = options.get(name, default)
    if type(value) is not int or value < low:
        raise ConfigError(f"tcp option {name!r} must be an integer >= {low}, got {value!r}")
    return value


def _option_seconds(options: Mapping[str, Any], name: str, default: float) -> float:
    value = options.get(name, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise ConfigError(f"tcp option {name!r} must be a positive number of seconds, "
                          f"got {value!r}")
    return float(value)


def _unexpected(frame: Hello | Auth | Refuse) -> None:
    raise ProtocolError(f"unexpected {type(frame).__name__} after the handshake")


@attrs.define(eq=False)
class _ByteBudget:
    """Bytes in use, at most ``limit`` (one claim alone may exceed it: a frame the
    size bound admits is never refused, it waits until nothing else is in use)."""

    limit: int
    _used: int = 0
    _lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    async def acquire(self, size: int) -> None:
        while self._used and self._used + size > self.limit:
            await self._lot.park()
        self._used += size

    def release(self, size: int) -> None:
        self._used -= size
        self._lot.unpark_all()


def source_of(ip: str) -> str:
    """The source an incoming connection counts against: its IPv4 address, or the
    /64 network of an IPv6 one (one host commonly holds a whole /64)."""
    try:
        address = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@attrs.define(eq=False)
class TcpTransport:
    """A :class:`~ketten.interfaces.Transport` over TCP."""

    _identity: Identity = attrs.field(alias="identity")
    params: NetworkParams
    listen: str = "127.0.0.1:0"
    advertise: str | None = None
    max_connections: int = 256
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    handshake_timeout: float = 10.0
    frame_timeout: float = 30.0
    idle_timeout: float = 300.0
    max_concurrent_requests: int = 64
    max_inflight_bytes: int = 64 << 20
    max_per_source: int = 64
    max_handshakes_per_source: int = 8
    max_unsent_bytes: int = 1 << 20
    loses_frames: bool = attrs.field(default=False, init=False)
    """A frame arrives or its connection fails: callers need not retransmit."""
    _address: str | None = attrs.field(default=None, init=False)
    _handler: Handler | None = attrs.field(default=None, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _dialed: dict[str, Connection] = attrs.field(factory=dict, init=False)
    _accepted: dict[bytes, Connection] = attrs.field(factory=dict, init=False)
    """The latest open connection each peer key dialed."""
    _proven: OrderedDict[str, bytes] = attrs.field(factory=OrderedDict, init=False)
    """The key found at each address this node dialed (least recently used out)."""
    _open: set[Connection] = attrs.field(factory=set, init=False)
    _dialing: dict[str, trio.Event] = attrs.field(factory=dict, init=False)
    _handshaking: int = attrs.field(default=0, init=False)
    _handshaking_from: dict[str, int] = attrs.field(factory=dict, init=False)
    _incoming_shakes: OrderedDict[int, tuple[str, trio.CancelScope]] = attrs.field(
        factory=OrderedDict, init=False)
    """Incoming connections in the handshake, oldest first, with their sources."""
    _shakes_started: int = attrs.field(default=0, init=False)
    _peer_limits: dict[bytes, tuple[trio.Semaphore, int]] = attrs.field(factory=dict, init=False)
    """Per peer key: its requests in flight (shared by all its connections), and how
    many of its connections are open."""
    _budget: _ByteBudget = attrs.field(init=False)
    _counts: dict[str, int] = attrs.field(init=False)
    _events: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(_log), init=False)

    def __attrs_post_init__(self) -> None:
        parse_address(self.listen, listen=True)
        if self.advertise is not None:
            parse_address(self.advertise)
        self._counts = dict.fromkeys(attrs.fields_dict(TcpStatistics), 0)
        self._budget = _ByteBudget(self.max_inflight_bytes)

    @property
    def address(self) -> str:
        if self._address is None:
            raise UsageError("the tcp transport is not serving yet")
        return self._address

    def statistics(self) -> TcpStatistics:
        counts = dict(self._counts, connections_open=len(self._open))
        return TcpStatistics(**counts)

    # -- Transport -------------------------------------------------------------

    async def serve(
        self, handler: Handler, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and answer until cancelled. Raises :class:`ConfigError` if it cannot bind."""
        if self._nursery is not None:
            raise UsageError("this tcp transport is already serving")
        host, port = parse_address(self.listen, listen=True)
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {self.listen}: {exc}") from None
        for extra in listeners[1:]:
            await extra.aclose()
        listener = listeners[0]
        bound_host, bound_port = listener.socket.getsockname()[:2]
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._handler = handler
                self._address = self.advertise or format_address(bound_host, bound_port)
                await nursery.start(trio.serve_listeners, self._accept, [listener])
                nursery.start_soon(self._watch)
                task_status.started(self._address)
        finally:
            self._nursery = None
            self._handler = None
            for conn in list(self._open):
                conn.close("transport stopped")
            self._open.clear()
            self._dialed.clear()
            self._accepted.clear()

    async def request(self, address: str, data: bytes) -> Reply:
        """Send a request to ``address`` and wait for the reply.

        A request that went out on a connection the peer then ended in order (end
        of stream) before answering is sent once more, on a new connection. A
        node ends connections in order as idle or to make room, and then only
        with no request read on them unanswered, so the peer never saw it; a
        node shutting down ends them too, but then refuses the new connection.

        Raises :class:`PeerUnreachable` (cannot connect, handshake refused,
        connection closed), :class:`RemoteError` (the peer's handler raised),
        :class:`UsageError` (not serving, or ``data`` exceeds the frame limit).
        """
        self._check_size(data)
        if address == self._address:
            return await self._request_self(data)
        conn = await self._connection_to(address)
        self._counts["requests_sent"] += 1
        self._counts["bytes_sent"] += len(data)
        conn.last_used = trio.current_time()
        try:
            reply = await conn.request(data)
        except PeerUnreachable:
            if not conn.peer_closed:
                raise
            # The peer closed the connection as idle (or for room) while the
            # request was on its way: it never read it. Once more, on a new one.
            self._counts["requests_resent"] += 1
            conn = await self._connection_to(address)
            conn.last_used = trio.current_time()
            reply = await conn.request(data)
        self._counts["replies_received"] += 1
        self._counts["bytes_received"] += len(reply.data)
        return reply

    async def send(self, address: str, data: bytes) -> None:
        """Send a one-way message; failures to connect are dropped silently (logged)."""
        self._check_size(data)
        self._counts["messages_sent"] += 1
        self._counts["bytes_sent"] += len(data)
        if address == self._address:
            assert self._handler is not None
            await self._handler.handle_message(self._local_peer(), data)
            return
        try:
            conn = await self._connection_to(address)
            conn.last_used = trio.current_time()
            await conn.send(Message(data))
        except PeerUnreachable as exc:
            _log.debug("message to %s dropped: %s", address, exc)

    # -- helpers -----------------------------------------------------------------

    def _check_size(self, data: bytes) -> None:
        if self._nursery is None:
            raise UsageError("the tcp transport must be serving to send")
        if len(data) + 32 > self.max_frame_size:
            raise UsageError(f"{len(data)} bytes exceed the frame limit of {self.max_frame_size}")

    def _local_peer(self) -> Peer:
        return Peer(self.address, self._identity.public_key)

    async def _request_self(self, data: bytes) -> Reply:
        assert self._handler is not None
        try:
            answer = await self._handler.handle_request(self._local_peer(), data)
        except KettenError as exc:
            raise RemoteError(type(exc).__name__, str(exc)) from None
        return Reply(self._local_peer(), answer)

    async def _connection_to(self, address: str) -> Connection:
        """The connection to carry a frame to ``address``: the one the peer there dialed
        if that wins (see the module's docstring), else this node's own, dialed now
        if need be."""
        while True:
            shared = self._shared(address)
            if shared is not None:
                self._counts["requests_on_accepted"] += 1
                return shared
            conn = self._dialed.get(address)
            if conn is not None and not conn.closed:
                return conn
            dialing = self._dialing.get(address)
            if dialing is None:
                break
            await dialing.wait()
        conn = await self._connect(address)
        shared = self._shared(address)
        if shared is not None and not conn.busy:
            # The dial proved the address; the peer's own connection carries the rest.
            conn.close("the connection the peer dialed carries the requests")
            self._forget(conn)
            self._counts["requests_on_accepted"] += 1
            return shared
        return conn

    def _shared(self, address: str) -> Connection | None:
        """The connection the peer at ``address`` dialed, if it carries this node's
        frames there: the peer's key is smaller, this node found that key at
        ``address`` itself, the peer claims ``address``, and the connection was used
        within half the idle timeout (its dialer closes it after a whole one)."""
        key = self._proven.get(address)
        if key is None or key >= self._identity.public_key:
            return None
        conn = self._accepted.get(key)
        if (conn is None or conn.closed or conn.peer.address != address
                or trio.current_time() - conn.last_used >= self.idle_timeout / 2):
            return None
        self._proven.move_to_end(address)
        return conn

    def address_proven(self, peer: Peer) -> bool:
        """Whether this node dialed ``peer.address`` and found ``peer``'s key there
        (the last time it dialed it; up to 4,096 addresses are remembered)."""
        return self._proven.get(peer.address) == peer.public_key

    def _prove(self, address: str, key: bytes) -> None:
        self._proven[address] = key
        self._proven.move_to_end(address)
        while len(self._proven) > _MAX_PROVEN:
            self._proven.popitem(last=False)

    async def _connect(self, address: str) -> Connection:
        """Dial ``address`` (no dial to it may be under way)."""
        nursery = self._nursery
        if nursery is None:
            raise UsageError("the tcp transport must be serving to send")
        try:
            host, port = parse_address(address)
        except UsageError as exc:
            raise PeerUnreachable(str(exc)) from None
        done = self._dialing[address] = trio.Event()
        try:
            try:
                stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            except (OSError, ValueError) as exc:  # ValueError: the resolver refused the name
                raise PeerUnreachable(f"cannot connect to {address}: {exc}") from None
            try:
                peer, decoder, session = await self._handshake(stream, dialed=address)
                self._require_room(address)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            conn = Connection(stream, peer, decoder, outbound=True, session=session,
                              last_used=trio.current_time(), send_timeout=self.frame_timeout,
                              max_queued=self.max_unsent_bytes)
            self._counts["connections_dialed"] += 1
            self._open.add(conn)
            self._dialed[address] = conn
            self._prove(address, peer.public_key)
            nursery.start_soon(self._run_connection, conn)
            return conn
        finally:
            del self._dialing[address]
            done.set()

    def _require_room(self, address: str) -> None:
        if not self._make_room():
            raise PeerUnreachable(
                f"cannot connect to {address}: {self.max_connections} connections are open and busy"
            )

    def _make_room(self) -> bool:
        """Close the least recently used idle connection if the cap is reached.

        Connections still in the handshake take a slot but are never closed
        for room: the handshake timeout ends them.
        """
        if len(self._open) + self._handshaking < self.max_connections:
            return True
        idle = [c for c in self._open if not c.busy]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.last_used)
        victim.close("closed to make room for another connection")
        self._forget(victim)
        return True

    def _forget(self, conn: Connection) -> None:
        self._open.discard(conn)
        if conn.outbound:
            if self._dialed.get(conn.peer.address) is conn:
                del self._dialed[conn.peer.address]
        elif self._accepted.get(conn.peer.public_key) is conn:
            del self._accepted[conn.peer.public_key]

    async def _handshake(self, stream: trio.abc.Stream, dialed: str | None,
                         source: str = "?") -> tuple[Peer, FrameDecoder, Session | None]:
        """Run the handshake; raises :class:`PeerUnreachable` naming the reason."""
        shake = Handshake(self._identity, self.params, self.address,
                          initiator=dialed is not None, nonce=secrets.token_bytes(32))
        decoder = FrameDecoder(_HANDSHAKE_FRAME_LIMIT)
        who = dialed or f"an incoming peer from {source}"
        # Incoming peers share one key per kind of failure: the log stays rate-limited
        # whatever number of sources a flood comes from.
        topic = dialed or "incoming"
        self._handshaking += 1
        try:
            with trio.fail_after(self.handshake_timeout):
                await stream.send_all(encode_frame(shake.hello()))
                body = await self._read_body(stream, decoder)
                try:
                    auth = shake.receive_hello(parse_frame(body, max_size=len(body)), body)
                    if dialed is None:
                        _check_claimed(shake.claimed_address)
                    await stream.send_all(encode_frame(auth))
                    body = await self._read_body(stream, decoder)
                    peer = shake.receive_auth(parse_frame(body, max_size=len(body)), dialed)
                    session = shake.session()
                except HandshakeRefused as exc:
                    if not exc.by_peer:
                        await self._refuse(stream, exc.reason)
                    raise
        except HandshakeRefused as exc:
            self._counts["handshakes_failed"] += 1
            if exc.by_peer:
                self._events.warning("refused_by_peer", "%s refused us: %s", who, exc.reason,
                                     key=f"refused-by:{topic}", peer=who, reason=exc.reason)
            else:
                self._events.warning("peer_refused", "refusing %s: %s", who, exc.reason,
                                     key=f"refused:{topic}", peer=who, reason=exc.reason)
            raise PeerUnreachable(f"handshake with {who} failed: {exc}") from None
        except (DecodeError, ProtocolError) as exc:
            self._counts["handshakes_failed"] += 1
            self._events.warning("peer_refused", "malformed handshake from %s: %s", who, exc,
                                 key=f"malformed:{topic}", peer=who, reason=str(exc))
            raise PeerUnreachable(f"handshake with {who} failed: {exc}") from None
        except trio.TooSlowError:
            self._counts["handshakes_failed"] += 1
            self._counts["handshakes_timed_out"] += 1
            self._events.warning("handshake_timeout", "handshake with %s timed out after %s s",
                                 who, self.handshake_timeout, key=f"slow:{topic}", peer=who)
            raise PeerUnreachable(f"handshake with {who} timed out") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._counts["handshakes_failed"] += 1
            raise PeerUnreachable(f"{who} closed the connection during the handshake: "
                                  f"{exc}") from None
        finally:
            self._handshaking -= 1
        decoder.max_frame_size = self.max_frame_size + (TAG_SIZE if session else 0)
        return peer, decoder, session

    async def _refuse(self, stream: trio.abc.Stream, reason: str) -> None:
        with trio.move_on_after(1.0):
            try:
                await stream.send_all(encode_frame(Refuse(reason)))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def _read_body(self, stream: trio.abc.Stream, decoder: FrameDecoder) -> bytes:
        """The next frame body. Raises :class:`DecodeError` or ``BrokenResourceError`` at EOF."""
        while True:
            body = decoder.next_body()
            if body is not None:
                self._counts["bytes_received"] += HEADER_SIZE + len(body)
                return body
            data = await stream.receive_some(_READ_SIZE)
            if not data:
                raise trio.BrokenResourceError("connection closed by the peer")
            decoder.feed(data)

    async def _read_frame_body(self, conn: Connection) -> bytes:
        """The next frame body of an established connection. Raises
        ``trio.BrokenResourceError`` at EOF; :meth:`_watch` closes the connection
        (cancelling the read) when a started frame stalls or the connection falls
        idle, so no read pays for a timer of its own."""
        decoder = conn.decoder
        while True:
            body = decoder.next_body()
            if body is not None:
                self._counts["bytes_received"] += HEADER_SIZE + len(body)
                conn.last_used = trio.current_time()
                conn.frame_started = None
                return body
            if decoder.in_frame:
                if conn.frame_started is None:
                    conn.frame_started = trio.current_time()
            else:
                conn.frame_started = None
            data = await conn.stream.receive_some(_READ_SIZE)
            if not data:
                conn.peer_closed = True
                raise trio.BrokenResourceError("connection closed by the peer")
            decoder.feed(data)

    async def _watch(self) -> None:
        """Close the connections whose started frame is not complete within
        ``frame_timeout``, those whose write has not left within it, and those with
        no request outstanding and no frame for their idle limit; one timer for all
        connections."""
        tick = min(self.frame_timeout, self.idle_timeout) / 4
        try:
            while True:
                await trio.sleep(tick)
                now = trio.current_time()
                for conn in list(self._open):
                    self._check_overdue(conn, now)
        finally:
            # The transport is stopping, and nothing would end a blocked write now.
            for conn in list(self._open):
                conn.close("transport stopped")

    def _warn_closing(self, conn: Connection, reason: str) -> None:
        """A connection ends for the peer's fault (rate-limited per address)."""
        self._events.warning("connection_closed", "closing the connection with %s (%s): %s",
                             conn.peer.address, conn.peer.node_id.hex()[:16], reason,
                             key=f"closed:{conn.peer.address}", peer=conn.peer.address,
                             node=conn.peer.node_id.hex(), reason=reason)

    def _check_overdue(self, conn: Connection, now: float) -> None:
        if conn.closed:
            return
        stalled: tuple[str, str] | None = None
        if conn.frame_started is not None and now - conn.frame_started > self.frame_timeout:
            stalled = "stalled_frames", f"a frame was not complete within {self.frame_timeout} s"
        elif conn.sending_since is not None and now - conn.sending_since > conn.send_timeout:
            stalled = "stalled_sends", (f"a write took longer than {conn.send_timeout} s "
                                        "(the peer stopped reading)")
        if stalled is not None:
            counter, reason = stalled
            self._counts[counter] += 1
            self._warn_closing(conn, reason)
            conn.close(reason)
            return
        if conn.busy:
            conn.last_used = now
            return
        idle_limit = self.idle_timeout if conn.outbound else 2 * self.idle_timeout
        if now - conn.last_used >= idle_limit:
            self._counts["idle_closed"] += 1
            _log.debug("closing the idle connection with %s", conn.peer.address)
            conn.close(f"idle for {idle_limit} s")

    def _room_for_source(self, source: str) -> str | None:
        """Why a new connection from ``source`` is refused, or ``None`` (an idle
        connection from it may be closed to make room)."""
        if self._handshaking_from.get(source, 0) >= self.max_handshakes_per_source:
            return f"{self.max_handshakes_per_source} handshakes from {source} are in progress"
        mine = [c for c in self._open if c.source == source]
        if len(mine) + self._handshaking_from.get(source, 0) < self.max_per_source:
            return None
        idle = [c for c in mine if not c.busy]
        if not idle:
            return f"{self.max_per_source} connections from {source} are open and busy"
        victim = min(idle, key=lambda c: c.last_used)
        victim.close("closed to make room for another connection from its address")
        self._forget(victim)
        return None

    def _evict_handshake(self) -> None:
        """End the oldest handshake of the source with the most under way: a host that
        opens many and says nothing loses its own first, a peer with one keeps it."""
        crowded = max(self._handshaking_from, key=self._handshaking_from.__getitem__)
        oldest = next(iter(self._incoming_shakes))
        ticket = next((t for t, (source, _) in self._incoming_shakes.items()
                       if source == crowded), oldest)
        _, scope = self._incoming_shakes.pop(ticket)
        scope.cancel()
        self._counts["handshakes_evicted"] += 1

    async def _accept(self, stream: trio.SocketStream) -> None:
        self._counts["connections_accepted"] += 1
        try:
            source = source_of(stream.socket.getpeername()[0])
        except (OSError, IndexError, TypeError):
            source = "?"
        try:
            crowded = self._room_for_source(source)
            if crowded is not None:
                self._counts["connections_refused"] += 1
                self._counts["refused_per_source"] += 1
                _log.debug("refusing an incoming connection: %s", crowded)
                await self._refuse(stream, "too many connections from your address")
                return
            if not self._make_room():
                self._counts["connections_refused"] += 1
                self._events.warning("connection_refused",
                                     "refusing an incoming connection from %s: %d connections "
                                     "are open and busy, %d in the handshake", source,
                                     len(self._open), self._handshaking, peer=source,
                                     open=len(self._open), handshaking=self._handshaking)
                await self._refuse(stream, "too many connections")
                return
            self._handshaking_from[source] = self._handshaking_from.get(source, 0) + 1
            self._shakes_started += 1
            ticket = self._shakes_started
            scope = trio.CancelScope()
            self._incoming_shakes[ticket] = (source, scope)
            if len(self._incoming_shakes) > max(1, self.max_connections // 4):
                self._evict_handshake()
            try:
                with scope:
                    peer, decoder, session = await self._handshake(stream, dialed=None,
                                                                   source=source)
                if scope.cancelled_caught:
                    self._counts["connections_refused"] += 1
                    return
            except PeerUnreachable:
                self._counts["connections_refused"] += 1
                return
            finally:
                self._incoming_shakes.pop(ticket, None)
                left = self._handshaking_from.pop(source) - 1
                if left:
                    self._handshaking_from[source] = left
            conn = Connection(stream, peer, decoder, outbound=False, source=source,
                              session=session,
                              last_used=trio.current_time(), send_timeout=self.frame_timeout,
                              max_queued=self.max_unsent_bytes)
            self._open.add(conn)
            self._accepted[peer.public_key] = conn
            await self._run_connection(conn)
        finally:
            await trio.aclose_forcefully(stream)

    async def _run_connection(self, conn: Connection) -> None:
        """Read frames until the connection ends; a malformed frame ends it."""
        key = conn.peer.public_key
        limiter, users = self._peer_limits.get(key) or (
            trio.Semaphore(self.max_concurrent_requests), 0)
        self._peer_limits[key] = (limiter, users + 1)
        reason = "closed"
        try:
            with conn.cancel_scope:
                async with trio.open_nursery() as nursery:
                    reason = await self._read_frames(conn, nursery, limiter)
                    nursery.cancel_scope.cancel()
            conn.close(reason)
        finally:
            conn.close("transport stopped")
            self._forget(conn)
            limiter, users = self._peer_limits[key]
            if users > 1:
                self._peer_limits[key] = (limiter, users - 1)
            else:
                del self._peer_limits[key]
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(conn.stream)

    async def _read_frames(self, conn: Connection, nursery: trio.Nursery,
                           limiter: trio.Semaphore) -> str:
        handler = self._handler
        assert handler is not None
        try:
            while True:
                body = await self._read_frame_body(conn)
                if conn.session is not None:
                    body = conn.session.open(body)
                frame = parse_frame(body, max_size=self.max_frame_size)
                match frame:
                    case Request():
                        self._counts["requests_received"] += 1
                        # Busy from the moment the request is read: a connection
                        # is never closed as idle under a request it will not answer.
                        conn.answering += 1
                        try:
                            await self._admit(limiter, len(frame.data))
                        except BaseException:
                            conn.answering -= 1
                            raise
                        nursery.start_soon(self._answer, conn, frame, handler, limiter)
                    case ReplyFrame(req_id, data):
                        conn.settle(req_id, Reply(conn.peer, data))
                    case ErrorReply(req_id, code, message):
                        conn.settle(req_id, RemoteError(code, message))
                    case Message(data):
                        self._counts["messages_received"] += 1
                        await self._admit(limiter, len(data))
                        nursery.start_soon(self._take_message, conn.peer, data, handler, limiter)
                    case Hello() | Auth() | Refuse():
                        _unexpected(frame)
        except (DecodeError, ProtocolError) as exc:
            self._counts["malformed_frames"] += 1
            self._warn_closing(conn, str(exc))
            return f"malformed frame: {exc}"
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            return str(exc) or "closed"
        except Exception as exc:
            self._bug(f"reading from {conn.peer.address}", exc)
            return f"internal error: {type(exc).__name__}"

    async def _admit(self, limiter: trio.Semaphore, size: int) -> None:
        """Wait for a slot of the peer's share and for ``size`` bytes of the budget."""
        await limiter.acquire()
        try:
            await self._budget.acquire(size)
        except BaseException:
            limiter.release()  # shared by the peer's other connections: never leak it
            raise

    def _bug(self, what: str, exc: Exception) -> None:
        self._counts["internal_errors"] += 1
        self._events.warning("internal_error", "%s failed: %s: %s", what, type(exc).__name__,
                             exc, key=f"bug:{type(exc).__name__}", exc_info=True,
                             reason=str(exc))

    async def _answer(self, conn: Connection, request: Request, handler: Handler,
                      limiter: trio.Semaphore) -> None:
        held = len(request.data)
        try:
            frame: ReplyFrame | ErrorReply
            try:
                answer = await handler.handle_request(conn.peer, request.data)
            except KettenError as exc:
                self._counts["error_replies_sent"] += 1
                frame = ErrorReply(request.req_id, type(exc).__name__, str(exc))
            except Exception as exc:
                self._bug(f"a request from {conn.peer.address}", exc)
                self._counts["error_replies_sent"] += 1
                frame = ErrorReply(request.req_id, "InternalError",
                                   "the request failed on this node")
            else:
                frame = ReplyFrame(request.req_id, answer)
            # The request is done with: its bytes go back to every peer's budget.
            # The answer waits in this peer's connection (bounded there) while the
            # request slot stays taken, so a peer that stops reading stalls itself.
            self._budget.release(held)
            held = 0
            try:
                self._counts["bytes_sent"] += await conn.send(frame)
            except PeerUnreachable:
                pass
        finally:
            conn.answering -= 1
            conn.last_used = trio.current_time()
            if held:
                self._budget.release(held)
            limiter.release()

    async def _take_message(self, peer: Peer, data: bytes, handler: Handler,
                            limiter: trio.Semaphore) -> None:
        try:
            await handler.handle_message(peer, data)
        except KettenError:
            pass
        except Exception as exc:
            self._bug(f"a message from {peer.address}", exc)
        finally:
            self._budget.release(len(data))
            limiter.release()


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"transport": ["tcp"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("transport", "tcp"):
        return None
    seconds = (int, float)
    return PluginSpec({
        "listen": Option("'host:port' to listen on", str),
        "advertise": Option("'host:port' peers should dial", str),
        "max_connections": Option("open connections, handshakes included", int),
        "max_frame_size": Option("bytes of one frame", int),
        "handshake_timeout": Option("seconds a handshake may take", seconds),
        "frame_timeout": Option("seconds one frame may take to arrive", seconds),
        "idle_timeout": Option("seconds an unused connection stays open", seconds),
        "max_concurrent_requests": Option("requests handled at once for one peer", int),
        "max_inflight_bytes": Option("bytes of requests handled at once, all peers", int),
        "max_per_source": Option("incoming connections per source address", int),
        "max_handshakes_per_source": Option("handshakes in progress per source address", int),
        "max_unsent_bytes": Option("bytes of frames waiting to be written, per connection",
                                   int),
        "encrypt": Option("seal every frame after the handshake", bool),
    })


@hookimpl
def ketten_make_transport(name: str, options: Mapping[str, Any], node: Node) -> TcpTransport | None:
    if name != "tcp":
        return None
    known = {"listen", "advertise", "max_connections", "max_frame_size", "handshake_timeout",
             "frame_timeout", "idle_timeout", "max_concurrent_requests", "max_inflight_bytes",
             "max_per_source", "max_handshakes_per_source", "max_unsent_bytes", "encrypt"}
    unknown = set(options) - known
    if unknown:
        raise ConfigError(f"unknown tcp options: {', '.join(sorted(unknown))}")
    difficulty = node.config.options_for("overlay").get("puzzle_difficulty", 0)
    if type(difficulty) is not int or not 0 <= difficulty <= 64:
        raise ConfigError("overlay option 'puzzle_difficulty' must be an integer in [0, 64]")
    encrypt = options.get("encrypt", True)
    if type(encrypt) is not bool:
        raise ConfigError("tcp option 'encrypt' must be true or false")
    listen = options.get("listen", "127.0.0.1:0")
    advertise = options.get("advertise")
    if not isinstance(listen, str) or (advertise is not None and not isinstance(advertise, str)):
        raise ConfigError("tcp options 'listen' and 'advertise' must be 'host:port' strings")
    try:
        return TcpTransport(
            identity=node.identity,
            params=NetworkParams(PROTOCOL_VERSION, node.config.replication, difficulty,
                                 encrypt),
            listen=listen,
            advertise=advertise,
            max_connections=_option_int(options, "max_connections", 256, 1),
            max_frame_size=_option_int(options, "max_frame_size", DEFAULT_MAX_FRAME_SIZE, 1024),
            handshake_timeout=_option_seconds(options, "handshake_timeout", 10.0),
            frame_timeout=_option_seconds(options, "frame_timeout", 30.0),
            idle_timeout=_option_seconds(options, "idle_timeout", 300.0),
            max_concurrent_requests=_option_int(options, "max_concurrent_requests", 64, 1),
            max_inflight_bytes=_option_int(options, "max_inflight_bytes", 64 << 20, 1024),
            max_per_source=_option_int(options, "max_per_source", 64, 1),
            max_handshakes_per_source=_option_int(options, "max_handshakes_per_source", 8, 1),
            max_unsent_bytes=_option_int(options, "max_unsent_bytes", 1 << 20, 1024),
        )
    except UsageError as exc:
        raise ConfigError(f"tcp transport: {exc}") from None
