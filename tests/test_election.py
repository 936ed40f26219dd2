"""The campaign sequence (pre-vote, vote, lead) as a sans-IO object."""

from __future__ import annotations

import attrs
import pytest

from ketten import criterion_key
from ketten._core.election import Ask, Election, Outcome, Phase
from ketten._core.membership import ChainConfig, ChainState, Member
from ketten._core.messages import VoteResult
from ketten._core.replica import Replica, Role

KEY = criterion_key("election")
OTHER = criterion_key("another")
KEYS = [bytes([i + 1]) * 32 for i in range(3)]
MEMBERS = [Member(k, f"m:{i}") for i, k in enumerate(KEYS)]
CONFIG = ChainConfig(1, MEMBERS, (), -1, 0)


def replicas(config: ChainConfig = CONFIG) -> list[Replica]:
    return [Replica(KEY, key, ChainState(configs=(config,)), None) for key in KEYS]


def answer(voter: Replica, candidate: bytes, ask: Ask, now: float) -> VoteResult:
    item = ask.item
    vote = voter.on_vote(candidate, item.term, item.pre, item.rank, now, force=item.force,
                         proposed=item.proposed)
    return VoteResult(KEY, vote.granted, vote.term)


def test_a_pre_vote_then_a_vote_make_a_leader() -> None:
    rs = replicas()
    election = Election(KEY)
    step = election.begin(rs[0])
    assert isinstance(step, Ask)
    assert step.item.pre and step.item.term == 1 and not step.item.force
    assert step.persist is None, "a pre-vote changes no durable state"
    assert rs[0].term == 0
    assert {m.key for m in step.members} == {KEYS[1], KEYS[2]}
    answered = election.on_reply(rs[0], KEYS[1], [answer(rs[1], KEYS[0], step, 10.0)])
    assert answered.settled and answered.persist is None
    assert election.decide(rs[0], 10.0) is None
    assert election.phase is Phase.VOTE
    step = election.begin(rs[0])
    assert isinstance(step, Ask)
    assert not step.item.pre and step.item.term == 1
    assert step.persist is not None and step.persist.voted_for == KEYS[0]
    assert rs[0].role is Role.CANDIDATE
    answered = election.on_reply(rs[0], KEYS[2], [answer(rs[2], KEYS[0], step, 10.0)])
    assert answered.settled
    outcome = election.decide(rs[0], 10.0)
    assert outcome is not None and outcome.won and outcome.persist is not None
    assert rs[0].is_leader and outcome.persist.log_term == 1
    assert election.outcome == outcome and election.phase is Phase.DONE
    with pytest.raises(RuntimeError):
        election.begin(rs[0])


def test_a_refused_pre_vote_ends_the_campaign_without_a_new_term() -> None:
    rs = replicas()
    rs[1].leader, rs[1].heard = KEYS[2], 9.5  # they heard from a live leader just now
    rs[2].leader, rs[2].heard = KEYS[2], 9.5
    election = Election(KEY)
    step = election.begin(rs[0])
    assert isinstance(step, Ask)
    for i in (1, 2):
        answered = election.on_reply(rs[0], KEYS[i], [answer(rs[i], KEYS[0], step, 10.0)])
        assert not answered.settled
    outcome = election.decide(rs[0], 10.0)
    assert outcome == Outcome(False)
    assert rs[0].term == 0 and rs[0].role is Role.FOLLOWER and not rs[0].voting


def test_forced_skips_the_pre_vote_and_says_so() -> None:
    rs = replicas()
    rs[1].leader, rs[1].heard = KEYS[2], 9.5
    election = Election(KEY, force=True)
    assert election.phase is Phase.VOTE
    step = election.begin(rs[0])
    assert isinstance(step, Ask) and not step.item.pre and step.item.force
    # A forced request is granted even by a broker that hears from a leader.
    election.on_reply(rs[0], KEYS[1], [answer(rs[1], KEYS[0], step, 10.0)])
    outcome = election.decide(rs[0], 10.0)
    assert outcome is not None and outcome.won


def test_a_newer_term_in_a_reply_is_persisted_and_loses() -> None:
    rs = replicas()
    election = Election(KEY, force=True)
    step = election.begin(rs[0])
    assert isinstance(step, Ask)
    answered = election.on_reply(rs[0], KEYS[1], [VoteResult(KEY, False, 7)])
    assert answered.settled and answered.persist is not None and answered.persist.term == 7
    outcome = election.decide(rs[0], 10.0)
    assert outcome is not None and not outcome.won
    assert rs[0].term == 7 and rs[0].role is Role.FOLLOWER


