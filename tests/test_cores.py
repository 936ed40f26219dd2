"""The sans-IO cores beside the replica: publish, reconfiguration, feeds, messages, state.

Every test drives a core with values and ``now`` alone: no trio, no network,
no store.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ketten import DecodeError, Event, Identity, criterion_key
from ketten._core.feed import FeedState, Placement, Window
from ketten._core.membership import ChainConfig, ChainState, Member
from ketten._core.messages import (
    Answer,
    Append,
    AppendAck,
    AppendItem,
    CommitNotice,
    CommitQuery,
    CommitReply,
    Digest,
    Fetch,
    Handover,
    HandoverReply,
    Locate,
    LocateReply,
    Offer,
    OfferAnswer,
    OfferItem,
    Ping,
    Pong,
    Retire,
    Route,
    Vote,
    VoteItem,
)
from ketten._core.pacing import Hedge
from ketten._core.publish import (
    PublishAttempt,
    Step,
    Verdict,
    backoff_delay,
    judge_offer,
    settled_answer,
)
from ketten._core.read import ReadAttempt, ReadStep
from ketten._core.reconfig import Change, Decision, Reconfiguration
from ketten._core.replica import Move, Replica, Role

KEY = criterion_key("cores")
AUTHOR = Identity.from_seed(b"\x11" * 32)
KEYS = [bytes([i + 1]) * 32 for i in range(6)]
MEMBERS = [Member(k, f"m:{i}") for i, k in enumerate(KEYS)]
FIRST = ChainConfig(1, MEMBERS[:3])


def chain(*payloads: bytes, command: int | None = None) -> list[Event]:
    out: list[Event] = []
    for payload in payloads:
        out.append(Event.create(AUTHOR, criterion=KEY, seq=len(out),
                                prev=out[-1].hash if out else None, payload=payload, time=0,
                                command=command))
    return out


# -- the leader's verdict -------------------------------------------------------


def test_an_event_that_extends_the_head_is_appended() -> None:
    events = chain(b"a", b"b")
    verdict, ref = judge_offer(events[1], head=events[0], earlier=None, by_command=None,
                               at_seq=None)
    assert verdict is Verdict.APPEND and ref is None
    assert judge_offer(events[0], head=None, earlier=None, by_command=None,
                       at_seq=None)[0] is Verdict.APPEND


def test_an_event_on_an_old_head_is_stale_with_the_head() -> None:
    events = chain(b"a", b"b", b"c")
    rival = Event.create(AUTHOR, criterion=KEY, seq=1, prev=events[0].hash, payload=b"x",
                         time=1)
    assert judge_offer(rival, head=events[2], earlier=None, by_command=None,
                       at_seq=events[1]) == (Verdict.STALE, events[2])
    lonely = Event.create(AUTHOR, criterion=KEY, seq=5, prev=b"\0" * 32, payload=b"x", time=1)
    assert judge_offer(lonely, head=None, earlier=None, by_command=None,
                       at_seq=None) == (Verdict.STALE, None)


def test_an_earlier_attempt_of_the_call_is_acknowledged_instead() -> None:
    events = chain(b"a", b"b")
    retry = Event.create(AUTHOR, criterion=KEY, seq=2, prev=events[1].hash, payload=b"b",
                         time=9)
    assert judge_offer(retry, head=events[1], earlier=events[1], by_command=None,
                       at_seq=None) == (Verdict.PRESENT, events[1])


def test_a_command_id_names_one_content() -> None:
    first = chain(b"pay", command=7)[0]
    again = Event.create(AUTHOR, criterion=KEY, seq=1, prev=first.hash, payload=b"pay",
                         time=1, command=7)
    other = Event.create(AUTHOR, criterion=KEY, seq=1, prev=first.hash, payload=b"other",
                         time=1, command=7)
    assert judge_offer(again, head=first, earlier=None, by_command=first,
                       at_seq=None) == (Verdict.PRESENT, first)
    assert judge_offer(other, head=first, earlier=None, by_command=first,
                       at_seq=None) == (Verdict.REUSED, first)


def test_the_answer_waits_for_the_commit_and_says_when_the_outcome_is_unknown() -> None:
    first = chain(b"pay", command=7)[0]
    retry = Event.create(AUTHOR, criterion=KEY, seq=0, prev=None, payload=b"pay", time=5,
                         command=7)
    other = Event.create(AUTHOR, criterion=KEY, seq=1, prev=first.hash, payload=b"other",
                         time=1, command=7)
    acked = settled_answer(Verdict.APPEND, first, first, True)
    assert acked.kind is Answer.ACK and acked.event is None  # the offered event itself
    present = settled_answer(Verdict.PRESENT, retry, first, True)
    assert present.kind is Answer.ACK and present.event == first.to_bytes()
    reused = settled_answer(Verdict.REUSED, other, first, True)
    assert reused.kind is Answer.REUSED and reused.event == first.to_bytes()
    assert "command 7" in reused.message and "seq 0" in reused.message
    for settled, words in ((None, "not committed in time"), (False, "leadership changed")):
        unknown = settled_answer(Verdict.APPEND, first, first, settled)
        assert unknown.kind is Answer.BUSY and unknown.stored
        assert words in unknown.message and "outcome is unknown" in unknown.message


@given(st.integers(0, 64), st.floats(0, 1, exclude_max=True))
def test_backoff_is_jittered_and_capped(attempt: int, draw: float) -> None:
    delay = backoff_delay(attempt, draw, base=0.01, cap=1.0)
    assert 0 <= delay <= 1.0
    assert delay <= 0.01 * 2 ** min(attempt, 30) + 1e-12


# -- the publisher's round ---------------------------------------------------------


def route(leader: bytes | None = KEYS[0], commit: tuple[int, bytes] | None = None) -> Route:
    return Route(FIRST, 3, leader, commit)


def drive(attempt: PublishAttempt, now: float = 0.0) -> tuple[Step, object]:
    action = attempt.next(now)
    return action.step, action


def test_a_publish_finds_a_route_builds_and_sends_to_the_leader() -> None:
    attempt = PublishAttempt(KEY, 10.0, random.Random(1))
    assert attempt.next(0.0).step is Step.ROUTE
    attempt.routed(route(), 0.0)
    build = attempt.next(0.0)
    assert build.step is Step.BUILD and build.seq == 0 and build.prev is None
    attempt.built(chain(b"a")[0])
    send = attempt.next(0.0)
    assert send.step is Step.SEND and send.target is not None and send.target.key == KEYS[0]
    assert send.item is not None and not send.item.urge


def test_a_route_known_beforehand_skips_the_lookup_and_builds_on_its_commit() -> None:
    events = chain(b"a")
    known = PublishAttempt(KEY, 10.0, random.Random(1))
    known.known_route(route(commit=(0, events[0].hash)), 0.0)
    build = known.next(0.0)
    assert build.step is Step.BUILD and build.seq == 1 and build.prev == events[0].hash
    unknown = PublishAttempt(KEY, 10.0, random.Random(1))
    unknown.known_route(None, 0.0)
    assert unknown.next(0.0).step is Step.ROUTE


def test_a_stale_answer_rebuilds_on_the_head_and_names_earlier_attempts() -> None:
    events = chain(b"a", b"b")
    attempt = PublishAttempt(KEY, 10.0, random.Random(1))
    attempt.routed(route(), 0.0)
    attempt.built(events[0])
    target = attempt.next(0.0).target
    assert target is not None
    attempt.answered(target, OfferAnswer(Answer.STALE, event=events[1].to_bytes()),
                     events[1], 0.1)
    action = attempt.next(0.1)
    while action.step is Step.WAIT:
        action = attempt.next(action.until)
    assert action.step is Step.BUILD and action.seq == 2 and action.prev == events[1].hash
    attempt.built(chain(b"a", b"b", b"c")[2])
    send = attempt.next(1.0)
    assert send.item is not None and send.item.attempts == (events[0].hash,)


def test_a_silent_leader_makes_the_publisher_urge_another_member() -> None:
    attempt = PublishAttempt(KEY, 10.0, random.Random(2))
    attempt.routed(route(), 0.0)
    attempt.built(chain(b"a")[0])
    first = attempt.next(0.0)
    assert first.target is not None and first.target.key == KEYS[0]
    attempt.answered(first.target, None, None, 1.0)
    action = attempt.next(1.0)
    while action.step is Step.WAIT:
        action = attempt.next(action.until)
    assert action.step is Step.SEND and action.item is not None and action.item.urge
    assert action.target is not None and action.target.key != KEYS[0]
    assert attempt.maybe_stored  # the silent leader may hold it


def test_the_outcome_at_the_deadline_says_whether_anything_may_be_stored() -> None:
    quiet = PublishAttempt(KEY, 5.0, random.Random(3))
    quiet.routed(None, 0.0, error="nobody near the key answered")
    action = quiet.next(6.0)
    assert action.step is Step.FAIL and action.error == "quorum"
    assert "nobody" in action.message
    unknown = PublishAttempt(KEY, 5.0, random.Random(3))
    unknown.routed(route(), 0.0)
    unknown.built(chain(b"a")[0])
    busy = OfferAnswer(Answer.BUSY, stored=True, message="not committed in time")
    send = unknown.next(0.0)
    assert send.target is not None
    unknown.answered(send.target, busy, None, 0.5)
    assert unknown.next(6.0).error == "unknown"


def test_a_publish_that_cannot_find_the_brokers_asks_again_after_a_growing_backoff() -> None:
    attempt = PublishAttempt(KEY, 130.0, random.Random(6))
    now = 100.0  # long after the clock's zero: the backoff counts from now
    routes: list[float] = []
    while True:
        action = attempt.next(now)
        if action.step is Step.WAIT:
            assert action.until > now
            now = action.until
            continue
        if action.step is Step.BUILD:
            attempt.built(chain(b"a")[0])
            continue
        if action.step is not Step.ROUTE:
            break
        routes.append(now)
        attempt.routed(None, now, error="2 of 6 nodes answered")
        now += 0.001  # a survey of unreachable nodes ends quickly
    assert action.step is Step.FAIL and action.error == "quorum"
    assert "2 of 6" in action.message
    # Up to 0.5 s apart once the backoff has grown, 0.25 s on average: not a tight loop.
    assert 30 <= len(routes) <= 300, len(routes)
    assert routes[-1] - routes[-11] >= 1.0


def test_invalid_and_reused_answers_end_the_call() -> None:
    for kind, error in ((Answer.INVALID, "invalid"), (Answer.REUSED, "reused")):
        attempt = PublishAttempt(KEY, 5.0, random.Random(4))
        attempt.routed(route(), 0.0)
        event = chain(b"a")[0]
        attempt.built(event)
        send = attempt.next(0.0)
        assert send.target is not None
        attempt.answered(send.target, OfferAnswer(kind, event=event.to_bytes(),
                                                  message="no"), event, 0.1)
        assert attempt.next(0.1).step is Step.FAIL and attempt.next(0.1).error == error


def test_a_redirect_follows_the_route_and_a_creation_goes_to_the_first_member() -> None:
    attempt = PublishAttempt(KEY, 5.0, random.Random(5))
    attempt.routed(None, 0.0, create=MEMBERS[3:6])
    attempt.built(chain(b"a")[0])
    create = attempt.next(0.0)
    assert create.target is not None and create.target.key == KEYS[3]
    assert create.item is not None and create.item.create == tuple(MEMBERS[3:6])
    attempt.answered(create.target, OfferAnswer(Answer.REDIRECT, route=route(KEYS[1])),
                     None, 0.1)
    action = attempt.next(0.1)
    while action.step is Step.WAIT:
        action = attempt.next(action.until)
    assert action.target is not None and action.target.key == KEYS[1]
    assert action.item is not None and action.item.create is None


def test_a_broker_that_names_itself_leader_yet_redirects_is_urged() -> None:
    # It does not lead (it stepped down, or lost its leadership to a restart) while its
    # followers still take it for an idle leader: asking it again unurged would go
    # round until the deadline.
    attempt = PublishAttempt(KEY, 5.0, random.Random(7))
    attempt.routed(route(leader=KEYS[1]), 0.0)
    attempt.built(chain(b"a")[0])
    first = attempt.next(0.0)
    assert first.target is not None and first.target.key == KEYS[1]
    assert first.item is not None and not first.item.urge
    attempt.answered(first.target, OfferAnswer(Answer.REDIRECT, route=route(leader=KEYS[1])),
                     None, 0.1)
    action = attempt.next(0.1)
    while action.step is Step.WAIT:
        action = attempt.next(action.until)
    assert action.step is Step.SEND and action.item is not None and action.item.urge
    # A redirect to another broker is followed unurged, as before.
    attempt.answered(action.target, OfferAnswer(Answer.REDIRECT, route=route(leader=KEYS[2])),
                     None, 0.2)
    action = attempt.next(0.2)
    while action.step is Step.WAIT:
        action = attempt.next(action.until)
    assert action.target is not None and action.target.key == KEYS[2]
    assert action.item is not None and not action.item.urge


# -- a read's search for the leader -------------------------------------------------


def settle(attempt: ReadAttempt, now: float) -> tuple[object, float]:
    action = attempt.next(now)
    while action.step is ReadStep.WAIT:
        assert action.until > now
        now = action.until
        action = attempt.next(now)
    return action, now


def test_a_read_asks_the_leader_and_ends_with_its_commit() -> None:
    attempt = ReadAttempt(KEY, 10.0, random.Random(1))
    assert attempt.next(0.0).step is ReadStep.ROUTE
    attempt.routed(route(), 0.0)
    ask = attempt.next(0.0)
    assert ask.step is ReadStep.ASK and ask.target == MEMBERS[0] and not ask.urge
    attempt.answered(MEMBERS[0], CommitReply("commit", commit=(4, b"h" * 32)), 0.1)
    done = attempt.next(0.1)
    assert done.step is ReadStep.DONE and done.commit == (4, b"h" * 32)
    assert done.source == MEMBERS[0]


def test_a_read_of_a_chain_nobody_created_is_empty() -> None:
    attempt = ReadAttempt(KEY, 10.0, random.Random(1))
    attempt.routed(None, 0.0, absent=True)
    done = attempt.next(0.0)
    assert done.step is ReadStep.DONE and done.commit is None and done.source is None


def test_redirects_back_to_the_asked_broker_back_off_and_urge() -> None:
    attempt = ReadAttempt(KEY, 10.0, random.Random(3))
    attempt.routed(route(leader=KEYS[1]), 0.0)
    now = 0.0
    asked = 0
    while True:
        action, now = settle(attempt, now)
        if action.step is not ReadStep.ASK:
            break
        asked += 1
        # Every broker claims the one asked is the leader: a stale, circular view.
        attempt.answered(action.target, CommitReply("redirect", route=route(leader=action.target.key)), now)
        assert attempt.next(now).step is ReadStep.WAIT
    assert action.step is ReadStep.FAIL and "does not lead" in action.message
    # Backoff bounds the queries: far fewer than one per millisecond of the deadline.
    assert 5 < asked < 100


def test_a_silent_leader_is_passed_over_for_an_urged_member() -> None:
    attempt = ReadAttempt(KEY, 10.0, random.Random(2))
    attempt.routed(route(), 0.0)
    first = attempt.next(0.0)
    attempt.answered(first.target, None, 1.0)
    action, _ = settle(attempt, 1.0)
    assert action.step is ReadStep.ASK and action.urge and action.target != MEMBERS[0]


def test_an_absent_answer_refreshes_the_route() -> None:
    attempt = ReadAttempt(KEY, 10.0, random.Random(2))
    attempt.routed(route(), 0.0)
    attempt.answered(MEMBERS[0], CommitReply("absent"), 0.5)
    action, _ = settle(attempt, 0.5)
    assert action.step is ReadStep.ROUTE and action.refresh


def test_a_route_error_retries_until_the_deadline() -> None:
    attempt = ReadAttempt(KEY, 1.0, random.Random(2))
    now = 0.0
    routes = 0
    while True:
        action, now = settle(attempt, now)
        if action.step is not ReadStep.ROUTE:
            break
        routes += 1
        attempt.routed(None, now, error="lookup failed")
    assert action.step is ReadStep.FAIL and action.message == "lookup failed"
    assert routes >= 2


# -- moving chains ----------------------------------------------------------------


def step(r: Reconfiguration, now: float, configs: tuple[ChainConfig, ...], desired: list[Member],
         *, committed: bool = True, ready: set[bytes] | None = None,
         learners: set[bytes] | None = None) -> object:
    return r.step(now, configs=configs, committed=committed, desired=desired,
                  ready=ready or set(), head_seq=9, term=2, learners=learners or set())


def test_nothing_moves_before_the_hysteresis_period() -> None:
    r = Reconfiguration(KEYS[0], hysteresis=30.0)
    desired = [MEMBERS[0], MEMBERS[1], MEMBERS[4]]
    assert step(r, 0.0, (FIRST,), desired).change is Change.NOTHING
    assert step(r, 29.0, (FIRST,), desired).change is Change.NOTHING
    # A different view restarts the clock: never one timeout.
    assert step(r, 31.0, (FIRST,), [MEMBERS[0], MEMBERS[1], MEMBERS[5]]).change is Change.NOTHING
    assert step(r, 50.0, (FIRST,), [MEMBERS[0], MEMBERS[1], MEMBERS[5]]).change is Change.NOTHING


def test_a_move_learns_then_goes_joint_then_final() -> None:
    r = Reconfiguration(KEYS[0], hysteresis=10.0)
    desired = [MEMBERS[0], MEMBERS[4], MEMBERS[5]]
    step(r, 0.0, (FIRST,), desired)
    learn = step(r, 11.0, (FIRST,), desired)
    assert learn.change is Change.LEARN and {m.key for m in learn.members} == {KEYS[4], KEYS[5]}
    learners = {KEYS[4], KEYS[5]}
    assert step(r, 12.0, (FIRST,), desired, learners=learners,
                ready={KEYS[4]}).change is Change.NOTHING
    joint = step(r, 13.0, (FIRST,), desired, learners=learners, ready=learners)
    assert joint.change is Change.PROPOSE and joint.config is not None
    assert joint.config.joint and joint.config.epoch == 2
    assert joint.config.voter_keys() == {KEYS[0], KEYS[4], KEYS[5]}
    assert step(r, 14.0, (FIRST, joint.config), desired,
                committed=False).change is Change.NOTHING
    assert step(r, 15.0, (FIRST, joint.config), desired).change is Change.PRUNE
    final = step(r, 16.0, (joint.config,), desired)
    assert final.change is Change.PROPOSE and final.config is not None
    assert not final.config.joint and final.config.epoch == 3


def test_a_leader_that_left_hands_over_and_slow_learners_are_given_up() -> None:
    r = Reconfiguration(KEYS[0], hysteresis=1.0, catch_up_limit=20.0)
    gone = ChainConfig(3, MEMBERS[3:6])
    hand = step(r, 0.0, (gone,), MEMBERS[3:6], ready={KEYS[4]})
    assert hand.change is Change.HAND_OVER and hand.members[0].key == KEYS[4]
    slow = Reconfiguration(KEYS[0], hysteresis=1.0, catch_up_limit=20.0)
    desired = [MEMBERS[0], MEMBERS[1], MEMBERS[5]]
    step(slow, 0.0, (FIRST,), desired)
    assert step(slow, 2.0, (FIRST,), desired).change is Change.LEARN
    assert step(slow, 10.0, (FIRST,), desired, learners={KEYS[5]}).change is Change.NOTHING
    assert step(slow, 23.0, (FIRST,), desired, learners={KEYS[5]}).change is Change.FORGET


def _synced(replica: Replica, *keys: bytes) -> None:
    """The members ``keys`` hold the leader's chain, up to its head, in its epoch."""
    assert replica.head is not None
    for key in keys:
        p = replica.progress[key]
        p.synced, p.match, p.epoch = True, replica.head[0], replica.state.epoch


