"""The signed event: fields, canonical encoding, signing, verification, hash."""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import sha256 as _sha256
from typing import Any

import attrs
from cbor2 import loads as _cbor_loads

from ..errors import DecodeError, InvalidSignature, UsageError
from . import codec as _codec
from .codec import MAX_UINT, head_size
from .identity import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, Identity, verify_signature

__all__ = ["DEFAULT_MAX_EVENT_SIZE", "ENCODING_VERSION", "Event", "is_verified", "mark_verified"]

ENCODING_VERSION = 1
DEFAULT_MAX_EVENT_SIZE = 1 << 20
HASH_SIZE = 32
_new = object.__new__
_FIELD_COUNT = 11
_NO_SIG = b""


def _bytes_len(b: bytes) -> int:
    return head_size(len(b)) + len(b)


def _check_uint(value: object, name: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_UINT:
        raise DecodeError(f"{name} must be an unsigned 63-bit integer, got {value!r:.40}", where="event")
    return value


def _check_bytes(value: object, name: str, size: int | None = None) -> bytes:
    if type(value) is not bytes:
        raise DecodeError(f"{name} must be a byte string, got {type(value).__name__}", where="event")
    if size is not None and len(value) != size:
        raise DecodeError(f"{name} must be {size} bytes, got {len(value)}", where="event")
    return value


def _normalise_writers(writers: Iterable[bytes] | None) -> tuple[bytes, ...] | None:
    if writers is None:
        return None
    keys = tuple(sorted(set(writers)))
    for key in keys:
        if type(key) is not bytes or len(key) != PUBLIC_KEY_SIZE:
            raise UsageError("writers must be 32-byte Ed25519 public keys")
    if not keys:
        raise UsageError("a writer policy must allow at least one author")
    return keys


# Not slotted: ``from_bytes`` fills ``__dict__`` in one step, which keeps
# decoding within a small factor of raw CBOR decoding.
@attrs.frozen(eq=False, repr=False, slots=False)
class Event:
    """One link of a chain: a signed, hash-linked record under a criterion.

    Build events with :meth:`create` (signs) or :meth:`from_bytes` (decodes and
    checks structure; signatures are checked by :meth:`verify` or the chain
    rules). Two events are equal when their hashes are.

    ``writers`` may only be set on a genesis (``seq == 0``): it restricts who
    may append to the chain.
    """

    criterion: bytes
    seq: int
    prev: bytes | None
    author: bytes
    command: int | None
    clock: bytes
    time: int
    payload: bytes
    writers: tuple[bytes, ...] | None
    sig: bytes
    _raw: bytes = attrs.field(init=False)
    _hash: bytes = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        fields = self._fields()
        _check_structure(fields)
        raw = _codec.dumps([*fields, self.sig])
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "_hash", _sha256(raw).digest())

    def _fields(self) -> list[Any]:
        writers = list(self.writers) if self.writers is not None else None
        return [
            ENCODING_VERSION,
            self.criterion,
            self.seq,
            self.prev,
            self.author,
            self.command,
            self.clock,
            self.time,
            self.payload,
            writers,
        ]

    # -- construction ------------------------------------------------------

    @classmethod
    def create(
        cls,
        identity: Identity,
        *,
        criterion: bytes,
        seq: int,
        prev: bytes | None,
        payload: bytes,
        time: int,
        command: int | None = None,
        clock: bytes = b"",
        writers: Iterable[bytes] | None = None,
    ) -> Event:
        """A new event signed by ``identity``.

        Raises :class:`~ketten.errors.UsageError` if a field has the wrong type
        or size (for example ``prev`` given for a genesis, or omitted otherwise).
        """
        try:
            policy = _normalise_writers(writers)
            fields: list[Any] = [
                ENCODING_VERSION, criterion, seq, prev, identity.public_key,
                command, clock, time, payload,
                list(policy) if policy is not None else None,
            ]
            _check_structure(fields)
        except DecodeError as exc:
            raise UsageError(str(exc)) from None
        signed = _codec.dumps(fields)
        sig = identity.sign(signed)
        # The full encoding is the signed one under an 11-element head, plus the
        # signature item (see signed_part): no second encoding pass.
        raw = b"\x8b" + signed[1:] + b"\x58\x40" + sig
        return _assemble(cls, fields, sig, raw, _sha256(raw).digest())

    @classmethod
    def from_bytes(cls, data: bytes, *, max_size: int = DEFAULT_MAX_EVENT_SIZE) -> Event:
        """Decode an event from untrusted bytes.

        Checks structure only (types, sizes, canonical encoding, no trailing
        bytes); the signature is not verified here. Raises
        :class:`~ketten.errors.DecodeError` for any malformed input and never
        any other exception.
        """
        if type(data) is not bytes:
            if not isinstance(data, bytearray | memoryview):
                raise DecodeError(f"expected bytes, got {type(data).__name__}", where="event")
            data = bytes(data)
        if len(data) > max_size:
            raise DecodeError(f"{len(data)} bytes exceeds the limit of {max_size}", where="event")
        fields, digest = decode_fields(data)
        return _assemble(cls, fields, fields[10], data, digest)

    # -- derived values ----------------------------------------------------

    @property
    def hash(self) -> bytes:
        """``SHA-256`` of the canonical encoding of the signed event."""
        return self._hash

    @property
    def is_genesis(self) -> bool:
        return self.seq == 0

    def to_bytes(self) -> bytes:
        """The canonical CBOR encoding (what is hashed, stored and sent)."""
        return self._raw

    def signed_bytes(self) -> bytes:
        """The bytes the signature covers: the encoding of every field but ``sig``."""
        return signed_part(self._raw)

    def verify(self) -> None:
        """Check the signature. Raises :class:`~ketten.errors.InvalidSignature`.

        An event is immutable, so a signature that verified once is not checked
        again on the same object.
        """
        if self.__dict__.get("_verified"):
            return
        if not verify_signature(self.author, self.sig, self.signed_bytes()):
            raise InvalidSignature(
                f"event seq {self.seq} of {self.criterion.hex()[:16]}: signature does not verify"
            )
        self.__dict__["_verified"] = True

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return self._hash == other._hash

    def __hash__(self) -> int:
        return hash(self._hash)

    def __repr__(self) -> str:
        return (
            f"Event(criterion={self.criterion.hex()[:12]}, seq={self.seq}, "
            f"hash={self._hash.hex()[:12]}, author={self.author.hex()[:12]}, "
            f"payload={len(self.payload)}B)"
        )


