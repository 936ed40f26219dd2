"""Operator recovery of a chain whose configuration lost its majority for good, sans-IO.

Like Kafka's unclean leader election, and as unsafe: events acknowledged by
brokers that are gone, beyond what the longest surviving copy holds, are
lost. The recovering broker asks every other member of the configuration
in force whether it still holds the chain and whether its copy is longer;
it may recover only if none is. The new configuration keeps the members
that answered and fills up, to the old number of voters, with nodes near
the key that answer now; the recovering broker leads it in a term above
every term it learned of.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .membership import ChainConfig, Member, Pos
from .messages import Route

__all__ = ["Recovery"]


@attrs.define(eq=False)
class Recovery:
    """The recovery of one chain by ``own``, whose replica has ``config`` and ``term``."""

    own: Member
    config: ChainConfig
    term: int
    _survivors: dict[bytes, Member] = attrs.field(init=False)
    _longer: Member | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._survivors = {self.own.key: self.own}

    def members_to_ask(self) -> list[Member]:
        """The other members of the configuration in force."""
        return [m for m in self.config.members() if m.key != self.own.key]

    def located(self, member: Member, answered_by: bytes, route: Route | None) -> bool:
        """``member``'s answer (authenticated as ``answered_by``) to a locate; ``True``
        if it survives, and must then be asked whether its copy is longer."""
        if route is None or answered_by != member.key:
            return False
        self._survivors[member.key] = member
        self.term = max(self.term, route.term)
        return True

    def compared(self, member: Member, holds_more: bool) -> None:
        """Whether ``member`` holds events beyond this node's head."""
        if holds_more and self._longer is None:
            self._longer = member

    @property
    def longer(self) -> Member | None:
        """A member holding a longer copy: recover there, not here."""
        return self._longer

    def survivors(self) -> list[Member]:
        return list(self._survivors.values())

    def fill_from(self, candidates: Sequence[Member]) -> list[Member]:
        """Of ``candidates`` (nearest to the key first), those to ask whether they
        answer, to fill the configuration up to its old number of voters."""
        return [m for m in candidates if m.key not in self._survivors]

    def add(self, member: Member, answered_by: bytes) -> bool:
        """A candidate answered (authenticated as ``answered_by``); ``True`` once the
        configuration is full."""
        if self.full():
            return True
        if answered_by == member.key:
            self._survivors.setdefault(member.key, member)
        return self.full()

    def full(self) -> bool:
        return len(self._survivors) >= len(self.config.voters)

    def configuration(self, head: Pos | None) -> ChainConfig:
        """The new configuration, made at ``head`` in :attr:`new_term`."""
        return ChainConfig(self.config.epoch + 1, self.survivors(), (),
                           -1 if head is None else head[0], self.new_term)

    @property
    def new_term(self) -> int:
        """A term above every term this node learned of."""
        return self.term + 1