def test_a_leader_carries_a_move_through_learners_joint_and_final_then_retires_the_rest(
) -> None:
    leader = Replica(KEY, KEYS[0], ChainState(term=2, configs=(FIRST,), commit=(9, b"h" * 32)),
                     (9, b"h" * 32))
    leader.become_leader(0.0)
    _synced(leader, KEYS[1], KEYS[2])
    plan = Reconfiguration(KEYS[0], hysteresis=5.0)
    desired = [MEMBERS[0], MEMBERS[4], MEMBERS[5]]
    assert leader.carry_out(leader.next_move(plan, 0.0, desired)).persist is None
    learn = leader.carry_out(leader.next_move(plan, 6.0, desired))
    assert {m.key for m in learn.learners} == {KEYS[4], KEYS[5]} and learn.replicate
    assert learn.persist is None and leader.progress[KEYS[4]].learner
    assert leader.next_move(plan, 7.0, desired).change is Change.NOTHING, "not caught up"
    _synced(leader, KEYS[4], KEYS[5])
    joint = leader.carry_out(leader.next_move(plan, 8.0, desired))
    assert joint.proposed is not None and joint.proposed.joint
    assert joint.persist is not None and joint.persist.configs == (FIRST, joint.proposed)
    assert joint.proposed.at == 9 and joint.proposed.term == 2, "made at the head, in this term"
    assert not leader.progress[KEYS[4]].learner, "a voter of the joint configuration now"
    _synced(leader, KEYS[1], KEYS[2], KEYS[4], KEYS[5])
    pruned = leader.carry_out(leader.next_move(plan, 9.0, desired))
    assert pruned.persist is not None and pruned.persist.configs == (joint.proposed,)
    assert pruned.retire == (), "the joint configuration still names every old voter"
    final = leader.carry_out(leader.next_move(plan, 10.0, desired))
    assert final.proposed is not None and not final.proposed.joint
    _synced(leader, KEYS[4], KEYS[5])
    done = leader.carry_out(leader.next_move(plan, 11.0, desired))
    assert {m.key for m in done.retire} == {KEYS[1], KEYS[2]}
    assert set(leader.progress) == {KEYS[4], KEYS[5]}
    assert leader.next_move(plan, 12.0, desired).change is Change.NOTHING
    follower = Replica(KEY, KEYS[1], ChainState(term=2, configs=(FIRST,)), None)
    assert follower.next_move(plan, 12.0, desired).change is Change.NOTHING, "only leaders move"


