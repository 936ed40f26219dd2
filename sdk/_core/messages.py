"""The node protocol's messages: typed values with a strict decoder at the edge.

Every request type names its service (``SERVICE``) and its reply type
(``Reply``). ``to_wire()`` gives plain CBOR-able values; ``from_wire()``
checks every field of untrusted input and raises only
:class:`~ketten.errors.DecodeError`, naming the message and the field.
Events travel as their canonical bytes and are decoded where they are used.

Positions are ``[seq, hash]``; members ``[key, address]``; configurations
as :class:`~ketten._core.membership.ChainConfig` encodes them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import attrs

from ..errors import DecodeError
from .codec import MAX_UINT
from .membership import MAX_MEMBERS, ChainConfig, Member, Pos, decode_pos, encode_pos

__all__ = [
    "MAX_ATTEMPTS",
    "MAX_BATCH",
    "Answer",
    "Append",
    "AppendAck",
    "AppendItem",
    "AppendReply",
    "CommitNotice",
    "CommitQuery",
    "CommitReply",
    "Digest",
    "DigestReply",
    "Fetch",
    "FetchReply",
    "Handover",
    "HandoverReply",
    "Locate",
    "LocateReply",
    "Offer",
    "OfferAnswer",
    "OfferItem",
    "OfferReply",
    "Ping",
    "Pong",
    "Request",
    "Retire",
    "Route",
    "Vote",
    "VoteItem",
    "VoteReply",
    "VoteResult",
]

MAX_BATCH = 256
"""Most items in one batched request (offers, appends, votes, locates)."""
MAX_ATTEMPTS = 64
"""Most earlier attempts one offer may name."""
MAX_EVENTS = 4096
MAX_LOCATOR = 128
MAX_TEXT = 500
_DIGEST_BUCKETS = 16

M = TypeVar("M")


# -- field readers ---------------------------------------------------------------


def _map(body: Any, where: str) -> dict[Any, Any]:
    if type(body) is not dict:
        raise DecodeError("expected a map", where=where)
    return body


def _get(m: dict[Any, Any], key: str, where: str) -> Any:
    if key not in m:
        raise DecodeError(f"missing field {key!r}", where=where)
    return m[key]


def _int(m: dict[Any, Any], key: str, where: str, *, low: int = 0, high: int = MAX_UINT) -> int:
    value = _get(m, key, where)
    if type(value) is not int or not low <= value <= high:
        raise DecodeError(f"field {key!r} must be an integer in [{low}, {high}]", where=where)
    return value


def _bool(m: dict[Any, Any], key: str, where: str) -> bool:
    value = _get(m, key, where)
    if type(value) is not bool:
        raise DecodeError(f"field {key!r} must be a boolean", where=where)
    return value


def _bytes(m: dict[Any, Any], key: str, where: str, *, size: int | None = None,
           optional: bool = False) -> Any:
    value = _get(m, key, where) if not optional else m.get(key)
    if value is None and optional:
        return None
    if type(value) is not bytes or (size is not None and len(value) != size):
        what = f"{size}-byte string" if size is not None else "byte string"
        raise DecodeError(f"field {key!r} must be a {what}", where=where)
    return value


def _text(m: dict[Any, Any], key: str, where: str, *, limit: int = MAX_TEXT) -> str:
    value = _get(m, key, where)
    if type(value) is not str or len(value) > limit:
        raise DecodeError(f"field {key!r} must be a string of at most {limit} characters",
                          where=where)
    return value


def _list(m: dict[Any, Any], key: str, where: str, *, limit: int) -> list[Any]:
    value = _get(m, key, where)
    if type(value) is not list or len(value) > limit:
        raise DecodeError(f"field {key!r} must be a list of at most {limit} items", where=where)
    return value


def _items(m: dict[Any, Any], key: str, where: str, decode: Callable[[Any, str], M], *,
           limit: int = MAX_BATCH, nonempty: bool = False) -> tuple[M, ...]:
    raw = _list(m, key, where, limit=limit)
    if nonempty and not raw:
        raise DecodeError(f"field {key!r} must not be empty", where=where)
    return tuple(decode(v, f"{where}.{key}[{i}]") for i, v in enumerate(raw))


def _pos(m: dict[Any, Any], key: str, where: str) -> Pos | None:
    return decode_pos(m.get(key), where=f"{where}.{key}")


def _key(value: Any, where: str) -> bytes:
    if type(value) is not bytes or len(value) != 32:
        raise DecodeError("expected a 32-byte key", where=where)
    return value


def _event_bytes(value: Any, where: str) -> bytes:
    if type(value) is not bytes or not value:
        raise DecodeError("expected event bytes", where=where)
    return value


def _config(value: Any, where: str) -> ChainConfig:
    return ChainConfig.decode(value, where=where)


def _member(value: Any, where: str) -> Member:
    return Member.decode(value, where=where)


# -- base ------------------------------------------------------------------------


class Request:
    """A request: ``SERVICE`` names where it goes, ``Reply`` what comes back."""

    SERVICE: ClassVar[str]
    Reply: ClassVar[type[Any]]

    def to_wire(self) -> Any:
        raise NotImplementedError

    @classmethod
    def from_wire(cls, body: Any) -> Any:
        raise NotImplementedError


# -- routes ----------------------------------------------------------------------


@attrs.frozen
class Route:
    """What a broker knows of a chain: its configuration, term, leader and commit, and
    the hash of its genesis (which chain it is, should one criterion have two)."""

    config: ChainConfig
    term: int
    leader: bytes | None
    commit: Pos | None
    genesis: bytes | None = None
    genesis_time: int | None = None
    """The time stamped in that genesis (which chain stays, should there be two)."""

    def to_wire(self) -> Any:
        out = {"cf": self.config.encode(), "t": self.term, "l": self.leader,
               "k": encode_pos(self.commit), "g": self.genesis}
        if self.genesis_time is not None:
            out["gt"] = self.genesis_time
        return out

    @classmethod
    def from_wire(cls, body: Any, where: str = "route") -> Route:
        m = _map(body, where)
        leader = m.get("l")
        if leader is not None:
            leader = _key(leader, f"{where}.l")
        genesis = m.get("g")
        if genesis is not None:
            genesis = _key(genesis, f"{where}.g")
        genesis_time = _int(m, "gt", where) if "gt" in m else None
        return cls(_config(_get(m, "cf", where), f"{where}.cf"), _int(m, "t", where), leader,
                   _pos(m, "k", where), genesis, genesis_time)


# -- publish ---------------------------------------------------------------------


class Answer(enum.Enum):
    """A broker's answer to one offered event."""

    ACK = "ack"
    """Committed: ``event`` (or the offered one, when absent) is in the chain."""
    STALE = "stale"
    """The chain moved on: ``event`` is the head to build on."""
    INVALID = "invalid"
    """The event breaks a chain rule (``reason``, ``message``)."""
    REUSED = "reused"
    """The command id names other content already committed (``event``)."""
    REDIRECT = "redirect"
    """Not the leader: ``route`` says who holds the chain and who leads."""
    BUSY = "busy"
    """Not decided in time; ``stored`` says whether the broker holds the event."""
    ABSENT = "absent"
    """No such chain here, and it was not created (``message`` says why)."""
    LIMITED = "limited"
    """Refused for now: the author is over a quota of this broker (``message``)."""


