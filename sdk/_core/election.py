"""One campaign of one broker for one chain, sans-IO: pre-vote, vote, lead.

:class:`~ketten._core.replica.Replica` keeps the votes of a running
election and decides each answer; :class:`Election` is the sequence
around it. Unless forced (a hand-over from the leader), a candidate first
asks for pre-votes, which change no term anywhere, and stands for real
only once a quorum granted them; a real election raises the term, which
must be durable before the first request leaves. A quorum of the
configuration in force makes the candidate leader, unless an answer
showed a newer term meanwhile.

The driver loads the replica (under the chain's lock) and hands it to
:meth:`Election.begin`, sends the :class:`Ask` it gets, feeds each reply to
:meth:`Election.on_reply` (which says when asking may stop), and calls
:meth:`Election.decide` once the replies are in or the time is up; that
either starts the next phase (``None``) or gives the :class:`Outcome`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from .membership import ChainConfig, ChainState, Member
from .messages import VoteItem, VoteResult
from .replica import Replica, Role

__all__ = ["Answered", "Ask", "Election", "Outcome", "Phase"]


class Phase(enum.Enum):
    PRE = "pre-vote"
    VOTE = "vote"
    DONE = "done"


@attrs.frozen
class Ask:
    """Send ``item`` (with the chain's genesis filled in) to each of ``members``,
    after persisting ``persist`` if it is set. No members: the candidate
    already holds a quorum on its own."""

    item: VoteItem
    members: tuple[Member, ...]
    persist: ChainState | None = None


@attrs.frozen
class Answered:
    """What one reply changed: state to persist, and whether asking may stop."""

    persist: ChainState | None = None
    settled: bool = False


@attrs.frozen
class Outcome:
    """How the campaign ended. ``persist``: durable state to write first (the
    new leader's); ``forget``: the replica was made for this campaign only and
    holds nothing, so the driver may drop it."""

    won: bool
    persist: ChainState | None = None
    forget: bool = False


@attrs.define(eq=False)
class Election:
    """The campaign of ``replica``'s broker for ``criterion``.

    ``force`` skips the pre-vote (the leader hands the chain over);
    ``proposed`` is the first configuration of a chain being created, taken
    by a replica that has none yet.
    """

    criterion: bytes
    force: bool = False
    proposed: ChainConfig | None = None
    _phase: Phase = attrs.field(init=False)
    _term: int = attrs.field(default=0, init=False)
    _fresh: bool = attrs.field(default=False, init=False)
    _outcome: Outcome | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._phase = Phase.VOTE if self.force else Phase.PRE

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def outcome(self) -> Outcome | None:
        return self._outcome

    def begin(self, replica: Replica) -> Ask | Outcome:
        """Start the current phase on ``replica``; an :class:`Outcome` if it cannot
        (this broker leads already, or may not stand)."""
        if self._phase is Phase.DONE:
            raise RuntimeError("the election is over")
        if replica.is_leader:
            return self._end(Outcome(True))
        pre = self._phase is Phase.PRE
        if pre:
            self._fresh = replica.state == ChainState()
        if self.proposed is not None and replica.config is None:
            replica.state = attrs.evolve(replica.state, configs=(self.proposed,))
        begun = replica.begin_election(pre=pre)
        if begun is None:
            return self._end(Outcome(False, forget=pre and self._fresh))
        self._term, members = begun
        item = VoteItem(self.criterion, self._term, pre, replica.rank(), replica.config,
                        self.force and not pre)
        config = replica.config
        if config is not None and config.quorum(replica.votes):
            members = []
        return Ask(item, tuple(members), None if pre else replica.state)

    def on_reply(self, replica: Replica, sender: bytes,
                 results: Iterable[VoteResult]) -> Answered:
        """Count ``sender``'s answer to the running phase's request."""
        persist = None
        for result in results:
            if result.criterion != self.criterion:
                continue
            persist = replica.on_vote_answer(sender, result.granted, result.term,
                                             asked=self._term,
                                             pre=self._phase is Phase.PRE) or persist
        settled = persist is not None or replica.elected() or not replica.voting
        return Answered(persist, settled)

    def decide(self, replica: Replica, now: float) -> Outcome | None:
        """The replies are in (or the time is up): ``None`` if the real election
        follows a won pre-vote (call :meth:`begin` again), else how it ended."""
        if self._phase is Phase.PRE:
            if not replica.elected():
                replica.voting = False
                return self._end(Outcome(False, forget=self._fresh))
            self._phase = Phase.VOTE
            return None
        if self._phase is Phase.DONE:
            raise RuntimeError("the election is over")
        if replica.elected() and replica.term == self._term and replica.role is Role.CANDIDATE:
            return self._end(Outcome(True, replica.become_leader(now)))
        return self._end(self.abandon(replica))

    def abandon(self, replica: Replica) -> Outcome:
        """The campaign ends unfinished (its time ran out): stop counting votes."""
        if not replica.is_leader:
            replica.voting = False
            if replica.role is Role.CANDIDATE:
                replica.role = Role.FOLLOWER
        return self._end(Outcome(replica.is_leader))

    def _end(self, outcome: Outcome) -> Outcome:
        self._phase = Phase.DONE
        if self._outcome is None:
            self._outcome = outcome
        return self._outcome
