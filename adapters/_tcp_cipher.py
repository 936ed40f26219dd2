"""Frame encryption of the TCP transport, sans-IO: ChaCha20-Poly1305 keyed by the handshake.

Each side puts a fresh X25519 public key in its hello. Both hellos are signed
in the handshake, so a man in the middle cannot swap the keys. The shared
secret, expanded with HKDF-SHA256 over both hellos, gives one key per
direction. After the handshake every frame body is sealed with the next
nonce of its direction (a counter), so a frame that was changed, replayed,
dropped or reordered fails to open and ends its connection. Fresh ephemeral
keys per connection keep recorded traffic secret even if a node's signing
key leaks later.
"""

from __future__ import annotations

import hashlib

import attrs
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ketten.errors import DecodeError, ProtocolError

__all__ = ["KEY_SIZE", "TAG_SIZE", "Ephemeral", "Session"]

KEY_SIZE = 32
TAG_SIZE = 16
_INFO = b"ketten-tcp-frame-keys\x00"
_MAX_FRAMES = 2**64 - 1


class Ephemeral:
    """One side's X25519 key pair for one connection."""

    def __init__(self) -> None:
        self._private = X25519PrivateKey.generate()
        self.public = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def session(self, peer_public: bytes, transcript: bytes, *, initiator: bool) -> Session:
        """The connection's keys. Raises :class:`ProtocolError` for a key that gives no
        shared secret (a small-order point)."""
        try:
            shared = self._private.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError as exc:
            raise ProtocolError(f"unusable ephemeral key: {exc}") from None
        keys = HKDF(algorithm=hashes.SHA256(), length=2 * KEY_SIZE, salt=None,
                    info=_INFO + hashlib.sha256(transcript).digest()).derive(shared)
        first, second = keys[:KEY_SIZE], keys[KEY_SIZE:]
        return Session(first if initiator else second, second if initiator else first)


@attrs.define(eq=False, init=False)
class Session:
    """Seals the frames one side sends and opens the ones it receives, in order."""

    _seal: ChaCha20Poly1305
    _open: ChaCha20Poly1305
    _sent: int
    _received: int

    def __init__(self, send_key: bytes, receive_key: bytes) -> None:
        self._seal = ChaCha20Poly1305(send_key)
        self._open = ChaCha20Poly1305(receive_key)
        self._sent = 0
        self._received = 0

    def seal(self, body: bytes) -> bytes:
        if self._sent >= _MAX_FRAMES:
            raise ProtocolError("too many frames on one connection: reconnect")
        nonce = self._sent.to_bytes(12, "little")
        self._sent += 1
        return self._seal.encrypt(nonce, body, None)

    def open(self, data: bytes) -> bytes:
        """The body of the next frame. Raises :class:`DecodeError` if it does not
        authenticate (changed, replayed, reordered or from another connection)."""
        if len(data) < TAG_SIZE:
            raise DecodeError("sealed frame shorter than its tag", where="frame")
        nonce = self._received.to_bytes(12, "little")
        try:
            body = self._open.decrypt(nonce, data, None)
        except InvalidTag:
            raise DecodeError(f"frame {self._received} failed authentication (changed, "
                              "replayed or out of order)", where="frame") from None
        self._received += 1
        return body