def test_a_leader_the_configuration_left_out_hands_over_and_retires() -> None:
    final = ChainConfig(3, MEMBERS[3:6], at=9, term=2)
    leader = Replica(KEY, KEYS[0], ChainState(term=2, configs=(final,), commit=(9, b"h" * 32)),
                     (12, b"t" * 32))
    leader.become_leader(0.0)
    _synced(leader, KEYS[4], KEYS[5])
    move = leader.carry_out(leader.next_move(Reconfiguration(KEYS[0]), 0.0, MEMBERS[3:6]))
    assert move.hand_over is not None and move.hand_over.key == KEYS[4], "a caught-up voter"
    assert move.release == (9, 3), "keeps what is committed; retired from epoch 3"
    assert not leader.is_leader and not move.replicate and move.persist is None


def test_a_move_decided_before_the_leader_stepped_down_is_not_carried_out() -> None:
    leader = Replica(KEY, KEYS[0], ChainState(term=2, configs=(FIRST,)), (9, b"h" * 32))
    leader.become_leader(0.0)
    decision = Decision(Change.LEARN, members=(MEMBERS[4],))
    leader.resign()
    assert leader.carry_out(decision) == Move() and KEYS[4] not in leader.progress


def test_the_leader_names_the_brokers_a_pruned_configuration_leaves_out() -> None:
    joint = ChainConfig(2, [MEMBERS[0], MEMBERS[4], MEMBERS[5]], MEMBERS[:3], at=9, term=2)
    final = ChainConfig(3, [MEMBERS[0], MEMBERS[4], MEMBERS[5]], at=9, term=2)
    leader = Replica(KEY, KEYS[0], ChainState(term=2, configs=(joint, final)), (9, b"h" * 32))
    assert {m.key for m in leader.retired_members()} == {KEYS[1], KEYS[2]}
    assert Replica(KEY, KEYS[0], ChainState(term=2, configs=(FIRST, joint)),
                   None).retired_members() == (), "a joint configuration leaves nobody out"
    assert Replica(KEY, KEYS[0], ChainState(configs=(final,)), None).retired_members() == ()