def is_verified(event: Event) -> bool:
    """Did ``event``'s signature verify (on this object, or :func:`mark_verified`)?"""
    return bool(event.__dict__.get("_verified"))


def mark_verified(event: Event) -> None:
    """Take ``event``'s signature as verified: only for a caller that saw an event of
    the same hash (which covers the signature) verify."""
    event.__dict__["_verified"] = True


def _assemble(cls: type[Event], fields: list[Any], sig: bytes, raw: bytes,
              digest: bytes) -> Event:
    """An event from checked fields (``[version, criterion, ..., writers]``) and its
    encoding, without encoding or checking again."""
    writers = fields[9]
    event: Event = _new(cls)
    object.__setattr__(event, "__dict__", {
        "criterion": fields[1],
        "seq": fields[2],
        "prev": fields[3],
        "author": fields[4],
        "command": fields[5],
        "clock": fields[6],
        "time": fields[7],
        "payload": fields[8],
        "writers": tuple(writers) if writers is not None else None,
        "sig": sig,
        "_raw": raw,
        "_hash": digest,
    })
    return event


def signed_part(encoded: bytes) -> bytes:
    """The signed bytes of a canonical event encoding.

    They are the encoding of the first ten fields: the same bytes without the
    66-byte signature item, under a 10-element instead of an 11-element head.
    """
    return b"\x8a" + encoded[1:-66]


