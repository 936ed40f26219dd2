"""One broker's replica of one chain, sans-IO: elections, appends, commits.

The chain is replicated the way Raft replicates a log, with a leader per
chain and term, elected on demand:

* **Terms and votes.** A broker votes once per term (``voted_for`` is
  durable before the answer leaves). A candidate first asks for *pre-votes*
  (granted only by brokers that have not heard from a live leader lately, or
  whose leader is the candidate: it stopped leading, restarted say), then for
  votes; a quorum of the configuration in force (both majorities
  while joint) makes it leader.
* **Log terms instead of entry terms.** Events are signed by their authors
  before any leader sees them, so they carry no term. Each broker instead
  keeps ``log_term``: the term of the leader its chain was last brought in
  line with. A leader of term ``T`` first brings a follower to its *start*
  (its head when elected), cutting off anything the follower held beyond
  it; only then does the follower take ``log_term = T``, and from then on it
  only appends what that leader sends (its chain stays a prefix of the
  leader's). Elections compare ``(log_term, head seq, epoch)``: a committed
  event is held by a quorum whose ``log_term`` is at least the term that
  committed it, and whoever beats them holds it too.
* **Commit.** The leader counts a follower for position ``s`` once the
  follower's ``log_term`` is the current term and its head is at ``s`` or
  beyond; a quorum of the configuration in force commits ``s``.
* **Configurations** are made only by a leader, one change at a time (a
  joint configuration, then the new one), and travel with the events in
  chain order; each broker uses the latest one it holds.

The driver feeds messages, facts read from the store and ``now``; this
object answers with acknowledgements, store changes, state to persist and
what to send. It never reads a clock or touches a store.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import attrs

from .event import Event
from .membership import ChainConfig, ChainState, Member, Pos
from .reconfig import Change, Decision, Reconfiguration

__all__ = [
    "AckStatus",
    "AppendAckData",
    "AppendOutcome",
    "AppendPlan",
    "Move",
    "Progress",
    "Replica",
    "Role",
    "VoteAnswer",
    "log_rank",
]


class Role(enum.Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"


class AckStatus(enum.Enum):
    OK = "ok"
    """Applied: the head and log term say where the follower stands."""
    STALE_TERM = "stale-term"
    """The sender's term is older than ours (the leader is deposed)."""
    GAP = "gap"
    """The events do not reach our head: send from our head on."""
    MISMATCH = "mismatch"
    """Our chain differs at ``prev``: the locator says what we hold."""
    REFUSED = "refused"
    """We will not apply this (it would cut off committed events, or breaks the rules)."""


@attrs.frozen
class AppendAckData:
    status: AckStatus
    term: int
    log_term: int
    head: Pos | None
    epoch: int
    commit: Pos | None = None
    reason: str = ""


@attrs.frozen
class AppendOutcome:
    """What a follower does with one append: store changes first, then the state, then the ack."""

    ack: AppendAckData
    truncate_from: int | None = None
    """Cut the chain from this seq on (the cut events become orphans)."""
    append: tuple[Event, ...] = ()
    """Append these after the cut (already linked; the driver verifies signatures)."""
    state: ChainState | None = None
    """Persist this state durably before acknowledging."""
    committed: Pos | None = None
    """The commit position advanced to this: persist the state soon (at most the
    flush period later), if :attr:`state` does not already carry it."""


@attrs.frozen
class VoteAnswer:
    granted: bool
    term: int
    state: ChainState | None = None
    """Persist this state durably before answering."""
    stand: bool = False
    """Refused only because the candidate's log is behind ours while no leader is
    active: this broker should stand itself, or the chain stays leaderless until
    someone urges the one broker that can win."""


@attrs.frozen
class Move:
    """What is left to the driver once a leader carried out a reconfiguration
    :class:`~ketten._core.reconfig.Decision` (:meth:`Replica.carry_out`)."""

    persist: ChainState | None = None
    """State to save before anything else is sent."""
    learners: tuple[Member, ...] = ()
    """Members now replicated to as learners (their addresses are needed)."""
    proposed: ChainConfig | None = None
    """The configuration made now (to report)."""
    retire: tuple[Member, ...] = ()
    """Brokers the pruned configurations named and the one in force does not: tell
    each to retire."""
    hand_over: Member | None = None
    """This leader left the configuration in force: ask this member to stand."""
    release: tuple[int, int] | None = None
    """``(keep, epoch)``: this broker retires from the chain (configuration ``epoch``
    leaves it out), keeping the events up to seq ``keep`` as a reader's copy."""
    replicate: bool = False
    """The members are owed appends (new learners, a new or pruned configuration)."""