def test_a_broker_retires_only_when_a_voter_it_knows_says_it_is_left_out() -> None:
    joint = ChainConfig(2, [MEMBERS[0], MEMBERS[4], MEMBERS[5]], MEMBERS[:3], at=9, term=2)
    final = ChainConfig(3, [MEMBERS[0], MEMBERS[4], MEMBERS[5]], at=9, term=2)

    def former(*configs: ChainConfig, term: int = 2) -> Replica:
        return Replica(KEY, KEYS[1], ChainState(term=term, configs=configs), (9, b"h" * 32))

    assert former(joint, final).retired_by(KEYS[0], 2, final)
    assert former(FIRST).retired_by(KEYS[0], 2, final), "missed the moves: told by a voter"
    assert former(joint).retired_by(KEYS[0], 3, final), "a newer term is fine"
    assert not former(FIRST).retired_by(KEYS[4], 2, final), "not a voter of ours"
    assert not former(joint).retired_by(KEYS[3], 2, final), "not a voter of the new one"
    assert not former(joint, term=3).retired_by(KEYS[0], 2, final), "an older term"
    assert not former(joint).retired_by(KEYS[0], 2, joint), "it names us"
    newer = ChainConfig(4, [MEMBERS[0], MEMBERS[1], MEMBERS[5]], at=12, term=3)
    assert not former(final, newer).retired_by(KEYS[0], 3, final), "we know a newer one"
    other = ChainConfig(3, [MEMBERS[0], MEMBERS[3], MEMBERS[5]], at=9, term=2)
    assert not former(joint, final).retired_by(KEYS[0], 2, other), "another epoch 3"
    learner = Replica(KEY, KEYS[3], ChainState(term=2, configs=(FIRST,)), None)
    assert not learner.retired_by(KEYS[0], 2, final), "a learner never voted"
    assert not Replica(KEY, KEYS[1], ChainState(), None).retired_by(KEYS[0], 2, final)
    leading = former(joint)
    leading.role = Role.LEADER
    assert not leading.retired_by(KEYS[0], 2, final)


