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
    """How long one frame may take to leave; a peer that stops reading is cut off."""
    _outbox: list[bytes] = attrs.field(factory=list, init=False)
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
        write, one system call for many frames. A frame that cannot be written
        closes the connection, which fails every request still waiting on it.
        """
        if self.closed:
            raise PeerUnreachable(f"connection to {self.peer.address} is closed")
        body = frame_body(frame)
        if self.session is not None:
            body = self.session.seal(body)  # sealed in the order the frames are queued
        data = framed(body)
        self._outbox.append(data)
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
                deadline = trio.current_time() + self.send_timeout
                with trio.CancelScope(shield=True, deadline=deadline) as scope:
                    try:
                        await self.stream.send_all(chunk)
                    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                        self.close(f"send failed: {exc}")
                        raise PeerUnreachable(
                            f"connection to {self.peer.address} broke") from None
                if scope.cancelled_caught:
                    self.close(f"a frame took longer than {self.send_timeout} s to send")
                    raise PeerUnreachable(f"connection to {self.peer.address} stalled")
        finally:
            self._flushing = False
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

    def close(self, reason: str) -> None:
        """Stop the reader and fail every waiting request."""
        if self.closed:
            return
        self.closed = True
        self.finished.set()
        self.cancel_scope.cancel()
        for slot in self._pending.values():
            slot.settle(PeerUnreachable(f"connection to {self.peer.address} closed: {reason}"))
