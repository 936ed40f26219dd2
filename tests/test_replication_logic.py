"""The sans-IO replication rules: broker verdicts, publish tallies, fork choice."""

from __future__ import annotations

import pytest

from ketten import Event, Identity, criterion_key
from ketten._replication import (
    OtherBranch,
    Outcome,
    PublishTally,
    Verdict,
    backoff_delay,
    choose_at,
    judge_offer,
    majority,
    pick_base,
)

ALICE = Identity.from_seed(b"\1" * 32)
BOB = Identity.from_seed(b"\2" * 32)
KEY = criterion_key("logic")


def chain(n: int, who: Identity = ALICE, *, start: Event | None = None,
          tag: bytes = b"") -> list[Event]:
    out: list[Event] = []
    prev = start
    for _ in range(n):
        event = Event.create(who, criterion=KEY, seq=0 if prev is None else prev.seq + 1,
                             prev=None if prev is None else prev.hash,
                             payload=tag + b"%d" % len(out), time=1)
        out.append(event)
        prev = event
    return out


def test_majority_of_r() -> None:
    assert [majority(r) for r in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


class TestJudgeOffer:
    def test_genesis_of_an_unknown_criterion_is_appended(self) -> None:
        (genesis,) = chain(1)
        assert judge_offer(genesis, head=None, at_seq=None, by_command=None) == (
            Verdict.APPEND, None)

    def test_successor_of_the_head_is_appended(self) -> None:
        a, b = chain(2)
        assert judge_offer(b, head=a, at_seq=None, by_command=None)[0] is Verdict.APPEND

    def test_an_event_already_held_is_acknowledged(self) -> None:
        a, b = chain(2)
        assert judge_offer(a, head=b, at_seq=a, by_command=None) == (Verdict.PRESENT, a)

    def test_another_event_at_the_position_is_stale(self) -> None:
        a, b = chain(2)
        (rival,) = chain(1, BOB)
        assert judge_offer(rival, head=b, at_seq=a, by_command=None) == (Verdict.STALE, b)

    def test_a_missing_predecessor_means_sync_first_then_abstain(self) -> None:
        events = chain(4)
        assert judge_offer(events[3], head=events[0], at_seq=None,
                           by_command=None)[0] is Verdict.SYNC
        assert judge_offer(events[3], head=events[0], at_seq=None, by_command=None,
                           synced=True)[0] is Verdict.BEHIND
        assert judge_offer(events[1], head=None, at_seq=None, by_command=None)[0] is Verdict.SYNC

    def test_a_successor_of_another_branch_syncs_then_is_stale(self) -> None:
        a, b = chain(2)
        rival = chain(1, BOB, start=a)[0]
        after_rival = chain(1, BOB, start=rival)[0]
        assert judge_offer(after_rival, head=b, at_seq=None, by_command=None)[0] is Verdict.SYNC
        assert judge_offer(after_rival, head=b, at_seq=None, by_command=None,
                           synced=True)[0] is Verdict.STALE

    def test_a_command_already_applied(self) -> None:
        (a,) = chain(1)
        first = Event.create(ALICE, criterion=KEY, seq=1, prev=a.hash, payload=b"pay",
                             time=1, command=5)
        again = Event.create(ALICE, criterion=KEY, seq=2, prev=first.hash, payload=b"pay",
                             time=2, command=5)
        other = Event.create(ALICE, criterion=KEY, seq=2, prev=first.hash, payload=b"more",
                             time=2, command=5)
        assert judge_offer(again, head=first, at_seq=None, by_command=first) == (
            Verdict.PRESENT, first)
        assert judge_offer(other, head=first, at_seq=None, by_command=first) == (
            Verdict.REUSED, first)


class TestPublishTally:
    brokers = (b"a", b"b", b"c")

    def test_a_majority_of_acks_wins(self) -> None:
        tally = PublishTally(self.brokers, 3)
        assert tally.start_round() == list(self.brokers)
        tally.ack(b"a", b"H")
        assert not tally.decided()
        tally.ack(b"b", b"H")
        assert tally.decided() and tally.outcome() is Outcome.DONE
        assert tally.winner() == (b"H", None)

    def test_acks_count_per_held_event(self) -> None:
        tally = PublishTally(self.brokers, 3)
        tally.ack(b"a", b"H")
        tally.ack(b"b", b"OLD")
        tally.stale(b"c", None)
        assert tally.outcome() is Outcome.STALE

    def test_acks_accumulate_across_rounds(self) -> None:
        tally = PublishTally(self.brokers, 3)
        tally.start_round()
        tally.ack(b"a", b"H")
        assert tally.outcome() is Outcome.RETRY
        assert tally.start_round() == [b"b", b"c"]
        tally.ack(b"c", b"H")
        assert tally.outcome() is Outcome.DONE
        assert tally.reachable == 2

    def test_a_stale_majority_decides_early(self) -> None:
        tally = PublishTally(self.brokers, 3)
        tally.stale(b"a", None)
        assert not tally.decided()
        tally.stale(b"b", None)
        assert tally.decided() and tally.outcome() is Outcome.STALE

    def test_invalid_needs_a_majority(self) -> None:
        tally = PublishTally(self.brokers, 3)
        tally.invalid(b"a", "writer-not-allowed", "no")
        tally.ack(b"b", b"H")
        assert tally.outcome() is Outcome.RETRY
        tally.invalid(b"c", "writer-not-allowed", "no")
        assert tally.outcome() is Outcome.INVALID
        assert tally.invalid_reason == ("writer-not-allowed", "no")

    def test_one_proof_of_reuse_is_enough(self) -> None:
        (proof,) = chain(1)
        tally = PublishTally(self.brokers, 3)
        tally.reused(b"a", proof)
        assert tally.decided() and tally.outcome() is Outcome.REUSED
        assert tally.reused_event == proof

    def test_silence_is_no_answer(self) -> None:
        tally = PublishTally(self.brokers, 3)
        tally.abstain(b"a")
        assert tally.outcome() is Outcome.RETRY
        assert tally.reachable == 1


def test_pick_base_prefers_the_most_reported_head() -> None:
    _a, b = chain(2)
    longer = chain(3, BOB)
    assert pick_base([b, b, longer[2]]) == b
    assert pick_base([b, longer[2]]) == longer[2]
    assert pick_base([None, None]) is None


class TestChooseAt:
    def test_a_majority_elsewhere_wins(self) -> None:
        assert choose_at({b"p": b"X", b"q": b"X"}, own=b"Y", replication=3,
                         heights={}) == b"X"

    def test_our_majority_keeps(self) -> None:
        assert choose_at({b"p": b"Y", b"q": b"X"}, own=b"Y", replication=3,
                         heights={}) is None

    def test_no_majority_and_someone_silent_keeps_ours(self) -> None:
        assert choose_at({b"p": b"X"}, own=b"Y", replication=3, heights={}) is None

    def test_a_full_split_goes_to_the_lowest_hash(self) -> None:
        votes = {b"p": b"B", b"q": b"C"}
        assert choose_at(votes, own=b"D", replication=3, heights={b"C": 99}) == b"B"
        assert choose_at(votes, own=b"A", replication=3, heights={}) is None

    def test_a_broker_on_another_branch_blocks_the_tie_break(self) -> None:
        # It might still join our branch, which would make our event a majority.
        votes = {b"p": OtherBranch(b"p"), b"q": b"X"}
        assert choose_at(votes, own=b"Y", replication=3, heights={}) is None
        assert choose_at({b"p": OtherBranch(b"p"), b"q": b"X", b"s": b"X"}, own=b"Y",
                         replication=4, heights={}) is None
        assert choose_at({b"p": OtherBranch(b"p"), b"q": b"X", b"s": b"X"}, own=b"Y",
                         replication=3, heights={}) == b"X"

    def test_a_hash_that_looks_like_anything_counts_as_a_hash(self) -> None:
        # One hash in 256 starts with the byte "?"; it is a vote like any other.
        majority_hash = b"?" + bytes(31)
        votes = {b"p": majority_hash, b"q": majority_hash}
        assert choose_at(votes, own=b"\x01" * 32, replication=3, heights={}) == majority_hash
        assert choose_at({b"p": majority_hash, b"q": OtherBranch(b"q")}, own=majority_hash,
                         replication=3, heights={}) is None

    def test_a_commit_mark_overrides_votes(self) -> None:
        votes = {b"p": b"X", b"q": b"X"}
        assert choose_at(votes, own=b"Y", replication=3, heights={},
                         committed=b"Z") == b"Z"
        assert choose_at(votes, own=b"Y", replication=3, heights={},
                         own_committed=True) is None

    def test_behind_joins_the_best_branch(self) -> None:
        votes = {b"p": b"X", b"q": b"Y", b"s": None}
        assert choose_at(votes, own=None, replication=3, heights={b"X": 5, b"Y": 9}) == b"Y"
        assert choose_at({b"p": None}, own=None, replication=3, heights={}) is None


@pytest.mark.parametrize("attempt", [0, 1, 5, 40])
def test_backoff_is_jittered_and_capped(attempt: int) -> None:
    assert backoff_delay(attempt, 0.0) == 0.0
    bound = backoff_delay(attempt, 0.999999)
    assert bound <= 1.0
    assert backoff_delay(attempt, 0.5) == pytest.approx(bound / 2, rel=1e-5)
    if attempt < 5:
        assert bound < backoff_delay(attempt + 1, 0.999999)
