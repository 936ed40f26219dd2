"""Every error ketten raises, grouped by whose fault it is.

========================  ==============================================
base class                meaning
========================  ==============================================
:class:`InternalError`    a bug in ketten or in a plugin
:class:`UsageError`       bad input or configuration from the application
:class:`DecodeError`      malformed bytes (from a peer, a file or a caller)
:class:`InvalidEvent`     a well-formed event that breaks a chain rule
:class:`ProtocolError`    a peer broke the wire protocol
:class:`Unavailable`      not enough of the network could be reached
:class:`StoreError`       the local store refused or is damaged
========================  ==============================================

All of them derive from :class:`KettenError`, so ``except ketten.KettenError``
catches everything ketten raises on purpose.
"""

from __future__ import annotations

__all__ = [
    "BrokenLink",
    "CommandIdReused",
    "ConfigError",
    "DecodeError",
    "DependencyUnavailable",
    "EventsDropped",
    "HoldbackFull",
    "InternalError",
    "InvalidEvent",
    "InvalidSignature",
    "KettenError",
    "NodeClosed",
    "PeerUnreachable",
    "PluginNotFound",
    "ProtocolError",
    "PublishOutcomeUnknown",
    "QuorumUnavailable",
    "QuotaExceeded",
    "RemoteError",
    "StoreConflict",
    "StoreCorrupted",
    "StoreError",
    "StoreFormatError",
    "Unavailable",
    "UsageError",
    "WriterNotAllowed",
]


class KettenError(Exception):
    """Base class of every error ketten raises on purpose."""


class InternalError(KettenError):
    """A bug in ketten or in a plugin: an invariant did not hold. Please report it."""


class UsageError(KettenError, ValueError):
    """The application passed something ketten cannot accept."""


class NodeClosed(UsageError):
    """The node (or the subscription) was closed: the call was not made, or was cut
    short when it closed (a publish cut short may still commit: see
    :class:`PublishOutcomeUnknown`)."""


class ConfigError(UsageError):
    """A node configuration value is missing, of the wrong type or out of range."""


class PluginNotFound(ConfigError):
    """A plugin was selected by a name that no installed plugin provides.

    ``kind`` is the interface (``"store"``, ``"transport"``, ...), ``name`` the
    requested name and ``installed`` the names that are available; ``broken``
    the installed plugins that failed to load (name -> what went wrong), one
    of which may have been the one meant.
    """

    def __init__(self, kind: str, name: str, installed: list[str],
                 broken: dict[str, str] | None = None) -> None:
        self.kind = kind
        self.name = name
        self.installed = sorted(installed)
        self.broken = dict(broken or {})
        listed = ", ".join(self.installed) if self.installed else "(none)"
        skipped = "".join(f"; plugin {n!r} failed to load: {why}"
                          for n, why in sorted(self.broken.items()))
        super().__init__(f"no {kind} plugin named {name!r} is installed; installed: {listed}"
                         f"{skipped}")


class CommandIdReused(UsageError):
    """A command id ``(author, counter)`` was sent again with different content."""


class QuotaExceeded(UsageError):
    """A broker refused because the caller is over one of its quotas (how many
    chains one author may start, or bytes of events it may send, per interval);
    the message names the quota and how long to wait.
    Nothing was stored: try again later, or ask the operators for a higher limit."""


class DecodeError(KettenError, ValueError):
    """Bytes that should hold a ketten value are malformed.

    Raised for *any* malformed input: wrong types, missing or extra fields,
    wrong lengths, non-canonical encodings, oversized input, trailing bytes.
    ``where`` names the value that was being decoded.
    """

    def __init__(self, message: str, *, where: str = "") -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class InvalidEvent(KettenError):
    """A well-formed event that may not be appended where it was offered.

    ``reason`` is a short machine-readable code, the message says more.
    """

    reason = "invalid"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        if reason is not None:
            self.reason = reason
        super().__init__(message)


class BrokenLink(InvalidEvent):
    """The event does not follow its predecessor (wrong ``prev``, ``seq`` or criterion)."""

    reason = "broken-link"


class InvalidSignature(InvalidEvent):
    """The event's signature does not verify against its author key."""

    reason = "bad-signature"


class WriterNotAllowed(InvalidEvent):
    """The chain's genesis restricts writers and the event's author is not one of them."""

    reason = "writer-not-allowed"


class ProtocolError(KettenError):
    """A peer sent something the protocol does not allow (after it decoded)."""