@attrs.frozen
class OfferItem:
    """One event offered for publication.

    ``attempts`` are the hashes of earlier attempts of the same publish call
    (its implicit idempotency key); ``create`` asks a broker with no chain to
    create it with these members (the genesis path); ``urge`` asks a member
    to stand for leader if it knows of no live one.
    """

    event: bytes
    attempts: tuple[bytes, ...] = ()
    create: tuple[Member, ...] | None = None
    urge: bool = False

    def to_wire(self) -> Any:
        out: dict[str, Any] = {"e": self.event}
        if self.attempts:
            out["a"] = list(self.attempts)
        if self.create is not None:
            out["cr"] = [m.encode() for m in self.create]
        if self.urge:
            out["u"] = True
        return out

    @classmethod
    def from_wire(cls, body: Any, where: str = "offer") -> OfferItem:
        m = _map(body, where)
        event = _event_bytes(_get(m, "e", where), f"{where}.e")
        attempts: tuple[bytes, ...] = ()
        if "a" in m:
            attempts = _items(m, "a", where, _key, limit=MAX_ATTEMPTS)
        create = None
        if "cr" in m and m["cr"] is not None:
            create = _items(m, "cr", where, _member, limit=MAX_MEMBERS, nonempty=True)
        urge = _bool(m, "u", where) if "u" in m else False
        return cls(event, attempts, create, urge)


