"""Ed25519 identities, self-certifying node ids and criterion keys."""

from __future__ import annotations

import hashlib
import os
import random
import stat
from pathlib import Path

import attrs
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nacl.bindings import crypto_sign_open
from nacl.exceptions import CryptoError

from ..errors import ConfigError, DecodeError, UsageError

__all__ = [
    "Identity",
    "criterion_key",
    "leading_zero_bits",
    "node_id_of",
    "puzzle_ok",
    "solve_puzzle",
    "verify_signature",
]

PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64
KEY_FILE_MAGIC = b"ketten-ed25519-v1\n"


def node_id_of(public_key: bytes) -> bytes:
    """The 256-bit node id of a raw Ed25519 public key: ``SHA-256(public_key)``."""
    return hashlib.sha256(public_key).digest()


def criterion_key(name: str | bytes) -> bytes:
    """The 32-byte key of a criterion: ``SHA-256(name)`` (UTF-8 for text).

    Only keys travel and are stored; names stay with the applications.
    Raises :class:`~ketten.errors.UsageError` for an empty name and for text
    that has no UTF-8 form (a lone surrogate).
    """
    if isinstance(name, str):
        try:
            data = name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise UsageError(f"criterion name {name!r} is not valid text: {exc.reason} at "
                             f"position {exc.start}") from None
    elif isinstance(name, bytes | bytearray | memoryview):
        data = bytes(name)
    else:
        raise UsageError(f"criterion name must be str or bytes, not {type(name).__name__}")
    if not data:
        raise UsageError("criterion name must not be empty")
    return hashlib.sha256(data).digest()


def verify_signature(public_key: bytes, signature: bytes, data: bytes) -> bool:
    """True if ``signature`` is a valid Ed25519 signature of ``data`` by ``public_key``.

    Verified by libsodium, which is faster than OpenSSL at it and stricter:
    it also refuses public keys and signature points of small order, so a
    signature cannot be valid for more than one message by construction.
    """
    if len(public_key) != PUBLIC_KEY_SIZE or len(signature) != SIGNATURE_SIZE:
        return False
    try:
        crypto_sign_open(signature + data, public_key)
    except (CryptoError, ValueError, TypeError):
        return False
    return True


@attrs.frozen(eq=False, repr=False)
class Identity:
    """An Ed25519 key pair. ``node_id`` is ``SHA-256(public_key)``.

    Build one with :meth:`generate`, :meth:`from_seed` or :meth:`load`.
    """

    _private: Ed25519PrivateKey = attrs.field(alias="private")
    public_key: bytes
    node_id: bytes

    @classmethod
    def generate(cls) -> Identity:
        """A fresh random identity."""
        return cls._from_private(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """The identity whose private key is the 32-byte ``seed`` (deterministic tests).

        Raises :class:`~ketten.errors.UsageError` if ``seed`` is not 32 bytes.
        """
        if not isinstance(seed, bytes) or len(seed) != 32:
            raise UsageError("an identity seed must be exactly 32 bytes")
        return cls._from_private(Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def _from_private(cls, private: Ed25519PrivateKey) -> Identity:
        public = private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return cls(private=private, public_key=public, node_id=node_id_of(public))

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data``."""
        return self._private.sign(data)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the private key to a new file that only the owner can read (mode 0600).

        The file is written atomically (temporary file, fsync, rename).
        Raises :class:`~ketten.errors.UsageError` if ``path`` already exists.
        """
        target = Path(path)
        if target.exists():
            raise UsageError(f"{target}: refusing to overwrite an existing key file")
        seed = self._private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, KEY_FILE_MAGIC + seed.hex().encode("ascii") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        """Read a key file written by :meth:`save`.

        Raises :class:`~ketten.errors.ConfigError` if the file is missing or
        readable by group or others, :class:`~ketten.errors.DecodeError` if it
        is not a ketten key file.
        """
        source = Path(path)
        try:
            mode = source.stat().st_mode
        except FileNotFoundError:
            raise ConfigError(f"{source}: key file does not exist") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"{source}: key file is accessible by group or others "
                f"(mode {stat.S_IMODE(mode):04o}); run chmod 600 on it"
            )
        data = source.read_bytes()
        if not data.startswith(KEY_FILE_MAGIC):
            raise DecodeError("not a ketten key file", where=str(source))
        text = data[len(KEY_FILE_MAGIC) :].strip()
        try:
            seed = bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise DecodeError("key is not hexadecimal", where=str(source)) from None
        if len(seed) != 32:
            raise DecodeError(f"key has {len(seed)} bytes, expected 32", where=str(source))
        return cls.from_seed(seed)

    def __repr__(self) -> str:
        return f"Identity(node_id={self.node_id.hex()[:16]}...)"


def leading_zero_bits(data: bytes) -> int:
    """How many of the leading bits of ``data`` are zero (all of them for zero bytes)."""
    value = int.from_bytes(data, "big")
    return len(data) * 8 - value.bit_length()


def puzzle_ok(node_id: bytes, difficulty: int) -> bool:
    """S/Kademlia static puzzle: ``H(node_id) = H(H(pubkey))`` has ``difficulty`` leading zeros."""
    if difficulty <= 0:
        return True
    return leading_zero_bits(hashlib.sha256(node_id).digest()) >= difficulty


def solve_puzzle(difficulty: int, rng: random.Random | None = None) -> Identity:
    """Generate identities until one solves the puzzle (about ``2**difficulty`` tries).

    With ``rng`` the search is deterministic (identities come from its seeds).
    """
    while True:
        identity = Identity.generate() if rng is None else Identity.from_seed(rng.randbytes(32))
        if puzzle_ok(identity.node_id, difficulty):
            return identity