def test_a_retire_message_is_refused_whole_when_any_item_is_malformed() -> None:
    final = ChainConfig(3, [MEMBERS[0], MEMBERS[4], MEMBERS[5]], at=9, term=2)
    message = Retire(((KEY, 2, final, (9, b"h" * 32)), (b"k" * 32, 1, final, None)))
    assert Retire.from_wire(message.to_wire()) == message
    good = [KEY, 2, final.encode(), [9, b"h" * 32]]
    for items, named in [
        ([], "must not be empty"),
        ([good, good], "one item per chain"),
        ([[KEY, 0, final.encode(), None]], "term"),
        ([[KEY, 2, [3, [], [], 9, 2], None]], "at least one voter"),
        ([[KEY, 2, final.encode(), [9, b"short"]]], "32-byte hash"),
        ([[KEY, 2, final.encode()]], "expected"),
        ([good] * 300, "at most"),
    ]:
        with pytest.raises(DecodeError, match=named):
            Retire.from_wire({"i": items})


# -- a subscription's receiving end -------------------------------------------------


def test_a_causal_feed_asks_for_reports_when_behind_and_at_most_every_second_while_holding(
) -> None:
    feed = FeedState((KEY,), {KEY: 0})
    assert not feed.ask_round(0.0, behind=False, holding=False), "nothing to wait for"
    assert feed.ask_round(0.0, behind=False, holding=True)
    assert not feed.ask_round(0.5, behind=False, holding=True), "asked half a second ago"
    assert feed.ask_round(0.6, behind=True, holding=True), "events wait: ask at once"
    assert feed.ask_round(1.6, behind=False, holding=True)


def test_a_causal_feed_takes_a_head_only_from_a_report_of_the_round_it_asked_for() -> None:
    feed = FeedState((KEY,), {KEY: 0})
    feed.note_commit(KEY, KEYS[1], (4, b"h" * 32))  # a notification, in no round
    round_ = feed.begin_round()
    assert not feed.head_known(KEY, round_, 4), "no broker answered this round"
    assert not feed.head_known(KEY, None, 4)
    feed.note_commit(KEY, KEYS[1], (4, b"h" * 32), round_)
    assert feed.head_known(KEY, round_, 4)
    assert not feed.head_known(KEY, round_, None), "a chain with commits is not empty"
    empty = FeedState((KEY,), {KEY: 0})
    round_ = empty.begin_round()
    empty.note_commit(KEY, KEYS[2], None, round_)
    assert empty.head_known(KEY, round_, None), "a broker said nothing is committed"


def test_a_feed_confirms_only_what_a_broker_reported_committed_on_the_local_chain() -> None:
    events = chain(b"a", b"b", b"c")
    feed = FeedState((KEY,), {KEY: 0})
    feed.note_commit(KEY, KEYS[0], (1, events[1].hash))
    hashes = {e.seq: e.hash for e in events}
    head = (2, events[2].hash)
    assert feed.confirmed(KEY, head, {1: hashes[1]}) == (1, False)
    feed.note_commit(KEY, KEYS[1], (5, b"\0" * 32))
    assert feed.confirmed(KEY, head, {1: hashes[1], 5: b"x" * 32}) == (1, True)
    assert feed.place(events[2], (1, events[1].hash)) == Placement.STORE
    assert feed.place(events[2], None) == Placement.SYNC
    assert feed.place(events[0], (1, events[1].hash)) == Placement.KNOWN


def test_a_feed_offers_no_further_than_the_room_the_application_left() -> None:
    feed = FeedState((KEY,), {KEY: 3})
    assert feed.window(KEY, None, 10, drop=False) == Window(None, 3, 2, False)
    assert feed.window(KEY, 2, 10, drop=False) == Window(None, 3, 2, False)
    assert feed.window(KEY, 9, 10, drop=False) == Window(None, 3, 9, False)
    assert feed.window(KEY, 9, 4, drop=False) == Window(None, 3, 6, True)
    assert feed.window(KEY, 9, 0, drop=False) == Window(None, 3, 2, True)
    assert feed.window(KEY, 9, 10, drop=False, limit=5) == Window(None, 3, 5, True)
    # Dropping gives up the oldest: the newest that fit are offered now.
    assert feed.window(KEY, 9, 4, drop=True) == Window(6, 6, 9, False)
    assert feed.window(KEY, 9, 0, drop=True) == Window(None, 3, 2, True)
    assert feed.window(KEY, 9, 7, drop=True) == Window(None, 3, 9, False)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 50), st.none() | st.integers(-1, 100), st.integers(-5, 40), st.booleans(),
       st.none() | st.integers(-1, 100))
def test_a_feed_window_stays_within_what_is_committed_and_what_fits(
        start: int, confirmed: int | None, room: int, drop: bool, limit: int | None) -> None:
    feed = FeedState((KEY,), {KEY: start})
    window = feed.window(KEY, confirmed, room, drop=drop, limit=limit)
    offered = range(window.first, window.last + 1)
    if confirmed is None or confirmed < start:
        assert not offered and window.drop_before is None and not window.more
        return
    assert len(offered) <= max(room, 0)
    assert all(start <= seq <= confirmed for seq in offered)
    assert limit is None or all(seq <= limit for seq in offered)
    if window.drop_before is None:
        assert window.first == start  # nothing is skipped without dropping
    else:
        assert drop and start < window.drop_before == window.first
        assert window.last == min(confirmed, confirmed if limit is None else limit)
    # Whatever is committed and not offered (nor dropped) is looked at again.
    assert window.more == (window.last < confirmed)


# -- messages and state ---------------------------------------------------------------