@attrs.frozen
class OfferAnswer:
    kind: Answer
    event: bytes | None = None
    reason: str = ""
    message: str = ""
    route: Route | None = None
    stored: bool = False
    epoch: int = 0
    """The epoch of the answering broker's configuration (a publisher whose view is
    older refreshes it)."""

    def to_wire(self) -> Any:
        out: dict[str, Any] = {"s": self.kind.value}
        if self.epoch:
            out["ep"] = self.epoch
        if self.event is not None:
            out["e"] = self.event
        if self.reason:
            out["r"] = self.reason
        if self.message:
            out["m"] = self.message[:MAX_TEXT]
        if self.route is not None:
            out["rt"] = self.route.to_wire()
        if self.stored:
            out["st"] = True
        return out

    @classmethod
    def from_wire(cls, body: Any, where: str = "offer answer") -> OfferAnswer:
        m = _map(body, where)
        try:
            kind = Answer(_text(m, "s", where))
        except ValueError:
            raise DecodeError(f"unknown answer {m.get('s')!r:.20}", where=where) from None
        event = _event_bytes(m["e"], f"{where}.e") if m.get("e") is not None else None
        reason = _text(m, "r", where) if "r" in m else ""
        message = _text(m, "m", where) if "m" in m else ""
        route = Route.from_wire(m["rt"], f"{where}.rt") if m.get("rt") is not None else None
        stored = _bool(m, "st", where) if "st" in m else False
        epoch = _int(m, "ep", where) if "ep" in m else 0
        if kind is Answer.REUSED and event is None:
            raise DecodeError("a reused answer must carry the event", where=where)
        if kind is Answer.REDIRECT and route is None:
            raise DecodeError("a redirect must carry a route", where=where)
        return cls(kind, event, reason, message, route, stored, epoch)


@attrs.frozen
class OfferReply:
    answers: tuple[OfferAnswer, ...]

    def to_wire(self) -> Any:
        return {"a": [a.to_wire() for a in self.answers]}

    @classmethod
    def from_wire(cls, body: Any) -> OfferReply:
        m = _map(body, "offer reply")
        return cls(_items(m, "a", "offer reply", OfferAnswer.from_wire))


@attrs.frozen
class Offer(Request):
    SERVICE: ClassVar[str] = "offer"
    Reply: ClassVar[type[Any]] = OfferReply

    items: tuple[OfferItem, ...]

    def to_wire(self) -> Any:
        return {"o": [i.to_wire() for i in self.items]}

    @classmethod
    def from_wire(cls, body: Any) -> Offer:
        m = _map(body, "offer")
        return cls(_items(m, "o", "offer", OfferItem.from_wire, nonempty=True))


# -- replication -----------------------------------------------------------------


@attrs.frozen
class AppendItem:
    """The leader of ``term`` to a member: events of one chain, and where they go."""

    criterion: bytes
    term: int
    start: Pos | None
    prev: Pos | None
    events: tuple[bytes, ...]
    commit: Pos | None
    configs: tuple[ChainConfig, ...]
    genesis: bytes | None = None

    def to_wire(self) -> Any:
        return {"c": self.criterion, "t": self.term, "s": encode_pos(self.start),
                "p": encode_pos(self.prev), "e": list(self.events), "k": encode_pos(self.commit),
                "cf": [c.encode() for c in self.configs], "g": self.genesis}

    @classmethod
    def from_wire(cls, body: Any, where: str = "append") -> AppendItem:
        m = _map(body, where)
        configs = _items(m, "cf", where, _config, limit=8, nonempty=True)
        genesis = m.get("g")
        if genesis is not None:
            genesis = _key(genesis, f"{where}.g")
        return cls(_key(_get(m, "c", where), f"{where}.c"), _int(m, "t", where, low=1),
                   _pos(m, "s", where), _pos(m, "p", where),
                   _items(m, "e", where, _event_bytes, limit=MAX_EVENTS),
                   _pos(m, "k", where), configs, genesis)


