"""Operator recovery as a sans-IO object: who survives, who holds more, the new epoch."""

from __future__ import annotations

from ketten import criterion_key
from ketten._core.membership import ChainConfig, ChainState, Member
from ketten._core.messages import Route
from ketten._core.recovery import Recovery
from ketten._core.replica import Replica, Role

KEY = criterion_key("recovery")
MEMBERS = [Member(bytes([i + 1]) * 32, f"m:{i}") for i in range(7)]
OWN = MEMBERS[0]
CONFIG = ChainConfig(3, MEMBERS[:3], (), 10, 4)


def route(term: int) -> Route:
    return Route(CONFIG, term, None, None)


def test_the_members_that_answer_survive_and_the_term_rises_above_all() -> None:
    recovery = Recovery(OWN, CONFIG, 4)
    assert recovery.members_to_ask() == MEMBERS[1:3]
    assert not recovery.located(MEMBERS[1], MEMBERS[5].key, route(9)), "another node answered"
    assert not recovery.located(MEMBERS[2], MEMBERS[2].key, None), "it holds nothing"
    assert recovery.survivors() == [OWN] and recovery.new_term == 5
    assert recovery.located(MEMBERS[1], MEMBERS[1].key, route(7))
    assert recovery.survivors() == [OWN, MEMBERS[1]]
    assert recovery.new_term == 8
    recovery.compared(MEMBERS[1], holds_more=False)
    assert recovery.longer is None


def test_a_longer_copy_elsewhere_is_named() -> None:
    recovery = Recovery(OWN, CONFIG, 4)
    for member in MEMBERS[1:3]:
        assert recovery.located(member, member.key, route(4))
        recovery.compared(member, holds_more=True)
    assert recovery.longer == MEMBERS[1]


def test_the_configuration_fills_up_with_nodes_that_answer() -> None:
    recovery = Recovery(OWN, CONFIG, 4)
    recovery.located(MEMBERS[2], MEMBERS[2].key, route(6))
    assert not recovery.full()
    candidates = [MEMBERS[2], MEMBERS[4], MEMBERS[5], MEMBERS[6]]
    assert recovery.fill_from(candidates) == MEMBERS[4:7]
    assert not recovery.add(MEMBERS[4], MEMBERS[3].key), "answered as another node"
    assert recovery.add(MEMBERS[5], MEMBERS[5].key)
    assert recovery.add(MEMBERS[6], MEMBERS[6].key), "already full"
    new = recovery.configuration((41, b"h" * 32))
    assert (new.epoch, new.at, new.term, new.joint) == (4, 41, 7, False)
    assert new.voter_keys() == {OWN.key, MEMBERS[2].key, MEMBERS[5].key}
    assert recovery.configuration(None).at == -1


def test_the_recovering_replica_leads_the_new_epoch_at_once() -> None:
    replica = Replica(KEY, OWN.key, ChainState(term=4, configs=(CONFIG,)), (41, b"h" * 32))
    new = ChainConfig(4, [OWN, MEMBERS[5], MEMBERS[6]], (), 41, 7)
    state = replica.take_over(new, 7, 100.0)
    assert replica.is_leader and replica.role is Role.LEADER and replica.term == 7
    assert state.configs == (new,) and state.voted_for == OWN.key and state.log_term == 7
    assert set(replica.progress) == {MEMBERS[5].key, MEMBERS[6].key}
    assert replica.start == (41, b"h" * 32)