def decode_fields(data: bytes) -> tuple[list[Any], bytes]:
    """Decode and structure-check an event encoding; return its fields and hash.

    The fields are ``[version, criterion, seq, prev, author, command, clock,
    time, payload, writers, sig]``. Callers check the size limit first.
    This is the shared fast path of :meth:`Event.from_bytes` and of chain
    scans that need no :class:`Event` objects.
    """
    try:
        fields = _cbor_loads(data)
    except Exception as exc:  # cbor2 raises many unrelated types on garbage
        raise DecodeError(f"malformed CBOR ({type(exc).__name__}: {exc})", where="event") from None
    if type(fields) is not list or len(fields) != _FIELD_COUNT:
        raise DecodeError(f"expected an array of {_FIELD_COUNT} fields", where="event")
    sig = fields[10]
    if type(sig) is not bytes or len(sig) != SIGNATURE_SIZE:
        _check_bytes(sig, "sig", SIGNATURE_SIZE)
    # Every other encoding of the same values is longer, so an exact length
    # proves the input canonical and free of trailing bytes.
    if _encoded_size(fields) != len(data):
        raise DecodeError("not a canonical encoding, or trailing bytes", where="event")
    return fields, _sha256(data).digest()


def _encoded_size(fields: list[Any]) -> int:
    """The canonical encoded size of a decoded event (signature included).

    The common case is checked in one expression; anything unusual goes
    through :func:`_check_structure`, which names the offending field.
    """
    version, criterion, seq, prev, author, command, clock, time, payload, writers, _ = fields
    # Literal constants on purpose: this runs once per event on every scan.
    if (
        version == 1
        and type(seq) is int
        and 0 < seq <= 0x7FFFFFFFFFFFFFFF
        and type(time) is int
        and 0 <= time <= 0x7FFFFFFFFFFFFFFF
        and type(criterion) is bytes
        and len(criterion) == 32
        and type(prev) is bytes
        and len(prev) == 32
        and type(author) is bytes
        and len(author) == 32
        and type(clock) is bytes
        and type(payload) is bytes
        and writers is None
        and (command is None or (type(command) is int and 0 <= command <= 0x7FFFFFFFFFFFFFFF))
    ):
        n_clock = len(clock)
        n_payload = len(payload)
        return (
            # array head, version, criterion, prev, author, writers, sig
            171
            + (1 if seq < 24 else 2 if seq < 0x100 else 3 if seq < 0x10000 else head_size(seq))
            + (1 if command is None or command < 24 else head_size(command))
            + (1 if n_clock < 24 else head_size(n_clock)) + n_clock
            + (9 if time >= 0x100000000 else head_size(time))
            + (1 if n_payload < 24 else 2 if n_payload < 0x100 else head_size(n_payload))
            + n_payload
        )
    return _check_structure(fields[:10]) + head_size(SIGNATURE_SIZE) + SIGNATURE_SIZE


def _check_structure(fields: list[Any]) -> int:
    """Type-check the unsigned fields; return their canonical encoded size."""
    version, criterion, seq, prev, author, command, clock, time, payload, writers = fields
    if version != ENCODING_VERSION or type(version) is not int:
        raise DecodeError(f"unknown encoding version {version!r:.20}", where="event")
    size = 1 + 1  # array head (11 < 24) + version
    size += _bytes_len(_check_bytes(criterion, "criterion", HASH_SIZE))
    size += head_size(_check_uint(seq, "seq"))
    if seq == 0:
        if prev is not None:
            raise DecodeError("a genesis (seq 0) must not have prev", where="event")
        size += 1
    else:
        size += _bytes_len(_check_bytes(prev, "prev", HASH_SIZE))
    size += _bytes_len(_check_bytes(author, "author", PUBLIC_KEY_SIZE))
    size += 1 if command is None else head_size(_check_uint(command, "command"))
    size += _bytes_len(_check_bytes(clock, "clock"))
    size += head_size(_check_uint(time, "time"))
    size += _bytes_len(_check_bytes(payload, "payload"))
    if writers is None:
        size += 1
    else:
        if seq != 0:
            raise DecodeError("only a genesis may declare writers", where="event")
        if type(writers) is not list or not writers:
            raise DecodeError("writers must be a non-empty array", where="event")
        size += head_size(len(writers))
        last = b""
        for key in writers:
            _check_bytes(key, "writer key", PUBLIC_KEY_SIZE)
            if key <= last:
                raise DecodeError("writers must be sorted and unique", where="event")
            last = key
            size += 2 + PUBLIC_KEY_SIZE
    return size
