"""Moving a chain to the brokers the overlay names now, sans-IO (the leader's plan).

When the ``r`` nodes closest to a chain's key (as this leader's overlay sees
them) have differed from the configuration in force for longer than the
hysteresis period, the leader moves the chain, one change at a time:

1. the new members catch up as **learners** (they copy the chain, they do
   not vote);
2. a **joint** configuration (new voters, old voters) is made; it is
   committed by a majority of each;
3. the **new** configuration is made and committed by a majority of the new
   voters; members that left stop voting, and a leader that left hands over.

A joint configuration found in force (a leader died half-way) is always
completed first. Never one timeout: a mismatch has to last.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence

import attrs

from .membership import ChainConfig, Member

__all__ = ["Change", "Decision", "Reconfiguration"]


class Change(enum.Enum):
    NOTHING = "nothing"
    PRUNE = "prune"
    """The configuration in force is committed: forget the ones before it."""
    LEARN = "learn"
    """Replicate to ``members`` as learners."""
    FORGET = "forget"
    """Stop replicating to the learners ``members`` (the move was given up)."""
    PROPOSE = "propose"
    """Make ``config`` the configuration in force."""
    HAND_OVER = "hand-over"
    """This leader is no longer a voter: ask ``members[0]`` to take over."""


@attrs.frozen
class Decision:
    change: Change
    members: tuple[Member, ...] = ()
    config: ChainConfig | None = None


@attrs.define(eq=False)
class Reconfiguration:
    """The leader's reconfiguration state for one chain."""

    own: bytes
    hysteresis: float = 30.0
    catch_up_limit: float = 120.0
    _since: float | None = None
    _target: frozenset[bytes] | None = None
    _learning: float | None = None
    moves: int = 0

    def reset(self) -> None:
        self._since = None
        self._target = None
        self._learning = None

    @property
    def pending(self) -> bool:
        """Is a difference being watched or a move under way?"""
        return self._since is not None

    def step(
        self,
        now: float,
        *,
        configs: Sequence[ChainConfig],
        committed: bool,
        desired: Sequence[Member],
        ready: Collection[bytes],
        head_seq: int,
        term: int,
        learners: Collection[bytes],
    ) -> Decision:
        """What to do now.

        ``configs`` are the chain's configurations (the last in force),
        ``committed`` whether that one is committed, ``desired`` the members
        the overlay names now, ``ready`` the keys of members and learners that
        hold the committed chain in line with this term, ``learners`` those
        being replicated to as learners.
        """
        config = configs[-1]
        if not committed:
            return Decision(Change.NOTHING)
        if len(configs) > 1:
            return Decision(Change.PRUNE)
        if config.joint:
            self.moves += 1
            return Decision(Change.PROPOSE, config=ChainConfig(
                config.epoch + 1, config.voters, (), head_seq, term))
        if not config.is_voter(self.own):
            ranked = sorted(config.voters, key=lambda m: (m.key not in ready, m.key))
            return Decision(Change.HAND_OVER, members=tuple(ranked[:1]))
        wanted = frozenset(m.key for m in desired)
        if not desired or wanted == config.voter_keys():
            self.reset()
            if learners:
                return Decision(Change.FORGET, members=tuple(
                    Member(k, "") for k in sorted(learners)))
            return Decision(Change.NOTHING)
        if self._target != wanted:
            self._target = wanted
            self._since = now
            self._learning = None
        assert self._since is not None
        if now - self._since < self.hysteresis:
            return Decision(Change.NOTHING)
        newcomers = tuple(m for m in desired if m.key not in config.voter_keys())
        missing = tuple(m for m in newcomers if m.key not in learners)
        if missing:
            if self._learning is None:
                self._learning = now
            return Decision(Change.LEARN, members=missing)
        if self._learning is None:
            self._learning = now
        if all(m.key in ready for m in newcomers):
            self.reset()
            return Decision(Change.PROPOSE, config=ChainConfig(
                config.epoch + 1, tuple(desired), config.voters, head_seq, term))
        if now - self._learning >= self.catch_up_limit:
            # They could not catch up: try again after another hysteresis period.
            self._since = now
            self._learning = None
            return Decision(Change.FORGET, members=newcomers)
        return Decision(Change.NOTHING)
