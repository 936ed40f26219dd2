"""Who holds a chain: members, configurations with epochs, quorums, and the
durable replication state a broker keeps per chain.

Sans-IO. A chain's *configuration* is ``(epoch, voters)``; during a move it
is *joint* (``old`` holds the previous voters) and every decision needs a
majority of the voters **and** a majority of the old voters (Raft §6). The
first configuration of a chain is fixed when it is created; later ones are
made by its leader and kept, ordered by chain position, in the chain's
:class:`ChainState`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import attrs

from ..errors import DecodeError
from . import codec
from .identity import node_id_of

__all__ = [
    "ChainConfig",
    "ChainState",
    "Member",
    "Pos",
    "decode_pos",
    "encode_pos",
    "majority",
]

Pos = tuple[int, bytes]
"""A chain position: ``(seq, event hash)``."""

STATE_VERSION = 1
MAX_MEMBERS = 64
MAX_ADDRESS = 255
MAX_CONFIGS = 8


def majority(count: int) -> int:
    """How many of ``count`` voters make a majority."""
    return count // 2 + 1


def encode_pos(pos: Pos | None) -> list[Any] | None:
    return None if pos is None else [pos[0], pos[1]]


def decode_pos(value: Any, *, where: str) -> Pos | None:
    """``[seq, 32-byte hash]`` or null. Raises :class:`DecodeError`."""
    if value is None:
        return None
    if (type(value) is not list or len(value) != 2 or type(value[0]) is not int
            or not 0 <= value[0] <= codec.MAX_UINT
            or type(value[1]) is not bytes or len(value[1]) != 32):
        raise DecodeError("expected [seq, 32-byte hash] or null", where=where)
    return value[0], value[1]


@attrs.frozen(order=False)
class Member:
    """A broker of a chain: its public key (its identity) and where it was last reached."""

    key: bytes
    address: str = attrs.field(eq=False)

    @property
    def node_id(self) -> bytes:
        return node_id_of(self.key)

    def encode(self) -> list[Any]:
        return [self.key, self.address]

    @classmethod
    def decode(cls, value: Any, *, where: str) -> Member:
        return cls(*_member_field(value, where=where))


def _member_field(value: Any, *, where: str) -> tuple[bytes, str]:
    """The ``(key, address)`` of a decoded member, checked."""
    if (type(value) is not list or len(value) != 2 or type(value[0]) is not bytes
            or len(value[0]) != 32 or type(value[1]) is not str
            or not 0 < len(value[1]) <= MAX_ADDRESS):
        raise DecodeError("a member must be [32-byte key, address]", where=where)
    return value[0], value[1]


def _members(value: Iterable[Member]) -> tuple[Member, ...]:
    unique: dict[bytes, Member] = {}
    for member in value:
        unique.setdefault(member.key, member)
    return tuple(unique[k] for k in sorted(unique))


def _member_fields(value: Any, *, where: str) -> tuple[tuple[bytes, str], ...]:
    """The ``(key, address)`` of each member of a decoded list, each checked, sorted by
    key and unique."""
    if type(value) is not list or len(value) > MAX_MEMBERS:
        raise DecodeError(f"expected a list of at most {MAX_MEMBERS} members", where=where)
    fields = []
    last = b""
    for v in value:
        field = _member_field(v, where=where)
        if field[0] <= last:
            raise DecodeError("members must be sorted by key and unique", where=where)
        last = field[0]
        fields.append(field)
    return tuple(fields)


_MAX_DECODED = 1024
_MAX_DECODED_MEMBERS = 16
"""Only configurations of so many members are kept (a few megabytes at most)."""
_decoded: dict[tuple[Any, ...], ChainConfig] = {}
"""Configurations decoded lately, by their checked wire fields (see :meth:`ChainConfig.decode`)."""


@attrs.frozen
class ChainConfig:
    """One configuration of a chain.

    ``epoch`` counts configurations from 1. ``voters`` vote and count for
    commits; in a joint configuration ``old`` holds the previous voters, and
    a quorum needs a majority of each. ``at`` is the chain position (the
    seq of the last event before it; -1 before the genesis) where the
    configuration was made, ``term`` the leader term that made it.
    """

    epoch: int
    voters: tuple[Member, ...] = attrs.field(converter=_members)
    old: tuple[Member, ...] = attrs.field(default=(), converter=_members)
    at: int = -1
    term: int = 0
    # Asked for on every append and ack: computed once.
    _voter_keys: frozenset[bytes] = attrs.field(init=False, eq=False, repr=False)
    _keys: frozenset[bytes] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        voters = frozenset(m.key for m in self.voters)
        object.__setattr__(self, "_voter_keys", voters)
        object.__setattr__(self, "_keys", voters | frozenset(m.key for m in self.old))

    @property
    def joint(self) -> bool:
        return bool(self.old)

    def voter_keys(self) -> frozenset[bytes]:
        return self._voter_keys

    def keys(self) -> frozenset[bytes]:
        """Everyone who votes in this configuration (voters and, if joint, old voters)."""
        return self._keys

    def members(self) -> tuple[Member, ...]:
        """Voters, then old voters that are not voters."""
        seen = self.voter_keys()
        return self.voters + tuple(m for m in self.old if m.key not in seen)

    def is_voter(self, key: bytes) -> bool:
        return key in self.keys()

    def quorum(self, keys: Collection[bytes]) -> bool:
        """Do ``keys`` hold a majority of the voters (and of the old voters, if joint)?"""
        have = set(keys)

        def holds(group: tuple[Member, ...]) -> bool:
            return sum(1 for m in group if m.key in have) >= majority(len(group))

        return holds(self.voters) and (not self.old or holds(self.old))

    def address_of(self, key: bytes) -> str | None:
        for member in self.members():
            if member.key == key:
                return member.address
        return None

    def encode(self) -> list[Any]:
        return [self.epoch, [m.encode() for m in self.voters], [m.encode() for m in self.old],
                self.at, self.term]

    @classmethod
    def decode(cls, value: Any, *, where: str) -> ChainConfig:
        if type(value) is not list or len(value) != 5:
            raise DecodeError("a configuration is [epoch, voters, old, at, term]", where=where)
        epoch, voters, old, at, term = value
        if type(epoch) is not int or not 1 <= epoch <= codec.MAX_UINT:
            raise DecodeError("bad epoch", where=where)
        if type(at) is not int or not -1 <= at <= codec.MAX_UINT:
            raise DecodeError("bad position", where=where)
        if type(term) is not int or not 0 <= term <= codec.MAX_UINT:
            raise DecodeError("bad term", where=where)
        voter_fields = _member_fields(voters, where=where)
        if not voter_fields:
            raise DecodeError("a configuration needs at least one voter", where=where)
        # Every field is checked, and of an exact type, by now: equal keys mean an
        # equal configuration (a chain's few configurations arrive with every append).
        old_fields = _member_fields(old, where=where)
        key = (epoch, at, term, voter_fields, old_fields)
        known = _decoded.get(key)
        if known is None:
            known = cls(epoch, [Member(*f) for f in voter_fields],
                        [Member(*f) for f in old_fields], at, term)
            if len(voter_fields) + len(old_fields) <= _MAX_DECODED_MEMBERS:
                if len(_decoded) >= _MAX_DECODED:
                    _decoded.clear()
                _decoded[key] = known
        return known


def _configs(value: Iterable[ChainConfig]) -> tuple[ChainConfig, ...]:
    return tuple(value)


@attrs.frozen
class ChainState:
    """What a broker keeps durably per chain, besides the events.

    ``term`` and ``voted_for``: the leader election (one vote per term).
    ``log_term``: the term of the leader this broker's chain was last fully
    brought in line with (its chain is a prefix of that leader's chain).
    ``configs``: the last committed configuration, then any newer one not
    known to be committed yet; the last one is in force. ``commit``: the
    highest position this broker knows to be committed. ``retired``: the epoch
    of a committed configuration that left this broker out, once it was told so
    (0: never); it votes for no candidate of that configuration or an older one.
    """

    term: int = 0
    voted_for: bytes | None = None
    log_term: int = 0
    configs: tuple[ChainConfig, ...] = attrs.field(default=(), converter=_configs)
    commit: Pos | None = None
    retired: int = 0

    @property
    def config(self) -> ChainConfig | None:
        """The configuration in force (the latest), or ``None`` before the first."""
        return self.configs[-1] if self.configs else None

    @property
    def epoch(self) -> int:
        config = self.config
        return 0 if config is None else config.epoch

    def encode(self) -> bytes:
        fields = [STATE_VERSION, self.term, self.voted_for, self.log_term,
                  [c.encode() for c in self.configs], encode_pos(self.commit)]
        if self.retired:
            fields.append(self.retired)  # a seventh field, so older states read the same
        return codec.dumps(fields)

    @classmethod
    def decode(cls, data: bytes, *, where: str = "chain state") -> ChainState:
        """Raises :class:`~ketten.errors.DecodeError` naming what is wrong."""
        value = codec.loads(data, max_size=1 << 16, where=where)
        if type(value) is not list or len(value) not in (6, 7) or value[0] != STATE_VERSION:
            raise DecodeError("not a chain state of a known version", where=where)
        _, term, voted_for, log_term, configs, commit = value[:6]
        retired = value[6] if len(value) == 7 else 0
        for name, number in (("term", term), ("log term", log_term), ("retired epoch", retired)):
            if type(number) is not int or not 0 <= number <= codec.MAX_UINT:
                raise DecodeError(f"bad {name}", where=where)
        if voted_for is not None and (type(voted_for) is not bytes or len(voted_for) != 32):
            raise DecodeError("bad vote", where=where)
        if type(configs) is not list or len(configs) > MAX_CONFIGS:
            raise DecodeError("bad configuration list", where=where)
        decoded = tuple(ChainConfig.decode(c, where=where) for c in configs)
        if any(b.epoch <= a.epoch for a, b in zip(decoded, decoded[1:], strict=False)):
            raise DecodeError("configuration epochs must grow", where=where)
        return cls(term, voted_for, log_term, decoded, decode_pos(commit, where=where), retired)
