"""One authenticated TCP connection: framed sends, pending requests, a reader."""

from __future__ import annotations

import attrs
import trio

from ketten.errors import PeerUnreachable, RemoteError
from ketten.interfaces import Peer, Reply

from ._framing import Frame as WireFrame
from ._framing import FrameDecoder, Request, frame_body, framed
from ._reply import ReplySlot
from ._tcp_cipher import Session

__all__ = ["Connection"]


@attrs.define(eq=False)
class Connection:
    """Frames to and from one peer. Requests may flow both ways on it."""

    stream: trio.abc.Stream
    peer: Peer
    decoder: FrameDecoder
    outbound: bool
    session: Session | None = None
    """Frame encryption (``None``: frames travel in clear)."""
    source: str = ""
    """The IP address a connection the peer dialed comes from."""
    last_used: float = 0.0
    frame_started: float | None = None
    """When the frame being read began to arrive (``None``: between frames)."""
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    closed: bool = False
    finished: trio.Event = attrs.field(factory=trio.Event)
    answering: int = 0
    """Requests of the peer this node has read and not yet answered."""
    peer_closed: bool = False
    """The peer ended the connection in order (end of stream). A node closing a
    connection as idle or for room has no request of the other side read on it
    and unanswered, so a request that got no answer before this was never read
    there (see ``TcpTransport.request``)."""
    send_timeout: float = 30.0
    """How long one write may take; a peer that stops reading is cut off (the
    transport's watcher checks :attr:`sending_since`, so no write sets a timer)."""
    sending_since: float | None = None
    """When the write under way began (``None``: none is)."""
    close_reason: str = ""
    _write_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    max_queued: int = 1 << 20
    """Bytes of frames waiting behind a write under way beyond which a sender waits
    its turn: a peer that stops reading holds up its own answers (and, through the
    request slots they keep, its own requests); what waits in memory for it stays
    within this bound (and the write under way) per connection."""
    _outbox: list[bytes] = attrs.field(factory=list, init=False)
    _queued: int = attrs.field(default=0, init=False)
    _room: trio.Event = attrs.field(factory=trio.Event, init=False)
    """Set when the frames queued were taken for writing, or the connection closed."""
    _flushing: bool = attrs.field(default=False, init=False)
    _pending: dict[int, ReplySlot] = attrs.field(factory=dict, init=False)
    _next_id: int = attrs.field(default=0, init=False)

    @property
    def busy(self) -> bool:
        """Whether a request is outstanding on it, in either direction."""
        return bool(self._pending) or self.answering > 0

    async def send(self, frame: WireFrame) -> int:
        """Write one frame; returns its size. Raises :class:`PeerUnreachable` if closed.

        Frames queued while another sender is writing go out with its next
        write, one system call for many frames; once :attr:`max_queued` bytes
        wait, a sender waits for room. A frame that cannot be written
        closes the connection, which fails every request still waiting on it.
        """
        while self._flushing and self._queued >= self.max_queued and not self.closed:
            await self._room.wait()
        if self.closed:
            raise PeerUnreachable(f"connection to {self.peer.address} is closed")
        body = frame_body(frame)
        if self.session is not None:
            body = self.session.seal(body)  # sealed in the order the frames are queued
        data = framed(body)
        self._outbox.append(data)
        self._queued += len(data)
        if self._flushing:
            await trio.lowlevel.checkpoint()
            return len(data)
        self._flushing = True
        try:
            # Frames are written whole or the connection is closed: a write
            # cut short by the caller's cancellation would leave half a frame
            # on a connection that other requests share.
            while self._outbox and not self.closed:
                chunk = b"".join(self._outbox)
                self._outbox.clear()
                self._queued = 0
                self._make_room()
                self.sending_since = trio.current_time()
                # Only closing the connection ends the write (see ``close``).
                with trio.CancelScope(shield=True) as self._write_scope:
                    try:
                        await self.stream.send_all(chunk)
                    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                        self.close(f"send failed: {exc}")
                        raise PeerUnreachable(
                            f"connection to {self.peer.address} broke") from None
                if self._write_scope.cancelled_caught:
                    raise PeerUnreachable(
                        f"connection to {self.peer.address} closed: {self.close_reason}")
        finally:
            self._flushing = False
            self.sending_since = self._write_scope = None
            self._make_room()
        if self.closed:
            raise PeerUnreachable(f"connection to {self.peer.address} is closed")
        await trio.lowlevel.checkpoint_if_cancelled()
        return len(data)

    async def request(self, data: bytes) -> Reply:
        """Send a request and wait for its answer (no timeout: cancel to give up)."""
        self._next_id += 1
        req_id = self._next_id
        slot = ReplySlot()
        self._pending[req_id] = slot
        try:
            await self.send(Request(req_id, data))
            return await slot.result()
        finally:
            self._pending.pop(req_id, None)

    def settle(self, req_id: int, outcome: Reply | RemoteError) -> bool:
        slot = self._pending.get(req_id)
        if slot is None:
            return False
        slot.settle(outcome)
        return True

    def _make_room(self) -> None:
        self._room.set()
        self._room = trio.Event()

    def close(self, reason: str) -> None:
        """Stop the reader and fail every waiting request."""
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        self.finished.set()
        self._room.set()
        self.cancel_scope.cancel()
        if self._write_scope is not None:
            self._write_scope.cancel()  # half a frame may be out: nothing more goes
        for slot in self._pending.values():
            slot.settle(PeerUnreachable(f"connection to {self.peer.address} closed: {reason}"))