keys = st.binary(min_size=32, max_size=32)
positions = st.none() | st.tuples(st.integers(0, 2**40), keys)
members = st.builds(Member, keys, st.text(min_size=1, max_size=20))
configs = st.builds(ChainConfig, st.integers(1, 100), st.lists(members, min_size=1, max_size=5),
                    st.lists(members, max_size=3), st.integers(-1, 100), st.integers(0, 100))


@settings(max_examples=60, deadline=None)
@given(configs, st.integers(0, 50), positions, st.none() | keys)
def test_messages_round_trip(config: ChainConfig, term: int, pos: object,
                             genesis: bytes | None) -> None:
    route_ = Route(config, term, config.voters[0].key, pos, genesis,  # type: ignore[arg-type]
                   None if genesis is None else term * 1000)
    samples = [
        Offer((OfferItem(b"event", (b"h" * 32,), config.voters, True),)),
        Append((AppendItem(KEY, term + 1, pos, pos, (b"e1", b"e2"), pos, (config,),  # type: ignore[arg-type]
                           genesis),)),
        Vote((VoteItem(KEY, term + 1, True, (term, 5, config.epoch), config, True, genesis),)),
        CommitQuery(KEY, True),
        Fetch(KEY, pos, 1000, False),  # type: ignore[arg-type]
        Locate((KEY,)),
        Digest((b"\0" * 16,) * 16, (1, 2), ((KEY, 1, 5),)),
        Handover(), Handover(KEY), Ping(),
    ]
    if pos is not None:
        samples.append(CommitNotice(((KEY, term + 1, pos), (b"k" * 32, 1, pos))))  # type: ignore[arg-type]
    for message in samples:
        assert type(message).from_wire(message.to_wire()) == message
    replies = [OfferAnswer(Answer.REDIRECT, route=route_), LocateReply((route_, None), (True, False)),
               LocateReply((route_,), (False,), (True,)), HandoverReply(tuple(sorted((b"a" * 32, KEY))), True),
               AppendAck(KEY, "ok", term, term, pos, 1, pos, (), "", genesis),  # type: ignore[arg-type]
               Pong()]
    for reply in replies:
        assert type(reply).from_wire(reply.to_wire()) == reply


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.binary(max_size=40)
                    | st.text(max_size=10),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=4), max_leaves=12))
def test_message_decoders_raise_only_decode_errors(body: object) -> None:
    for kind in (Offer, Append, Vote, CommitQuery, Fetch, Locate, Digest, Handover, CommitNotice,
                 Retire, Ping):
        try:
            kind.from_wire(body)
        except DecodeError:
            pass
    for reply in (OfferAnswer, LocateReply, AppendAck, HandoverReply, Pong):
        try:
            reply.from_wire(body)
        except DecodeError:
            pass


def test_a_commit_notice_is_refused_whole_when_any_item_is_malformed() -> None:
    good = [KEY, 3, [4, b"h" * 32]]
    assert CommitNotice.from_wire({"i": [good]}).items == ((KEY, 3, (4, b"h" * 32)),)
    for items, named in [
        ([], "must not be empty"),
        ([good, good], "one item per chain"),
        ([[KEY, 0, [4, b"h" * 32]]], "term"),
        ([[KEY, True, [4, b"h" * 32]]], "term"),
        ([[KEY, 3, None]], "must not be null"),
        ([[KEY, 3, [4, b"short"]]], "32-byte hash"),
        ([[KEY[:5], 3, [4, b"h" * 32]]], r"commit notice\.i\[0\]: expected a 32-byte key"),
        ([good] * 300, "at most"),
    ]:
        with pytest.raises(DecodeError, match=named):
            CommitNotice.from_wire({"i": items})


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**40), st.none() | keys, st.integers(0, 2**40),
       st.lists(configs, max_size=3).map(lambda cs: sorted(cs, key=lambda c: c.epoch)),
       positions)
def test_chain_state_round_trips(term: int, vote: bytes | None, log_term: int,
                                 configs_: list[ChainConfig], commit: object) -> None:
    epochs = [c.epoch for c in configs_]
    state = ChainState(term, vote, log_term, tuple(configs_), commit)  # type: ignore[arg-type]
    if len(set(epochs)) != len(epochs):
        with pytest.raises(DecodeError):
            ChainState.decode(state.encode())
    else:
        assert ChainState.decode(state.encode()) == state


def test_damaged_chain_state_is_a_decode_error() -> None:
    good = ChainState(3, None, 2, (FIRST,), None).encode()
    for bad in (b"", b"\x00", good[:-1], good + b"\x00", good.replace(b"\x03", b"\x1b", 1)):
        with pytest.raises(DecodeError):
            ChainState.decode(bad)


# -- a leader's outbox to one peer, and patience with chains that should move ---------


def test_an_outbox_batches_oldest_first_and_backs_off_a_failing_peer() -> None:
    from ketten._core.outbox import Outbox

    outbox = Outbox(MEMBERS[1], max_batch=2, base_delay=0.05, max_delay=1.0)
    for name in (b"a", b"b", b"c", b"a"):
        outbox.owe(name)
    assert outbox.delay(0.5) == 0.0
    # Owing a chain again keeps its place: a busy chain does not starve the others.
    assert outbox.take() == [b"a", b"b"] and len(outbox) == 1
    outbox.failed([b"a", b"b"])
    first = outbox.delay(0.5)
    outbox.failed([])
    assert 0 < first < outbox.delay(0.5)
    for _ in range(20):
        outbox.failed([])
    assert outbox.delay(0.999) < 1.5 and outbox.delay(0.0) == 0.5
    outbox.answered(items=3, refused=3)  # refusing everything is failing
    assert outbox.failures == 23
    outbox.answered(items=3, refused=1)
    assert outbox.failures == 0 and outbox.delay(0.9) == 0.0
    assert outbox.take() == [b"c", b"a"] and outbox.take() == [b"b"] and not outbox