@attrs.frozen
class CommitNotice:
    """One-way, the leader of ``term`` to a member in line with it: ``commit`` of
    ``criterion`` is committed. Sent alone, without an answer, when a commit mark
    is all the member is owed (it holds the events); a lost one is carried by the
    next append or found by anti-entropy."""

    SERVICE: ClassVar[str] = "commit-notice"

    items: tuple[tuple[bytes, int, Pos], ...]
    """``(criterion, term, commit)`` per chain."""

    def to_wire(self) -> Any:
        return {"i": [[c, t, encode_pos(p)] for c, t, p in self.items]}

    @classmethod
    def from_wire(cls, body: Any) -> CommitNotice:
        m = _map(body, "commit notice")
        items = _items(m, "i", "commit notice", _notice_item, nonempty=True)
        if len({c for c, _, _ in items}) != len(items):
            raise DecodeError("one item per chain", where="commit notice")
        return cls(items)


def _notice_item(value: Any, where: str) -> tuple[bytes, int, Pos]:
    if type(value) is not list or len(value) != 3:
        raise DecodeError("expected [criterion, term, commit]", where=where)
    term = value[1]
    if type(term) is not int or not 1 <= term <= MAX_UINT:
        raise DecodeError("term must be a positive integer", where=where)
    pos = decode_pos(value[2], where=where)
    if pos is None:
        raise DecodeError("the commit must not be null", where=where)
    return _key(value[0], where), term, pos


@attrs.frozen
class Retire:
    """One-way, the leader of ``term`` to a broker its chain no longer needs:
    ``config`` is committed (the configurations before it are pruned) and does not
    name the receiver, and ``commit`` is committed. The receiver gives up its
    replication state and keeps its copy as a reader's copy. Sent when the
    leader prunes the configurations before ``config``, and again in answer to
    a digest of the receiver's that still lists the chain (one lost is told again)."""

    SERVICE: ClassVar[str] = "retire"

    items: tuple[tuple[bytes, int, ChainConfig, Pos | None], ...]
    """``(criterion, term, config, commit)`` per chain."""

    def to_wire(self) -> Any:
        return {"i": [[c, t, cf.encode(), encode_pos(p)] for c, t, cf, p in self.items]}

    @classmethod
    def from_wire(cls, body: Any) -> Retire:
        m = _map(body, "retire")
        items = _items(m, "i", "retire", _retire_item, nonempty=True)
        if len({c for c, _, _, _ in items}) != len(items):
            raise DecodeError("one item per chain", where="retire")
        return cls(items)


def _retire_item(value: Any, where: str) -> tuple[bytes, int, ChainConfig, Pos | None]:
    if type(value) is not list or len(value) != 4:
        raise DecodeError("expected [criterion, term, configuration, commit]", where=where)
    term = value[1]
    if type(term) is not int or not 1 <= term <= MAX_UINT:
        raise DecodeError("term must be a positive integer", where=where)
    config = _config(value[2], f"{where}.configuration")
    return _key(value[0], where), term, config, decode_pos(value[3], where=where)