def test_replies_about_other_chains_count_for_nothing() -> None:
    rs = replicas()
    election = Election(KEY, force=True)
    step = election.begin(rs[0])
    assert isinstance(step, Ask)
    answered = election.on_reply(rs[0], KEYS[1], [VoteResult(OTHER, True, 1)])
    assert answered == election.on_reply(rs[0], KEYS[1], [])
    assert not answered.settled and rs[0].votes == {KEYS[0]}


def test_a_single_voter_asks_nobody() -> None:
    alone = ChainConfig(1, MEMBERS[:1], (), -1, 0)
    replica = replicas(alone)[0]
    election = Election(KEY)
    for _ in range(2):
        step = election.begin(replica)
        assert isinstance(step, Ask) and step.members == ()
        outcome = election.decide(replica, 1.0)
    assert outcome is not None and outcome.won


def test_a_creation_that_loses_its_pre_vote_forgets_the_fresh_replica() -> None:
    replica = Replica(KEY, KEYS[0], ChainState(), None)
    election = Election(KEY, proposed=CONFIG)
    step = election.begin(replica)
    assert isinstance(step, Ask) and step.item.proposed == CONFIG
    assert replica.config == CONFIG
    outcome = election.decide(replica, 1.0)
    assert outcome == Outcome(False, forget=True)


def test_a_broker_that_may_not_stand_ends_at_once() -> None:
    config = ChainConfig(1, MEMBERS[1:], (), -1, 0)
    replica = Replica(KEY, KEYS[0], ChainState(configs=(config,)), None)
    assert Election(KEY).begin(replica) == Outcome(False)
    leader = replicas()[0]
    leader.become_leader(0.0)
    assert Election(KEY).begin(leader) == Outcome(True)


def test_abandoning_a_running_campaign_stops_counting() -> None:
    rs = replicas()
    election = Election(KEY, force=True)
    step = election.begin(rs[0])
    assert isinstance(step, Ask) and rs[0].role is Role.CANDIDATE
    assert election.abandon(rs[0]) == Outcome(False)
    assert rs[0].role is Role.FOLLOWER and not rs[0].voting
    # A late grant changes nothing now.
    election.on_reply(rs[0], KEYS[1], [VoteResult(KEY, True, 1)])
    assert not rs[0].elected()
    assert election.outcome == Outcome(False)


def test_the_answer_to_an_earlier_request_is_not_counted() -> None:
    rs = replicas()
    election = Election(KEY)
    step = election.begin(rs[0])
    assert isinstance(step, Ask)
    election.on_reply(rs[0], KEYS[1], [VoteResult(KEY, True, 0)])
    assert election.decide(rs[0], 1.0) is None
    step = election.begin(rs[0])
    assert isinstance(step, Ask)
    # The grant above was a pre-vote; the real vote needs its own.
    assert rs[0].votes == {KEYS[0]} and not rs[0].elected()


def test_a_retired_broker_votes_only_for_a_newer_configuration() -> None:
    """Told that configuration 3 left it out, a broker refuses every candidate of
    configuration 3 or older (its vote could only help a replaced one win), whatever
    the candidate's log; a candidate of a newer configuration that names it may win
    its vote again."""
    old = ChainConfig(2, MEMBERS, (), -1, 0)
    voter = Replica(KEY, KEYS[2], ChainState(term=4, voted_for=KEYS[0], retired=3), None)
    for pre in (True, False):
        assert not voter.on_vote(KEYS[1], 5, pre, (9, 99, 2), 100.0, proposed=old).granted
        assert not voter.on_vote(KEYS[1], 5, pre, (9, 99, 3), 100.0,
                                 proposed=ChainConfig(3, MEMBERS, (), -1, 0)).granted
        assert not voter.on_vote(KEYS[1], 5, pre, (9, 99, 2), 100.0).granted
    newer = ChainConfig(4, MEMBERS, (), 50, 4)
    assert voter.on_vote(KEYS[1], 5, True, (9, 99, 4), 100.0, proposed=newer).granted
    assert voter.on_vote(KEYS[1], 5, False, (9, 99, 4), 100.0, proposed=newer).granted


def test_the_retired_epoch_is_kept_and_older_states_read_the_same() -> None:
    state = ChainState(term=4, voted_for=KEYS[0], retired=3)
    assert ChainState.decode(state.encode()) == state
    plain = ChainState(term=4, voted_for=KEYS[0], configs=(CONFIG,), commit=(7, b"h" * 32))
    assert len(plain.encode()) < len(attrs.evolve(plain, retired=3).encode())
    assert ChainState.decode(plain.encode()) == plain
    assert ChainState.decode(plain.encode()).retired == 0