@attrs.frozen
class AppendPlan:
    """What the leader would send a member now: the driver reads the events.

    ``prev`` is the seq the events follow (-1: from the genesis); events
    ``first..last`` inclusive (``last < first``: none). ``round`` is the
    barrier round this send confirms.
    """

    member: bytes
    prev: int
    first: int
    last: int
    term: int
    start: Pos | None
    commit: Pos | None
    configs: tuple[ChainConfig, ...]
    round: int


@attrs.define(eq=False)
class Progress:
    """The leader's view of one member."""

    match: int = -1
    """Highest seq the member holds in line with us (valid once ``synced``)."""
    synced: bool = False
    """The member's log term is ours."""
    next: int | None = None
    """Next seq to send; ``None``: ask whether it holds our start."""
    epoch: int = 0
    commit_sent: int = -2
    inflight: bool = False
    acked_round: int = 0
    last_ack: float = float("-inf")
    learner: bool = False


def log_rank(log_term: int, head: Pos | None, epoch: int) -> tuple[int, int, int]:
    """How up to date a chain is, for elections (higher is more)."""
    return log_term, -1 if head is None else head[0], epoch


@attrs.define(eq=False)
class Replica:
    """One chain at one broker. ``own`` is this broker's public key."""

    criterion: bytes
    own: bytes
    state: ChainState
    head: Pos | None
    election_timeout: float = 3.0
    role: Role = Role.FOLLOWER
    leader: bytes | None = None
    heard: float = float("-inf")
    """When we last accepted an append from the leader of our term."""
    start: Pos | None = None
    progress: dict[bytes, Progress] = attrs.field(factory=dict)
    votes: set[bytes] = attrs.field(factory=set)
    voting: bool = False
    pre: bool = False
    asked: int = 0
    """The term the running (pre-)election asks for."""
    round: int = 0
    """The latest barrier round the leader started (reads wait for one)."""
    _confirmed_round: int = 0

    # -- facts ---------------------------------------------------------------

    @property
    def config(self) -> ChainConfig | None:
        return self.state.config

    @property
    def term(self) -> int:
        return self.state.term

    @property
    def commit(self) -> Pos | None:
        return self.state.commit

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def is_voter(self, key: bytes | None = None) -> bool:
        config = self.config
        return config is not None and config.is_voter(self.own if key is None else key)

    def rank(self) -> tuple[int, int, int]:
        return log_rank(self.state.log_term, self.head, self.state.epoch)

    def leader_active(self, now: float) -> bool:
        """Have we heard from a live leader of our term lately (or are we it)?"""
        if self.role is Role.LEADER:
            return True
        return self.leader is not None and now - self.heard < self.election_timeout

    def defers_to_leader(self, now: float, *, urge: bool) -> bool:
        """Should a caller (``urge``: one that says the leader does not answer) be sent
        to the leader this follower knows rather than make it stand? An idle leader
        is not a dead one: yes, unless urged, and even then if we heard from it just
        now. Never when the leader named is this broker itself (it does not lead now)."""
        if self.leader is None or self.leader == self.own:
            return False
        return not urge or self.leader_active(now)

    def _evolve(self, **changes: object) -> ChainState:
        self.state = attrs.evolve(self.state, **changes)  # type: ignore[arg-type]
        return self.state

    def resign(self) -> None:
        """Stop leading or following anyone at once (handing the chain over, or
        giving up a damaged copy); the term and vote are kept."""
        self.role = Role.FOLLOWER
        self.leader = None
        self.progress.clear()
        self.start = None

    def _step_down(self, term: int) -> ChainState | None:
        """Follow (and, for a newer term, forget the vote). Returns state to persist."""
        persist = None
        if term > self.state.term:
            persist = self._evolve(term=term, voted_for=None)
        if self.role is not Role.FOLLOWER:
            self.role = Role.FOLLOWER
            self.progress.clear()
            self.start = None
            self.voting = False
            self.votes.clear()
        if term > self.state.term or persist is not None:
            self.leader = None
        return persist

    # -- who may lead or stand ---------------------------------------------------

    def trusts(self, sender: bytes) -> bool:
        """Whether ``sender`` is a voter of a configuration this broker holds."""
        return any(c.is_voter(sender) for c in self.state.configs)

    def needs_voucher(self, sender: bytes, configs: Sequence[ChainConfig]) -> bool:
        """Whether ``sender``, a voter of none of this broker's configurations, claims
        to be one of ``configs``, which it sends itself: a newer configuration this
        broker missed, or a stranger's invention. The driver asks nodes it trusts
        (the members it knows, the nodes nearest to the key) before the claim counts;
        a broker without configurations takes the first it is sent."""
        return (bool(self.state.configs) and not self.trusts(sender)
                and any(c.is_voter(sender) for c in configs))

    # -- follower ------------------------------------------------------------

    def on_append(
        self,
        sender: bytes,
        term: int,
        start: Pos | None,
        prev: Pos | None,
        events: Sequence[Event],
        commit: Pos | None,
        configs: Sequence[ChainConfig],
        now: float,
        hashes: Mapping[int, bytes],
        *,
        vouched: bool = False,
    ) -> AppendOutcome:
        """An append from the leader of ``term``.

        The sender must be a voter of a configuration this broker holds; a
        broker that holds none yet (a new member) takes the ``configs`` the
        leader sends. ``vouched``: nodes this one trusts named the sender a
        voter (see :meth:`needs_voucher`).

        ``hashes`` are our own event hashes at the seqs the message touches
        (``prev``, each event's seq, ``start``) and at our commit mark, for the
        ones we hold. In a
        new term only events up to ``start`` arrive; once our chain reaches
        the start we cut anything after it and take the new log term.
        """
        st = self.state
        # Judged before the term: a stranger must not move it (nor anything else).
        # A leader that is not a voter of the configuration it is moving the chain
        # to still leads until that one is committed: it is a voter of an earlier one.
        if st.configs:
            allowed = vouched or self.trusts(sender)
        else:
            allowed = any(c.is_voter(sender) for c in configs)
        if not allowed:
            return AppendOutcome(self._ack(AckStatus.REFUSED, "the sender is not a voter of "
                                           "any configuration this broker holds"))
        if term < st.term:
            return AppendOutcome(self._ack(AckStatus.STALE_TERM))
        if term == st.term and self.role is Role.LEADER:
            return AppendOutcome(self._ack(AckStatus.REFUSED, "two leaders in one term"))
        persist = self._step_down(term)
        self.role = Role.FOLLOWER
        self.leader = sender
        self.heard = now
        synced = self.state.log_term == term
        head = self.head
        head_seq = -1 if head is None else head[0]
        if synced and self._diverged(prev, events, head_seq, hashes):
            # In line with this leader our chain is a prefix of its chain; if it
            # is not, our store changed behind our back. Be brought in line again.
            synced = False
            persist = self._evolve(log_term=0)
        if prev is not None:
            if prev[0] > head_seq:
                return AppendOutcome(self._ack(AckStatus.GAP), state=persist)
            if hashes.get(prev[0]) != prev[1]:
                return AppendOutcome(self._ack(AckStatus.MISMATCH), state=persist)
        elif events and events[0].seq != 0:
            return AppendOutcome(self._ack(AckStatus.REFUSED, "events without a predecessor"),
                                 state=persist)
        cut: int | None = None
        fresh: list[Event] = []
        position = -1 if prev is None else prev[0]
        for event in events:
            seq = event.seq
            if seq != position + 1:
                return AppendOutcome(self._ack(AckStatus.REFUSED, "events out of order"),
                                     state=persist)
            position = seq
            if fresh:
                fresh.append(event)
            elif seq <= head_seq and hashes.get(seq) == event.hash:
                continue
            elif seq <= head_seq:
                cut = seq
                fresh.append(event)
            else:
                fresh.append(event)
        last = position if events else (prev[0] if prev is not None else -1)
        if fresh:
            new_head: Pos | None = (fresh[-1].seq, fresh[-1].hash)
        elif cut is None:
            new_head = head
        else:  # pragma: no cover - a cut always comes with events
            new_head = None
        if not synced:
            # Do we now hold the leader's start? Then everything after it is stale.
            # A chain that began in the leader's own term has no start: position -1.
            start_seq = -1 if start is None else start[0]
            if start is None:
                reached = True
            else:
                held = None
                for event in fresh:
                    if event.seq == start_seq:
                        held = event.hash
                if held is None and start_seq <= head_seq and (cut is None or start_seq < cut):
                    held = hashes.get(start_seq)
                reached = held == start[1]
            if reached:
                tail_end = new_head[0] if new_head is not None else -1
                # What follows the start is stale, except what this broker knows
                # committed: the leader holds that too (it could not have been
                # elected otherwise), and a copy kept on retiring holds only that.
                keep: Pos | None = start
                keep_seq = start_seq
                marked = self.state.commit
                if (marked is not None and start_seq < marked[0] <= tail_end
                        and (cut is None or cut > marked[0])
                        and hashes.get(marked[0]) == marked[1]):
                    keep, keep_seq = marked, marked[0]
                if tail_end > keep_seq:
                    if cut is None or cut > keep_seq + 1:
                        if fresh and fresh[-1].seq > keep_seq:  # pragma: no cover
                            fresh = [e for e in fresh if e.seq <= keep_seq]
                        cut = keep_seq + 1 if cut is None else min(cut, keep_seq + 1)
                    new_head = keep
            if cut is not None and not self._may_cut(cut):
                return AppendOutcome(self._ack(AckStatus.REFUSED, "the leader's chain lacks a "
                                               "committed event"), state=persist)
            if cut is not None:
                # Configurations made after the cut point go with the events cut off.
                kept = tuple(c for c in self.state.configs if c.at < cut)
                if kept != self.state.configs and kept:
                    persist = self._evolve(configs=kept)
            self.head = new_head
            if reached:
                adopted = tuple(c for c in configs if c.at <= start_seq)
                if not adopted:
                    adopted = tuple(configs[-1:])
                changes: dict[str, object] = {"log_term": term}
                if adopted:
                    changes["configs"] = adopted
                if self._commit_news(commit, new_head):
                    changes["commit"] = commit
                persist = self._evolve(**changes)
            elif persist is not None or cut is not None:
                persist = self.state
            committed = self.state.commit if reached else None
            return AppendOutcome(self._ack(AckStatus.OK), truncate_from=cut, append=tuple(fresh),
                                 state=persist, committed=committed)
        # In line with this leader: only ever extend.
        self.head = new_head
        changes = {}
        mine = self.state.config
        if configs and (mine is None or configs[-1].epoch >= mine.epoch):
            reach = new_head[0] if new_head is not None else -1
            adopted = tuple(c for c in configs if c.at <= max(reach, last))
            if adopted and adopted != self.state.configs:
                changes["configs"] = adopted
        committed = None
        if self._commit_news(commit, new_head):
            changes["commit"] = commit
            committed = commit
        if changes:
            evolved = self._evolve(**changes)
            # A commit mark alone waits for the periodic flush (``committed`` says it
            # moved); what a vote or an election depends on is written before the ack.
            if persist is not None or "configs" in changes:
                persist = evolved
        return AppendOutcome(self._ack(AckStatus.OK), append=tuple(fresh), state=persist,
                             committed=committed)

    def _commit_news(self, commit: Pos | None, head: Pos | None) -> bool:
        """Is ``commit`` (from the leader) within our chain and beyond what we knew?"""
        if commit is None or head is None or commit[0] > head[0]:
            return False
        return self.state.commit is None or self.state.commit[0] < commit[0]

    @staticmethod
    def _diverged(prev: Pos | None, events: Sequence[Event], head_seq: int,
                  hashes: Mapping[int, bytes]) -> bool:
        if prev is not None and prev[0] <= head_seq and hashes.get(prev[0]) != prev[1]:
            return True
        return any(e.seq <= head_seq and hashes.get(e.seq) != e.hash for e in events)

    def _may_cut(self, seq: int) -> bool:
        commit = self.state.commit
        return commit is None or seq > commit[0]

    def _ack(self, status: AckStatus, reason: str = "") -> AppendAckData:
        return AppendAckData(status, self.state.term, self.state.log_term, self.head,
                             self.state.epoch, self.state.commit, reason)

    def on_commit_notice(self, sender: bytes, term: int, commit: Pos,
                         held: bytes | None) -> ChainState | None:
        """A commit mark the leader sent alone (``held``: our hash at its seq, if
        we hold one). Taken only from the leader we follow in its term, with our
        chain in line with it, and only for an event we hold: the hash chain
        then makes everything up to it the committed prefix. Returns the new
        state (the commit moved) or ``None``."""
        st = self.state
        if (self.role is not Role.FOLLOWER or self.leader != sender or term != st.term
                or st.log_term != term or held != commit[1]):
            return None
        if st.commit is not None and st.commit[0] >= commit[0]:
            return None
        return self._evolve(commit=commit)

    def on_commit_learned(self, commit: Pos) -> ChainState | None:
        """A commit position learned elsewhere (a peer holding the same events)."""
        if self.head is None or commit[0] > self.head[0]:
            return None
        if self.state.commit is not None and self.state.commit[0] >= commit[0]:
            return None
        return self._evolve(commit=commit)

    def adopt_committed_config(self, config: ChainConfig) -> ChainState | None:
        """A configuration a peer reports committed, newer than ours."""
        if config.epoch <= self.state.epoch:
            return None
        return self._evolve(configs=(config,))

    # -- elections -----------------------------------------------------------

    def on_vote(self, sender: bytes, term: int, pre: bool, rank: tuple[int, int, int],
                now: float, *, force: bool = False, proposed: ChainConfig | None = None,
                rival: bool = False, exists: bool = False, vouched: bool = False) -> VoteAnswer:
        """A (pre-)vote request of ``sender`` for ``term``.

        ``proposed`` is the candidate's configuration; a broker with none yet
        (new to the chain, or the chain is being created) takes it. What the
        driver knows beyond this replica: ``rival``, the candidate's chain is
        another chain of this criterion (started on the other side of a
        partition; settled by the older genesis, never by a vote); ``exists``,
        this node knows the chain exists (it holds events, or heard of it), so a
        candidate creating it anew is refused: never a second history.
        """
        st = self.state
        config = st.config
        if rival or (exists and rank[1] < 0 and config is None):
            return VoteAnswer(False, st.term)
        # Votes are counted by the candidate's configuration, so a broker that does
        # not know yet that it is a voter there (a new member) still answers; one
        # vote per term and the up-to-date rule are what keep elections safe. A
        # candidate known only from the configuration it proposes counts where this
        # broker holds none, or where trusted nodes vouched for it (``vouched``, see
        # :meth:`needs_voucher`): a stranger must not raise the term, nor win.
        known = self.trusts(sender) or (
            proposed is not None and proposed.is_voter(sender)
            and (not st.configs or vouched))
        if not known:
            return VoteAnswer(False, st.term)
        # A retired broker's vote would only ever help a configuration that the one
        # that left it out replaced: refused, whatever the candidate's log (its own
        # may be gone).
        if st.retired and (proposed is None or proposed.epoch <= st.retired):
            return VoteAnswer(False, st.term)
        # A candidate must also hold every event this broker knows to be committed.
        # A legitimate one always does (its log is at least as long as any commit
        # it could have missed); one that does not is possible only after a store
        # lost committed events, here or there, and must not win.
        commit = st.commit
        up_to_date = rank >= self.rank() and (commit is None or rank[1] >= commit[0])
        # The leader we follow asking for a later term has stopped leading (a
        # leader never stands; it restarted, or resigned): hearing from it lately
        # is no reason to refuse it, nor to keep waiting for it.
        idle = force or sender == self.leader or not self.leader_active(now)
        if pre:
            granted = term > st.term and up_to_date and idle
            # Stand for a lagging candidate only if it is one of our own voters: one known
            # only through a configuration it proposes (a stale joint one, say) would
            # otherwise depose every leader in turn, as each waits to teach it.
            return VoteAnswer(granted, st.term,
                              stand=not up_to_date and idle and self.role is not Role.LEADER
                              and config is not None and config.is_voter(self.own)
                              and config.is_voter(sender))
        if term < st.term:
            return VoteAnswer(False, st.term)
        if term > st.term and not idle and self.role is not Role.LEADER:
            return VoteAnswer(False, st.term)
        # Only a newer term deposes: a leader (or candidate) asked for a vote in its
        # own term, by a rival candidate's request that arrived late, voted for
        # itself and keeps its role (stepping down would leave the term leaderless,
        # every follower still trusting an idle leader that no longer leads).
        persist = self._step_down(term) if term > st.term else None
        if st.config is None and proposed is not None and proposed.is_voter(self.own):
            persist = self._evolve(configs=(proposed,))
        if self.state.voted_for in (None, sender) and up_to_date:
            if self.state.voted_for != sender:
                persist = self._evolve(voted_for=sender)
            return VoteAnswer(True, self.state.term, persist)
        return VoteAnswer(False, self.state.term, persist)

    def begin_election(self, *, pre: bool) -> tuple[int, list[Member]] | None:
        """Start a (pre-)election; returns the term asked for and whom to ask.

        ``None`` if this broker may not stand (no configuration, not a voter).
        A real election raises the term and votes for itself: persist
        :attr:`state` before sending.
        """
        config = self.config
        if config is None or not config.is_voter(self.own):
            return None
        self.votes = {self.own}
        self.voting = True
        self.pre = pre
        if pre:
            term = self.state.term + 1
        else:
            self._evolve(term=self.state.term + 1, voted_for=self.own)
            self.role = Role.CANDIDATE
            self.leader = None
            term = self.state.term
        self.asked = term
        return term, [m for m in config.members() if m.key != self.own]

    def on_vote_answer(self, sender: bytes, granted: bool, term: int, *, asked: int,
                       pre: bool) -> ChainState | None:
        """Count an answer to the request for ``asked`` (``pre``: a pre-vote); ``term``
        is the answerer's. Answers to earlier elections are ignored. Returns
        state to persist if the answer showed a newer term."""
        if term > self.state.term and not (pre and granted):
            self.voting = False
            return self._step_down(term)
        if granted and self.voting and asked == self.asked and pre == self.pre:
            self.votes.add(sender)
        return None

    def elected(self) -> bool:
        config = self.config
        return self.voting and config is not None and config.quorum(self.votes)

    def become_leader(self, now: float) -> ChainState:
        """Take over: our head is the start every follower is brought to."""
        self.role = Role.LEADER
        self.leader = self.own
        self.voting = False
        self.start = self.head
        self.heard = now
        self.progress = {}
        head_seq = -1 if self.head is None else self.head[0]
        held = tuple(c for c in self.state.configs if c.at <= head_seq)
        if held and held != self.state.configs:
            self._evolve(configs=held)  # a leader's configurations are all in its chain
        config = self.config
        assert config is not None
        for member in config.members():
            if member.key != self.own:
                self.progress[member.key] = Progress()
        return self._evolve(log_term=self.state.term)

    def take_over(self, config: ChainConfig, term: int, now: float) -> ChainState:
        """Operator recovery (see :mod:`ketten._core.recovery`): lead ``config`` at once,
        in ``term``, without an election. Returns state to persist."""
        self._evolve(term=term, voted_for=self.own, configs=(config,))
        self.votes = {self.own}
        self.asked = term
        self.pre = False
        return self.become_leader(now)

    # -- leader --------------------------------------------------------------

    def local_appended(self, head: Pos) -> None:
        """The leader's own store now durably holds events up to ``head``."""
        self.head = head

    def add_learner(self, key: bytes) -> None:
        if key != self.own and key not in self.progress:
            self.progress[key] = Progress(learner=True)

    def drop_learner(self, key: bytes) -> None:
        progress = self.progress.get(key)
        if progress is not None and progress.learner:
            del self.progress[key]

    def plan(self, member: bytes, *, max_events: int = 1 << 30) -> AppendPlan | None:
        """The append the leader owes ``member`` now, or ``None``."""
        if self.role is not Role.LEADER:
            return None
        p = self.progress.get(member)
        if p is None or p.inflight:
            return None
        head_seq = -1 if self.head is None else self.head[0]
        commit = self.state.commit
        configs = self.state.configs
        if not p.synced:
            target = -1 if self.start is None else self.start[0]
            if p.next is None or p.next - 1 > target:
                prev, first, last = target, target + 1, target
            else:
                prev, first = p.next - 1, p.next
                last = min(target, first + max_events - 1)
            configs = tuple(c for c in configs if c.at <= target) or configs[-1:]
        else:
            behind = p.match < head_seq
            owes_commit = commit is not None and p.commit_sent < commit[0]
            owes_config = p.epoch < self.state.epoch
            owes_round = p.acked_round < self.round
            if not (behind or owes_commit or owes_config or owes_round):
                return None
            prev, first = p.match, p.match + 1
            last = min(head_seq, first + max_events - 1)
            configs = tuple(c for c in configs if c.at <= max(last, prev)) or configs[-1:]
        if commit is not None and commit[0] > max(last, prev):
            commit = None
        return AppendPlan(member, prev, first, last, self.state.term, self.start, commit,
                          configs, self.round)

    def urgent(self, member: bytes) -> bool:
        """Does the leader owe ``member`` more than a commit mark (events, a catch-up,
        a configuration or a round), which must not wait for company?"""
        p = self.progress.get(member)
        if self.role is not Role.LEADER or p is None:
            return False
        if not p.synced:
            return True
        head_seq = -1 if self.head is None else self.head[0]
        return p.match < head_seq or p.epoch < self.state.epoch or p.acked_round < self.round

    def notice(self, member: bytes) -> Pos | None:
        """The commit mark ``member`` is owed, when that is all it is owed and it
        holds the events up to it in this term (see :meth:`on_commit_notice`):
        sent alone and unanswered, it counts as told once :meth:`noticed`."""
        p = self.progress.get(member)
        commit = self.state.commit
        if (self.role is not Role.LEADER or p is None or p.inflight or not p.synced
                or commit is None or p.commit_sent >= commit[0] or p.match < commit[0]
                or self.urgent(member)):
            return None
        return commit

    def noticed(self, member: bytes, commit: Pos) -> None:
        p = self.progress.get(member)
        if p is not None:
            p.commit_sent = max(p.commit_sent, commit[0])

    def sent(self, plan: AppendPlan) -> None:
        p = self.progress.get(plan.member)
        if p is not None:
            p.inflight = True

    def send_failed(self, member: bytes) -> None:
        p = self.progress.get(member)
        if p is not None:
            p.inflight = False

    def on_append_ack(self, member: bytes, plan: AppendPlan, ack: AppendAckData, now: float,
                      *, locator_match: int | None = None) -> tuple[int | None, ChainState | None]:
        """Take a member's answer to ``plan``.

        ``locator_match`` is the highest seq of the member's locator that is on
        our chain (for a mismatch). Returns a seq the commit may now advance
        to (the driver resolves its hash and calls :meth:`commit_to`) and
        state to persist (a newer term deposed us).
        """
        p = self.progress.get(member)
        if p is not None:
            p.inflight = False
        if ack.term > self.state.term:
            return None, self._step_down(ack.term)
        if self.role is not Role.LEADER or p is None or ack.term != self.state.term:
            return None, None
        p.last_ack = now
        p.acked_round = max(p.acked_round, plan.round)
        head_seq = -1 if ack.head is None else ack.head[0]
        if ack.status is AckStatus.OK:
            if ack.log_term == self.state.term:
                p.match = head_seq if not p.synced else max(p.match, head_seq)
                p.synced = True
                p.next = p.match + 1
                p.epoch = max(p.epoch, ack.epoch)
                if plan.commit is not None:
                    p.commit_sent = max(p.commit_sent, plan.commit[0])
            else:
                # Still being brought to our start (or it lost its state).
                p.synced = False
                p.match = -1
                p.next = head_seq + 1
        elif ack.status is AckStatus.GAP:
            if ack.log_term != self.state.term:
                p.synced = False
                p.match = -1
            elif p.match > head_seq:
                p.match = head_seq
            p.next = head_seq + 1
        elif ack.status is AckStatus.MISMATCH:
            p.synced = False
            p.match = -1
            p.next = (locator_match if locator_match is not None else -1) + 1
        return self._commit_candidate(), None

    def _commit_candidate(self) -> int | None:
        config = self.config
        if config is None or self.role is not Role.LEADER or self.head is None:
            return None
        matches = {self.own: self.head[0]}
        for key, p in self.progress.items():
            if p.synced and not p.learner:
                matches[key] = p.match
        # Only members in line with this term count, and each of them holds our
        # start: whatever a quorum of them holds is committed.
        candidates = sorted({m for m in matches.values() if m >= 0}, reverse=True)
        current = self.state.commit[0] if self.state.commit is not None else -1
        for seq in candidates:
            if seq <= current:
                break
            if config.quorum([k for k, m in matches.items() if m >= seq]):
                return seq
        return None

    def commit_to(self, pos: Pos) -> ChainState | None:
        """The commit advanced to ``pos`` (its hash resolved by the driver)."""
        if self.state.commit is not None and self.state.commit[0] >= pos[0]:
            return None
        return self._evolve(commit=pos)

    def reconfiguring(self) -> bool:
        """Is a configuration change under way (a joint configuration, or one not yet
        the only one)?"""
        config = self.config
        return config is not None and (config.joint or len(self.state.configs) > 1)

    def config_committed(self) -> bool:
        """Is the configuration in force acknowledged by a quorum of itself?"""
        config = self.config
        if config is None or self.role is not Role.LEADER:
            return False
        holders = [self.own] + [k for k, p in self.progress.items()
                                if p.synced and p.epoch >= config.epoch and not p.learner]
        return config.quorum(holders)

    def propose_config(self, config: ChainConfig) -> ChainState:
        """Make ``config`` the one in force (the leader's change; persist before sending)."""
        assert self.role is Role.LEADER and config.epoch == self.state.epoch + 1
        configs = (*self.state.configs, config)
        for member in config.members():
            p = self.progress.get(member.key)
            if member.key == self.own:
                continue
            if p is None:
                self.progress[member.key] = Progress()
            else:
                p.learner = False
        return self._evolve(configs=configs)

    def abandoned(self, epoch: int, commit: int) -> bool:
        """A member reports the chain committed up to seq ``commit`` with configuration
        ``epoch`` in force, older than the first configuration this broker holds as not
        yet committed, and beyond the position where that one was made: the committed
        chain went on without it (its leader lost the term before it committed), so it
        never will commit. This broker was brought in by it and is no member of the
        configuration in force."""
        configs = self.state.configs
        if self.role is Role.LEADER or len(configs) < 2:
            return False
        pending = configs[1]
        mine = -1 if self.commit is None else self.commit[0]
        return epoch < pending.epoch and commit > pending.at and mine <= pending.at

    def retired_by(self, sender: bytes, term: int, config: ChainConfig) -> bool:
        """The leader of ``term`` says ``config`` is committed and does not name this
        broker (a :class:`~ketten._core.messages.Retire`): may this broker give up
        its replication state? Only a follower (not standing for leader) that is a
        voter of one of the configurations it holds, none of them newer than
        ``config``, told by a voter of both ``config`` and one it holds (it cannot
        check that ``config`` was committed), in a term not older than its own."""
        st = self.state
        if self.role is not Role.FOLLOWER or term < st.term or not st.configs:
            return False
        if config.is_voter(self.own) or not config.is_voter(sender):
            return False
        if st.epoch > config.epoch or (st.epoch == config.epoch and st.config != config):
            return False
        return (any(c.is_voter(self.own) for c in st.configs)
                and any(c.is_voter(sender) for c in st.configs))

    def retired_members(self) -> tuple[Member, ...]:
        """Voters of the configurations :meth:`prune_configs` would drop that the
        configuration in force does not name (the leader tells them to retire)."""
        config = self.config
        if config is None or len(self.state.configs) <= 1:
            return ()
        keep = config.keys()
        out: dict[bytes, Member] = {}
        for old in self.state.configs[:-1]:
            for member in old.members():
                if member.key not in keep and member.key != self.own:
                    out.setdefault(member.key, member)
        return tuple(out.values())

    def prune_configs(self) -> ChainState | None:
        """Drop configurations older than the committed one in force."""
        if len(self.state.configs) <= 1:
            return None
        state = self._evolve(configs=self.state.configs[-1:])
        keep = self.state.configs[-1].keys()
        for key in list(self.progress):
            if key not in keep and not self.progress[key].learner:
                del self.progress[key]
        return state

    def next_move(self, plan: Reconfiguration, now: float,
                  desired: Sequence[Member]) -> Decision:
        """The next step of moving the chain to ``desired`` (the members the overlay
        names now), as ``plan`` sees it; only a leader holding a configuration moves."""
        config = self.config
        if self.role is not Role.LEADER or config is None:
            return Decision(Change.NOTHING)
        commit_seq = -1 if self.commit is None else self.commit[0]
        return plan.step(
            now, configs=self.state.configs, committed=self.config_committed(),
            desired=desired,
            ready={k for k, p in self.progress.items() if p.synced and p.match >= commit_seq},
            head_seq=-1 if self.head is None else self.head[0], term=self.term,
            learners={k for k, p in self.progress.items() if p.learner})

    def carry_out(self, decision: Decision) -> Move:
        """Carry out ``decision`` as leader (the driver holds the chain's lock and
        checked that the configurations did not change since it was made)."""
        change = decision.change
        if self.role is not Role.LEADER or self.config is None or change is Change.NOTHING:
            return Move()
        if change is Change.LEARN:
            for member in decision.members:
                self.add_learner(member.key)
            return Move(learners=decision.members, replicate=True)
        if change is Change.FORGET:
            for member in decision.members:
                self.drop_learner(member.key)
            return Move()
        if change is Change.PRUNE:
            retire = self.retired_members()
            state = self.prune_configs()
            return Move(persist=state, retire=retire if state is not None else (),
                        replicate=True)
        if change is Change.PROPOSE:
            assert decision.config is not None
            new = attrs.evolve(decision.config, at=-1 if self.head is None else self.head[0],
                               term=self.term)
            return Move(persist=self.propose_config(new), proposed=new, replicate=True)
        # HAND_OVER: the configuration in force is committed and leaves this node
        # out; it retires at once (nobody else would tell it to).
        epoch = self.config.epoch
        self.resign()
        return Move(hand_over=decision.members[0] if decision.members else None,
                    release=(-1 if self.commit is None else self.commit[0], epoch))

    def begin_round(self) -> int:
        """Start a barrier round (a read confirms leadership with it)."""
        self.round += 1
        return self.round

    def round_confirmed(self, round_: int) -> bool:
        config = self.config
        if config is None or self.role is not Role.LEADER:
            return False
        holders = [self.own] + [k for k, p in self.progress.items()
                                if p.acked_round >= round_ and not p.learner]
        return config.quorum(holders)

    def members_to_send(self) -> list[bytes]:
        return list(self.progress)