@attrs.frozen
class AppendAck:
    criterion: bytes
    status: str
    term: int
    log_term: int
    head: Pos | None
    epoch: int
    commit: Pos | None = None
    locator: tuple[Pos, ...] = ()
    reason: str = ""
    genesis: bytes | None = None

    STATUSES: ClassVar[frozenset[str]] = frozenset(
        {"ok", "stale-term", "gap", "mismatch", "refused", "absent", "conflict"})

    def to_wire(self) -> Any:
        out: dict[str, Any] = {"c": self.criterion, "s": self.status, "t": self.term,
                               "lt": self.log_term, "h": encode_pos(self.head), "ep": self.epoch,
                               "k": encode_pos(self.commit)}
        if self.locator:
            out["l"] = [encode_pos(p) for p in self.locator]
        if self.reason:
            out["r"] = self.reason[:MAX_TEXT]
        if self.genesis is not None:
            out["g"] = self.genesis
        return out

    @classmethod
    def from_wire(cls, body: Any, where: str = "append ack") -> AppendAck:
        m = _map(body, where)
        status = _text(m, "s", where)
        if status not in cls.STATUSES:
            raise DecodeError(f"unknown status {status!r:.20}", where=where)
        locator: tuple[Pos, ...] = ()
        if "l" in m:
            raw = _items(m, "l", where, lambda v, w: decode_pos(v, where=w), limit=MAX_LOCATOR)
            if any(p is None for p in raw):
                raise DecodeError("locator entries must not be null", where=where)
            locator = tuple(p for p in raw if p is not None)
        genesis = m.get("g")
        if genesis is not None:
            genesis = _key(genesis, f"{where}.g")
        return cls(_key(_get(m, "c", where), f"{where}.c"), status, _int(m, "t", where),
                   _int(m, "lt", where), _pos(m, "h", where), _int(m, "ep", where),
                   _pos(m, "k", where), locator, _text(m, "r", where) if "r" in m else "",
                   genesis)


@attrs.frozen
class AppendReply:
    acks: tuple[AppendAck, ...]

    def to_wire(self) -> Any:
        return {"a": [a.to_wire() for a in self.acks]}

    @classmethod
    def from_wire(cls, body: Any) -> AppendReply:
        m = _map(body, "append reply")
        return cls(_items(m, "a", "append reply", AppendAck.from_wire))


@attrs.frozen
class Append(Request):
    SERVICE: ClassVar[str] = "append"
    Reply: ClassVar[type[Any]] = AppendReply

    items: tuple[AppendItem, ...]

    def to_wire(self) -> Any:
        return {"i": [i.to_wire() for i in self.items]}

    @classmethod
    def from_wire(cls, body: Any) -> Append:
        m = _map(body, "append")
        items = _items(m, "i", "append", AppendItem.from_wire, nonempty=True)
        if len({i.criterion for i in items}) != len(items):
            raise DecodeError("one item per chain", where="append")
        return cls(items)


@attrs.frozen
class VoteItem:
    """A (pre-)vote request of a candidate for ``term`` of one chain.

    ``rank`` is the candidate's ``(log term, head seq, epoch)``; ``proposed``
    the candidate's configuration (a broker that holds none yet, being
    new to the chain, judges by it); ``force`` a hand-over from the leader
    (no waiting for it to fall silent).
    """

    criterion: bytes
    term: int
    pre: bool
    rank: tuple[int, int, int]
    proposed: ChainConfig | None = None
    force: bool = False
    genesis: bytes | None = None

    def to_wire(self) -> Any:
        out: dict[str, Any] = {"c": self.criterion, "t": self.term, "pre": self.pre,
                               "r": list(self.rank)}
        if self.proposed is not None:
            out["cf"] = self.proposed.encode()
        if self.force:
            out["f"] = True
        if self.genesis is not None:
            out["g"] = self.genesis
        return out

    @classmethod
    def from_wire(cls, body: Any, where: str = "vote") -> VoteItem:
        m = _map(body, where)
        rank = _list(m, "r", where, limit=3)
        if (len(rank) != 3 or any(type(v) is not int for v in rank)
                or not (0 <= rank[0] <= MAX_UINT and -1 <= rank[1] <= MAX_UINT
                        and 0 <= rank[2] <= MAX_UINT)):
            raise DecodeError("rank must be [log term, head seq, epoch]", where=where)
        proposed = _config(m["cf"], f"{where}.cf") if m.get("cf") is not None else None
        genesis = m.get("g")
        if genesis is not None:
            genesis = _key(genesis, f"{where}.g")
        return cls(_key(_get(m, "c", where), f"{where}.c"), _int(m, "t", where, low=1),
                   _bool(m, "pre", where), (rank[0], rank[1], rank[2]), proposed,
                   _bool(m, "f", where) if "f" in m else False, genesis)


