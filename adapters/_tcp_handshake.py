"""The TCP transport's handshake, sans-IO.

Both sides send a :class:`~._framing.Hello` at once: protocol version,
public key, the node id it claims, a fresh 32-byte nonce, the replication
factor ``r``, the id-puzzle difficulty and the address it listens at. Each
checks the other's hello (same version, ``r`` and difficulty; the id is the
SHA-256 of the key; the puzzle is solved) and answers with an
:class:`~._framing.Auth`: an Ed25519 signature over a role label and both
hellos (initiator's first). The nonces make every transcript fresh, so a
recorded handshake cannot be replayed; signing both hellos binds the
parameters each side saw, and the ephemeral keys of frame encryption
(:mod:`._tcp_cipher`): both sides must agree on ``encrypt``.
"""

from __future__ import annotations

import hashlib

import attrs

from ketten import Identity, puzzle_ok, verify_signature
from ketten.errors import ProtocolError
from ketten.interfaces import Peer

from ._framing import Auth, Frame, Hello, Refuse, encode_body
from ._tcp_cipher import Ephemeral, Session

__all__ = ["PROTOCOL_VERSION", "Handshake", "HandshakeRefused", "NetworkParams"]

PROTOCOL_VERSION = 2
_LABEL = b"ketten-tcp-auth\x00"


@attrs.frozen
class NetworkParams:
    """What every node of one network must agree on."""

    version: int = PROTOCOL_VERSION
    replication: int = 3
    difficulty: int = 0
    encrypt: bool = True


class HandshakeRefused(ProtocolError):
    """The handshake failed. ``by_peer`` tells whether the peer refused us."""

    def __init__(self, reason: str, *, by_peer: bool = False) -> None:
        self.reason = reason
        self.by_peer = by_peer
        super().__init__(f"peer refused the connection: {reason}" if by_peer else reason)


@attrs.define(eq=False)
class Handshake:
    """One side of a handshake. Feed it the peer's frames in order."""

    identity: Identity
    params: NetworkParams
    address: str
    initiator: bool
    nonce: bytes
    _ephemeral: Ephemeral | None = attrs.field(init=False)
    _own_body: bytes = attrs.field(init=False)
    _peer_body: bytes | None = attrs.field(default=None, init=False)
    _peer_hello: Hello | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._ephemeral = Ephemeral() if self.params.encrypt else None
        self._own_body = encode_body(self.hello())

    def hello(self) -> Hello:
        return Hello(
            version=self.params.version,
            public_key=self.identity.public_key,
            node_id=self.identity.node_id,
            nonce=self.nonce,
            replication=self.params.replication,
            difficulty=self.params.difficulty,
            address=self.address,
            ephemeral=b"" if self._ephemeral is None else self._ephemeral.public,
        )

    def receive_hello(self, frame: Frame, body: bytes) -> Auth:
        """Check the peer's hello; return our proof. Raises :class:`HandshakeRefused`."""
        if isinstance(frame, Refuse):
            raise HandshakeRefused(frame.reason, by_peer=True)
        if not isinstance(frame, Hello):
            raise HandshakeRefused(f"expected a hello, got {type(frame).__name__}")
        mine = self.params
        if frame.version != mine.version:
            raise HandshakeRefused(
                f"protocol version {frame.version} differs from ours ({mine.version})"
            )
        if frame.replication != mine.replication:
            raise HandshakeRefused(
                f"replication factor r={frame.replication} differs from ours (r={mine.replication})"
            )
        if frame.difficulty != mine.difficulty:
            raise HandshakeRefused(
                f"puzzle difficulty {frame.difficulty} differs from ours ({mine.difficulty})"
            )
        if bool(frame.ephemeral) != mine.encrypt:
            raise HandshakeRefused(
                "frame encryption is on here and off at the peer" if mine.encrypt
                else "frame encryption is off here and on at the peer")
        if len(frame.public_key) != 32 or len(frame.nonce) != 32:
            raise HandshakeRefused("public key and nonce must be 32 bytes")
        if frame.node_id != hashlib.sha256(frame.public_key).digest():
            raise HandshakeRefused(
                f"claimed node id {frame.node_id.hex()[:16]}... is not the hash of its key"
            )
        if frame.public_key == self.identity.public_key:
            raise HandshakeRefused("the peer uses our own key")
        if not puzzle_ok(frame.node_id, mine.difficulty):
            raise HandshakeRefused(f"node id does not solve the puzzle of difficulty "
                                   f"{mine.difficulty}")
        self._peer_hello = frame
        self._peer_body = body
        return Auth(self.identity.sign(self._transcript(self.initiator)))

    @property
    def claimed_address(self) -> str | None:
        """The address the peer's hello names as where it listens (unproven)."""
        return None if self._peer_hello is None else self._peer_hello.address

    def receive_auth(self, frame: Frame, dialed: str | None) -> Peer:
        """Check the peer's proof; return the authenticated peer.

        ``dialed`` is the address we connected to (initiator), else the peer's
        hello names where it listens. Raises :class:`HandshakeRefused`.
        """
        if isinstance(frame, Refuse):
            raise HandshakeRefused(frame.reason, by_peer=True)
        hello = self._peer_hello
        if hello is None:
            raise HandshakeRefused("auth before hello")
        if not isinstance(frame, Auth):
            raise HandshakeRefused(f"expected an auth, got {type(frame).__name__}")
        if not verify_signature(hello.public_key, frame.signature,
                                self._transcript(not self.initiator)):
            raise HandshakeRefused("the peer did not prove it owns its key (bad signature)")
        return Peer(dialed if dialed is not None else hello.address, hello.public_key)

    def session(self) -> Session | None:
        """The connection's frame keys once the peer's auth checked out (``None``:
        frames travel in clear). Raises :class:`HandshakeRefused` for an unusable key."""
        hello = self._peer_hello
        assert hello is not None and self._peer_body is not None
        if self._ephemeral is None:
            return None
        first, second = ((self._own_body, self._peer_body) if self.initiator
                         else (self._peer_body, self._own_body))
        try:
            return self._ephemeral.session(hello.ephemeral, first + second,
                                           initiator=self.initiator)
        except ProtocolError as exc:
            raise HandshakeRefused(str(exc)) from None

    def _transcript(self, initiator: bool) -> bytes:
        assert self._peer_body is not None
        first, second = ((self._own_body, self._peer_body) if self.initiator
                         else (self._peer_body, self._own_body))
        role = b"I" if initiator else b"R"
        return _LABEL + role + len(first).to_bytes(4, "big") + first + second