class RemoteError(KettenError):
    """A peer answered a request with an error.

    ``code`` is the peer's machine-readable error code, the message is its text.
    """

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"peer answered {code}: {message}")


class Unavailable(KettenError):
    """Not enough of the network could be reached to do what was asked."""


class HoldbackFull(Unavailable):
    """A subscriber's holdback queue is at its bound and the offered event would wait in it.

    The event was not taken and the queue is unchanged. Events are durable in
    their chains, so the subscriber can offer it again after the missing
    events (usually a gap being synced) have arrived. ``criterion`` and
    ``seq`` name the refused event, ``limit`` is the bound.
    """

    def __init__(self, criterion: bytes, seq: int, limit: int) -> None:
        self.criterion = criterion
        self.seq = seq
        self.limit = limit
        super().__init__(
            f"holdback queue full ({limit} events): refused seq {seq} of criterion "
            f"{criterion.hex()[:16]}"
        )


class DependencyUnavailable(Unavailable):
    """A causal subscription holds events back for an event it could not get.

    Nothing was delivered for ``patience`` seconds while ``held`` events
    waited, the earliest for seq ``seq`` of criterion ``criterion`` (it
    happened before them, or precedes them in its chain), which the
    subscription could not fetch from that chain's brokers. Nothing is
    delivered out of order: iterating again keeps waiting, and the held
    events follow as soon as the missing one arrives.
    """

    def __init__(self, criterion: bytes, seq: int, held: int, patience: float) -> None:
        self.criterion = criterion
        self.seq = seq
        self.held = held
        self.patience = patience
        super().__init__(
            f"{held} events held back for more than {patience:g} s, waiting for seq {seq} of "
            f"criterion {criterion.hex()[:16]}, which its brokers did not provide"
        )


class EventsDropped(KettenError):
    """A push subscription with ``overflow="drop"`` skipped events the application was too slow for.

    Seqs ``first`` to ``last`` (inclusive) of criterion ``criterion`` were
    committed but never handed to the application: more events were waiting
    for it than the subscription's ``buffer`` allows, and the oldest gave way.
    The notice comes in stream order, after the events before the gap and
    before those after it; iterating again goes on with the latter.
    ``await node.read(criterion, since=first)`` returns the skipped events
    (and the rest of the chain) to repair the gap.
    """

    def __init__(self, criterion: bytes, first: int, last: int) -> None:
        self.criterion = criterion
        self.first = first
        self.last = last
        super().__init__(
            f"subscriber too slow: seqs {first}..{last} of criterion {criterion.hex()[:16]} were "
            f"dropped (overflow='drop'); node.read(criterion, since={first}) returns them"
        )

    @property
    def count(self) -> int:
        """How many events were skipped."""
        return self.last - self.first + 1


class PeerUnreachable(Unavailable):
    """A peer could not be reached (no listener, connection refused, closed)."""


class QuorumUnavailable(Unavailable):
    """Not enough brokers of a criterion answered in time.

    For a publish: no broker stored the event of this call, so it can never
    be applied; publishing again is safe. (An earlier call with the same
    command id, say from a process that was killed, may have been applied:
    publishing again with that id returns its event.)
    """


class PublishOutcomeUnknown(Unavailable):
    """A publish gave up while some broker may hold its event.

    The event may still be committed later, or may never be. Settle it by
    publishing again with the same command id (it is applied at most once),
    or by waiting for one of ``event_hashes`` to appear in the chain.
    """

    def __init__(self, message: str, *, event_hashes: tuple[bytes, ...] = ()) -> None:
        self.event_hashes = event_hashes
        super().__init__(message)


class StoreError(KettenError):
    """The local store could not do what was asked."""


class StoreConflict(StoreError):
    """An append does not extend the stored chain head (the position is taken)."""


class StoreCorrupted(StoreError):
    """Stored data failed its integrity check.

    ``path`` and ``offset`` say where the damage is, ``criterion`` and ``seq``
    which chain position it hit, when the store knows; a node can quarantine
    that chain from ``seq`` on and refill it from peers.
    """

    def __init__(
        self, message: str, *, path: str = "", offset: int | None = None,
        criterion: bytes | None = None, seq: int | None = None,
    ) -> None:
        self.path = path
        self.offset = offset
        self.criterion = criterion
        self.seq = seq
        where = path + (f" at offset {offset}" if offset is not None else "")
        super().__init__(f"{where}: {message}" if where else message)


class StoreFormatError(StoreError, UsageError):
    """A path holds something that is not a store of the expected format or version."""