@attrs.frozen
class VoteResult:
    criterion: bytes
    granted: bool
    term: int

    def to_wire(self) -> Any:
        return {"c": self.criterion, "g": self.granted, "t": self.term}

    @classmethod
    def from_wire(cls, body: Any, where: str = "vote result") -> VoteResult:
        m = _map(body, where)
        return cls(_key(_get(m, "c", where), f"{where}.c"), _bool(m, "g", where),
                   _int(m, "t", where))


@attrs.frozen
class VoteReply:
    results: tuple[VoteResult, ...]

    def to_wire(self) -> Any:
        return {"v": [r.to_wire() for r in self.results]}

    @classmethod
    def from_wire(cls, body: Any) -> VoteReply:
        m = _map(body, "vote reply")
        return cls(_items(m, "v", "vote reply", VoteResult.from_wire))


@attrs.frozen
class Vote(Request):
    SERVICE: ClassVar[str] = "vote"
    Reply: ClassVar[type[Any]] = VoteReply

    items: tuple[VoteItem, ...]

    def to_wire(self) -> Any:
        return {"i": [i.to_wire() for i in self.items]}

    @classmethod
    def from_wire(cls, body: Any) -> Vote:
        m = _map(body, "vote")
        return cls(_items(m, "i", "vote", VoteItem.from_wire, nonempty=True))


# -- reads -----------------------------------------------------------------------


@attrs.frozen
class CommitReply:
    """``commit`` confirmed by the leader, or a ``route`` to it, or nothing known."""

    kind: str
    commit: Pos | None = None
    route: Route | None = None
    message: str = ""

    KINDS: ClassVar[frozenset[str]] = frozenset({"commit", "redirect", "absent", "busy"})

    def to_wire(self) -> Any:
        out: dict[str, Any] = {"s": self.kind, "k": encode_pos(self.commit)}
        if self.route is not None:
            out["rt"] = self.route.to_wire()
        if self.message:
            out["m"] = self.message[:MAX_TEXT]
        return out

    @classmethod
    def from_wire(cls, body: Any) -> CommitReply:
        m = _map(body, "commit reply")
        kind = _text(m, "s", "commit reply")
        if kind not in cls.KINDS:
            raise DecodeError(f"unknown kind {kind!r:.20}", where="commit reply")
        route = Route.from_wire(m["rt"], "commit reply.rt") if m.get("rt") is not None else None
        if kind == "redirect" and route is None:
            raise DecodeError("a redirect must carry a route", where="commit reply")
        return cls(kind, _pos(m, "k", "commit reply"), route,
                   _text(m, "m", "commit reply") if "m" in m else "")


@attrs.frozen
class CommitQuery(Request):
    """Ask the leader of a chain for its commit position, confirmed by a quorum."""

    SERVICE: ClassVar[str] = "commit"
    Reply: ClassVar[type[Any]] = CommitReply

    criterion: bytes
    urge: bool = False

    def to_wire(self) -> Any:
        return {"c": self.criterion, "u": self.urge}

    @classmethod
    def from_wire(cls, body: Any) -> CommitQuery:
        m = _map(body, "commit")
        return cls(_key(_get(m, "c", "commit"), "commit.c"),
                   _bool(m, "u", "commit") if "u" in m else False)


@attrs.frozen
class Pong:
    """The answer to a :class:`Ping` (nothing but the answer itself)."""

    def to_wire(self) -> Any:
        return {}

    @classmethod
    def from_wire(cls, body: Any) -> Pong:
        _map(body, "pong")
        return cls()