def test_a_commit_mark_waits_for_company_but_never_longer_than_its_delay() -> None:
    from ketten._core.outbox import Outbox

    outbox = Outbox(MEMBERS[1], max_batch=8, lazy_delay=0.5)
    outbox.owe(b"a", lazy=True, now=10.0)
    outbox.owe(b"b", lazy=True, now=10.2)
    assert outbox and len(outbox) == 2
    assert outbox.delay(0.5, now=10.1) == pytest.approx(0.4)  # the oldest mark's deadline
    assert outbox.delay(0.5, now=11.0) == 0.0
    outbox.owe(b"c", now=10.3)  # events are owed: go now, the marks ride along
    assert outbox.delay(0.5, now=10.3) == 0.0
    assert outbox.take() == [b"c", b"a", b"b"] and not outbox
    outbox.owe(b"a", lazy=True, now=12.0)
    outbox.owe(b"a", now=12.1)  # owed more than a mark now: no waiting
    assert outbox.delay(0.5, now=12.1) == 0.0 and outbox.take() == [b"a"]
    outbox.owe(b"a", now=13.0)
    outbox.owe(b"a", lazy=True, now=13.1)  # a mark never makes owed events wait
    assert outbox.delay(0.5, now=13.1) == 0.0
    eager = Outbox(MEMBERS[1], max_batch=8)  # lazy_delay 0: marks go at once
    eager.owe(b"a", lazy=True, now=1.0)
    assert eager.delay(0.5, now=1.0) == 0.0 and eager.take() == [b"a"]


def test_digests_with_a_peer_in_step_slow_down_until_something_changes() -> None:
    from ketten._core.pacing import DigestPacing

    pacing = DigestPacing(max_level=3)
    peer, other = b"p" * 32, b"q" * 32
    due_rounds = []
    for round_ in range(1, 40):
        if pacing.due(peer, round_, activity=7):
            due_rounds.append(round_)
            pacing.in_step(peer, round_, activity=7)
    # Every round, then every 2nd, 4th and at most every 8th.
    assert due_rounds[:5] == [1, 2, 4, 8, 16] and due_rounds[5:] == [24, 32]
    assert pacing.due(peer, 33, activity=8)  # something changed here: at once
    pacing.in_step(peer, 33, activity=8)
    assert pacing.due(peer, 34, activity=8)  # and every round again for a start
    pacing.out_of_step(peer)  # a difference or a failure
    assert pacing.due(peer, 34, activity=8) and pacing.due(other, 1, activity=0)
    pacing.in_step(other, 1, activity=0)
    pacing.keep_only([peer])
    assert len(pacing) == 0 or all(k == peer for k in pacing._peers)


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 5)), max_size=40))
def test_a_move_is_due_only_after_a_full_period_of_mismatch(steps: list[tuple[bool, float]]) -> None:
    from ketten._core.watch import MoveWatch

    watch = MoveWatch(hysteresis=3.0)
    now = 0.0
    since: float | None = None
    for mismatched, gap in steps:
        now += gap
        if mismatched and since is None:
            since = now
        if not mismatched:
            since = None
        due = watch.due(KEY, now, mismatched=mismatched)
        assert due == (since is not None and now - since >= 3.0)
        if due:
            watch.stood(KEY, now)
            since = now


def _tagged(tag: int, content: bytes) -> bytes:
    if tag < 24:
        return bytes([0xC0 | tag]) + content
    if tag < 0x100:
        return bytes([0xD8, tag]) + content
    if tag < 0x10000:
        return b"\xd9" + tag.to_bytes(2, "big") + content
    return b"\xda" + tag.to_bytes(4, "big") + content


def test_the_wire_decoder_refuses_every_cbor_tag() -> None:
    # Big integers, shared (and cyclic) references, regular expressions, sets...:
    # none of our formats uses a tag, so none may turn into an object.
    from ketten import wire

    for tag in [*range(0x10000), 0x10000, 2**32 - 1]:
        contents = (b"\x00", b"\x41\x01", b"\x60", b"\x81\x00") if tag < 0x1000 else (b"\x00",)
        for content in contents:
            with pytest.raises(DecodeError):
                wire.loads(_tagged(tag, content), max_size=64, where="test")
    cyclic = b"\xd8\x1c\x81\xd8\x1d\x00"  # 28([29(0)]): a list that contains itself
    with pytest.raises(DecodeError, match="tag"):
        wire.loads(cyclic, max_size=64, where="test")
    with pytest.raises(DecodeError, match="test"):
        wire.loads(b"\xa1\x81\x00\x00", max_size=64, where="test")  # a list as a map key


def test_of_two_chains_of_one_criterion_the_older_stays_everywhere_alike() -> None:
    from ketten._core.chain import genesis_wins

    author = Identity.from_seed(b"\x07" * 32)
    early, late, same_time = (Event.create(author, criterion=KEY, seq=0, prev=None,
                                           payload=p, time=t)
                              for p, t in ((b"a", 1000), (b"b", 2000), (b"c", 1000)))
    assert genesis_wins(early, late) and not genesis_wins(late, early)
    # A tie in time falls to the hash; exactly one of the two stays.
    assert genesis_wins(early, same_time) != genesis_wins(same_time, early)
    assert genesis_wins(early, early)


# -- Acquaintances ----------------------------------------------------------------------


def test_acquaintances_name_the_recently_seen_nodes_nearest_to_a_key() -> None:
    from ketten._core.acquaintances import Acquaintances

    keys = [Identity.from_seed(bytes([i]) * 32).public_key for i in range(6)]
    known = Acquaintances(capacity=4)
    for when, key in enumerate(keys):
        known.saw(key, f"n:{when}", float(when))
    assert len(known) == 4 and known.last_seen(keys[0]) is None  # least recent out
    target = criterion_key("near")
    nearest = known.nearest(target, 2, since=3.0)
    recent = keys[3:]
    expected = sorted(recent, key=lambda k: int.from_bytes(Member(k, "x").node_id, "big")
                      ^ int.from_bytes(target, "big"))[:2]
    assert [m.key for m in nearest] == expected
    assert known.nearest(target, 5, since=6.0) == []
    known.saw(keys[3], "n:new", 9.0)  # answered again, somewhere else
    assert [(m.key, m.address) for m in known.nearest(target, 5, since=6.0)] == [
        (keys[3], "n:new")]
    # A request refreshes a known node but never moves it to the address it claims;
    # a stranger's request makes it known at the address it claims, until it answers.
    known.saw(keys[3], "n:claimed", 10.0, reached=False)
    known.saw(keys[0], "n:stranger", 10.0, reached=False)
    assert sorted((m.key, m.address) for m in known.nearest(target, 5, since=10.0)) == sorted([
        (keys[3], "n:new"), (keys[0], "n:stranger")])
    known.saw(keys[0], "n:other", 11.0, reached=False)
    known.saw(keys[3], "n:answered", 11.0)
    assert sorted((m.key, m.address) for m in known.nearest(target, 5, since=11.0)) == sorted([
        (keys[3], "n:answered"), (keys[0], "n:stranger")])