@attrs.frozen
class Ping(Request):
    """Answer at the address you claimed: the answer proves that address is yours."""

    SERVICE: ClassVar[str] = "claim-check"
    Reply: ClassVar[type[Any]] = Pong

    def to_wire(self) -> Any:
        return {}

    @classmethod
    def from_wire(cls, body: Any) -> Ping:
        _map(body, "ping")
        return cls()


@attrs.frozen
class FetchReply:
    on: bool
    events: tuple[bytes, ...]
    more: bool
    commit: Pos | None

    def to_wire(self) -> Any:
        return {"on": self.on, "e": list(self.events), "more": self.more,
                "k": encode_pos(self.commit)}

    @classmethod
    def from_wire(cls, body: Any) -> FetchReply:
        m = _map(body, "fetch reply")
        return cls(_bool(m, "on", "fetch reply"),
                   _items(m, "e", "fetch reply", _event_bytes, limit=MAX_EVENTS),
                   _bool(m, "more", "fetch reply"), _pos(m, "k", "fetch reply"))


@attrs.frozen
class Fetch(Request):
    """The events of a chain after ``after`` (``None``: from the genesis), in a
    batch of at most ``max_bytes``; with ``committed`` only committed ones."""

    SERVICE: ClassVar[str] = "fetch"
    Reply: ClassVar[type[Any]] = FetchReply

    criterion: bytes
    after: Pos | None
    max_bytes: int
    committed: bool = True

    def to_wire(self) -> Any:
        return {"c": self.criterion, "a": encode_pos(self.after), "m": self.max_bytes,
                "ko": self.committed}

    @classmethod
    def from_wire(cls, body: Any) -> Fetch:
        m = _map(body, "fetch")
        return cls(_key(_get(m, "c", "fetch"), "fetch.c"), _pos(m, "a", "fetch"),
                   _int(m, "m", "fetch", low=1), _bool(m, "ko", "fetch") if "ko" in m else True)


@attrs.frozen
class LocateReply:
    """Per chain asked: its route, or ``None``; ``held`` says the node holds a copy of
    the chain's events even without a route (a reader's copy, say). ``settled``: the
    node has had the hand-over (see :class:`Handover`) from a majority of the nodes
    nearest to the chain's key, so its "none" means none; a node that has not is
    not counted when a survey decides that a chain does not exist."""

    routes: tuple[Route | None, ...]
    held: tuple[bool, ...] = ()
    settled: tuple[bool, ...] = ()

    def to_wire(self) -> Any:
        return {"r": [None if r is None else r.to_wire() for r in self.routes],
                "h": list(self.held), **({"s": list(self.settled)} if self.settled else {})}

    @classmethod
    def from_wire(cls, body: Any) -> LocateReply:
        m = _map(body, "locate reply")
        routes = _items(m, "r", "locate reply",
                        lambda v, w: None if v is None else Route.from_wire(v, w))
        held: tuple[bool, ...] = ()
        if "h" in m:
            held = _items(m, "h", "locate reply", lambda v, w: _bool({"v": v}, "v", w))
            if len(held) != len(routes):
                raise DecodeError("one held flag per route", where="locate reply")
        settled: tuple[bool, ...] = ()
        if "s" in m:
            settled = _items(m, "s", "locate reply", lambda v, w: _bool({"v": v}, "v", w))
            if len(settled) != len(routes):
                raise DecodeError("one settled flag per route", where="locate reply")
        return cls(routes, held, settled)


@attrs.frozen
class Locate(Request):
    """What do you know of these chains? (``None`` per chain you hold no state of.)"""

    SERVICE: ClassVar[str] = "locate"
    Reply: ClassVar[type[Any]] = LocateReply

    criteria: tuple[bytes, ...]

    def to_wire(self) -> Any:
        return {"c": list(self.criteria)}

    @classmethod
    def from_wire(cls, body: Any) -> Locate:
        m = _map(body, "locate")
        return cls(_items(m, "c", "locate", _key, nonempty=True))


MAX_HANDOVER = 1024