def test_made_up_keys_that_only_send_requests_never_push_out_nodes_that_answered() -> None:
    from ketten._core.acquaintances import Acquaintances

    known = Acquaintances(capacity=3)
    answered = [Identity.from_seed(bytes([i]) * 32).public_key for i in range(3)]
    for key in answered:
        known.saw(key, "n:real", 1.0)
    for i in range(50):  # a flood of fresh identities, each sending one request
        known.saw(Identity.from_seed(bytes([100 + i]) * 32).public_key, "n:fake", 2.0,
                  reached=False)
    assert all(known.last_seen(key) == 1.0 for key in answered)
    assert len(known) == 4  # one address holds one node: the newest claim of it
    for i in range(50):  # at addresses of their own: the bound holds, nothing leaks
        known.saw(Identity.from_seed(bytes([200 - i]) * 32).public_key, f"n:{i}", 3.0,
                  reached=False)
    assert len(known) == 6
    assert len(known._claimants) == 3 and len(known._doubted) == 0
    target = criterion_key("near")
    assert {m.key for m in known.nearest(target, 10, since=0.0)} >= set(answered)


def test_a_claim_whose_check_got_no_answer_counts_only_for_a_grace() -> None:
    """Made-up keys claiming addresses that accept connections and never answer would
    otherwise stand near their keys for the whole memory."""
    from ketten._core.acquaintances import Acquaintances

    known = Acquaintances()
    keys = [Identity.from_seed(bytes([i]) * 32).public_key for i in range(4)]
    target = criterion_key("near")
    for i, key in enumerate(keys):
        known.saw(key, f"n:{i}", 1.0, reached=False)
    known.doubt(keys[0], "n:0", until=5.0)
    known.doubt(keys[1], "n:elsewhere", until=5.0)  # not its claim: no effect
    assert known.doubted(keys[0]) and not known.doubted(keys[1])
    in_grace = {m.key for m in known.nearest(target, 10, since=0.0, now=4.0)}
    after = {m.key for m in known.nearest(target, 10, since=0.0, now=6.0)}
    assert in_grace == set(keys) and after == set(keys[1:])
    # Without ``now`` (no doubts applied) and once it answered, it counts again.
    assert {m.key for m in known.nearest(target, 10, since=0.0)} == set(keys)
    known.saw(keys[0], "n:0", 7.0)
    assert not known.doubted(keys[0])
    assert keys[0] in {m.key for m in known.nearest(target, 10, since=0.0, now=8.0)}
    # A new key claiming an address takes it from the unproven key that claimed it.
    known.saw(Identity.from_seed(b"\x09" * 32).public_key, "n:3", 9.0, reached=False)
    assert keys[3] not in {m.key for m in known.nearest(target, 10, since=0.0, now=9.0)}


def test_a_refuted_claim_is_forgotten_but_a_node_that_answered_is_kept() -> None:
    from ketten._core.acquaintances import Acquaintances

    known = Acquaintances()
    claimant, answered = (Identity.from_seed(bytes([i]) * 32).public_key for i in (1, 2))
    known.saw(claimant, "n:claimed", 1.0, reached=False)
    known.saw(answered, "n:real", 1.0)
    assert known.answered_at(claimant) is None and known.answered_at(answered) == "n:real"
    assert not known.refute(claimant, "n:elsewhere")  # not the address it claimed
    assert not known.refute(answered, "n:real")  # it answered there: kept
    assert known.refute(claimant, "n:claimed")
    assert known.last_seen(claimant) is None and known.last_seen(answered) == 1.0
    assert [m.key for m in known.nearest(criterion_key("k"), 5, since=0.0)] == [answered]


def test_rate_limit_gives_a_burst_then_a_rate_per_key_and_forgets_the_oldest_key() -> None:
    from ketten._core.quota import RateLimit

    limit = RateLimit(rate=2.0, burst=3, max_keys=2)
    assert [limit.allow(b"a", 0.0) for _ in range(4)] == [True, True, True, False]
    assert limit.refused == 1 and limit.wait(b"a", 0.0) == 0.5
    assert limit.allow(b"b", 0.0)  # keys do not share a bucket
    assert not limit.allow(b"a", 0.25) and limit.allow(b"a", 0.75)
    assert [limit.allow(b"a", 10.0) for _ in range(4)] == [True, True, True, False]
    limit.allow(b"c", 10.0)  # a third key: "b", the least recently used, is forgotten
    assert len(limit) == 2 and limit.wait(b"b", 10.0) == 0.0


def test_rate_limit_charges_costs_and_refuses_whole() -> None:
    from ketten._core.quota import RateLimit

    limit = RateLimit(rate=100.0, burst=1000)
    assert limit.allow(b"a", 0.0, 600) and not limit.allow(b"a", 0.0, 600)
    # A refusal takes nothing: the 400 left are still there.
    assert limit.allow(b"a", 0.0, 400) and limit.wait(b"a", 0.0, 250) == 2.5
    assert not limit.allow(b"a", 2.0, 250) and limit.allow(b"a", 2.5, 250)


def test_hedged_requests_wait_longer_when_answers_come_slowly() -> None:
    hedge = Hedge(floor=0.25, cap=1.25)
    assert hedge.delay == 0.25 and hedge.smoothed is None
    for _ in range(20):
        hedge.observe(0.004)  # quick answers: the floor
    assert hedge.delay == 0.25
    for _ in range(3):
        hedge.observe(0.2)  # slower answers: three times the smoothed time
    assert hedge.smoothed is not None and 0.08 < hedge.smoothed < 0.2
    assert hedge.delay == pytest.approx(3 * hedge.smoothed)
    for _ in range(30):
        hedge.observe(5.0)  # overloaded: never beyond the cap
    assert hedge.delay == 1.25
    for _ in range(60):
        hedge.observe(0.001)  # it comes back down
    assert hedge.delay == 0.25
    hedge.observe(-1.0)  # a clock step backwards counts as an instant answer
    assert hedge.smoothed is not None and hedge.smoothed >= 0


@given(st.lists(st.floats(0, 100, allow_nan=False), max_size=50),
       st.floats(0.01, 1), st.floats(0, 10))
def test_a_hedge_stays_between_its_floor_and_cap(times: list[float], floor: float,
                                                 cap: float) -> None:
    hedge = Hedge(floor=floor, cap=cap)
    for seconds in times:
        hedge.observe(seconds)
        assert floor <= hedge.delay <= max(cap, floor)