@attrs.frozen
class HandoverReply:
    """The chains the asker is nearer to than one of their brokers, in key order
    after the one asked from; ``more``: ask again after the last."""

    criteria: tuple[bytes, ...]
    more: bool = False

    def to_wire(self) -> Any:
        return {"c": list(self.criteria), "m": self.more}

    @classmethod
    def from_wire(cls, body: Any) -> HandoverReply:
        m = _map(body, "handover reply")
        criteria = _items(m, "c", "handover reply", _key, limit=MAX_HANDOVER)
        if any(a >= b for a, b in zip(criteria, criteria[1:], strict=False)):
            raise DecodeError("criteria must be in ascending order", where="handover reply")
        return cls(criteria, _bool(m, "m", "handover reply"))


@attrs.frozen
class Handover(Request):
    """A node that (re)joined asks the nodes nearest to it which chains it should
    know of: those whose brokers include one farther from the key than the asker.
    Until a majority of them answered, its own "no such chain" is not trusted."""

    SERVICE: ClassVar[str] = "handover"
    Reply: ClassVar[type[Any]] = HandoverReply

    after: bytes = b""
    """Criteria after this one (empty: from the start)."""

    def to_wire(self) -> Any:
        return {"a": self.after}

    @classmethod
    def from_wire(cls, body: Any) -> Handover:
        m = _map(body, "handover")
        after = _bytes(m, "a", "handover")
        if after and len(after) != 32:
            raise DecodeError("field 'a' must be empty or a 32-byte key", where="handover")
        return cls(after)


# -- anti-entropy ----------------------------------------------------------------


@attrs.frozen
class DigestReply:
    buckets: tuple[bytes, ...]
    entries: tuple[tuple[bytes, int, int], ...] = ()

    def to_wire(self) -> Any:
        return {"b": list(self.buckets), "x": [list(e) for e in self.entries]}

    @classmethod
    def from_wire(cls, body: Any) -> DigestReply:
        m = _map(body, "digest reply")
        return cls(_digest_buckets(m, "digest reply"), _digest_entries(m, "digest reply"))


def _digest_buckets(m: dict[Any, Any], where: str) -> tuple[bytes, ...]:
    buckets = _items(m, "b", where, lambda v, w: _bytes({"v": v}, "v", w, size=16),
                     limit=_DIGEST_BUCKETS)
    if buckets and len(buckets) != _DIGEST_BUCKETS:
        raise DecodeError(f"expected {_DIGEST_BUCKETS} buckets", where=where)
    return buckets


def _digest_entry(value: Any, where: str) -> tuple[bytes, int, int]:
    if (type(value) is not list or len(value) != 3 or type(value[1]) is not int
            or type(value[2]) is not int or not 0 <= value[1] <= MAX_UINT
            or not -1 <= value[2] <= MAX_UINT):
        raise DecodeError("an entry is [criterion, epoch, commit seq]", where=where)
    return _key(value[0], where), value[1], value[2]


def _digest_entries(m: dict[Any, Any], where: str) -> tuple[tuple[bytes, int, int], ...]:
    if "x" not in m:
        return ()
    return _items(m, "x", where, _digest_entry, limit=1 << 16)


@attrs.frozen
class Digest(Request):
    """Anti-entropy between two brokers: one digest per peer pair over every chain
    they share (``buckets``), or the entries of the ``wanted`` buckets."""

    SERVICE: ClassVar[str] = "digest"
    Reply: ClassVar[type[Any]] = DigestReply

    buckets: tuple[bytes, ...]
    wanted: tuple[int, ...] = ()
    entries: tuple[tuple[bytes, int, int], ...] = ()

    def to_wire(self) -> Any:
        return {"b": list(self.buckets), "w": list(self.wanted),
                "x": [list(e) for e in self.entries]}

    @classmethod
    def from_wire(cls, body: Any) -> Digest:
        m = _map(body, "digest")
        wanted = _items(m, "w", "digest", lambda v, w: _int({"v": v}, "v", w,
                                                             high=_DIGEST_BUCKETS - 1),
                        limit=_DIGEST_BUCKETS) if "w" in m else ()
        return cls(_digest_buckets(m, "digest"), wanted, _digest_entries(m, "digest"))
