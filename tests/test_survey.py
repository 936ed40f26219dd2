"""The survey core: weighing what the nodes near a key said, and what follows."""

from __future__ import annotations

import operator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ketten import ChainConfig, Identity, Member, QuorumUnavailable, criterion_key
from ketten._core.messages import Route
from ketten._core.survey import Creation, Located, Survey, conclude, tally

KEY = criterion_key("surveyed")
GOAL = int.from_bytes(KEY, "big")
NODES = [Member(Identity.from_seed(bytes([i + 1]) * 32).public_key, f"n:{i}") for i in range(8)]
NODES.sort(key=lambda m: int.from_bytes(m.node_id, "big") ^ GOAL)  # nearest first
OWN = NODES[0].key
CONFIG = ChainConfig(1, NODES[1:4])


def route(genesis: bytes, *, when: int = 10, commit: int | None = 5, epoch: int = 1) -> Route:
    config = ChainConfig(epoch, NODES[1:4])
    return Route(config, 1, NODES[1].key, None if commit is None else (commit, b"h" * 32),
                 genesis, when)


def count(answers: list[Located | None], *, own_settled: bool = True,
          local: Route | None = None, nearby: list[Member] | None = None,
          remembered: list[Member] | None = None) -> Survey:
    """Tally ``answers`` of the nodes asked other than this one (``NODES[0]``):
    the overlay's ``nearby`` (``NODES[:4]`` unless given), then ``remembered``."""
    nearby = NODES[:4] if nearby is None else nearby
    asked = nearby + [m for m in remembered or [] if m not in nearby]
    others = [m for m in asked if m.key != OWN]
    return tally(goal=GOAL, own=OWN, own_settled=own_settled, local=local, nearby=nearby,
                 asked=asked, answers=list(zip(others, answers, strict=True)),
                 replication=3, distance=operator.xor).survey


NONE = Located(None, False, True)


def test_the_best_route_is_the_older_genesis_then_the_longer_commit() -> None:
    older, newer = route(b"a" * 32, when=5), route(b"b" * 32, when=9)
    longer = route(b"a" * 32, when=5, commit=8)
    found = count([Located(newer, True, True), Located(older, True, True),
                   Located(longer, True, True)])
    assert found.route == longer and found.held and found.answered == 4


def test_a_node_without_its_hand_over_does_not_vouch_for_absence() -> None:
    unsettled = Located(None, False, False)
    found = count([unsettled, unsettled, NONE, NONE, None], remembered=NODES[4:6])
    # The two unsettled nodes are left out of the nearest; the ones behind them count.
    assert (found.answered, found.asked) == (2, 4)
    assert found.nearest == 3 and found.nearest_answered == 3  # NODES 0, 3 and 4


def test_nodes_knowing_another_genesis_are_reported_as_rivals() -> None:
    mine, theirs = route(b"a" * 32), route(b"b" * 32)
    counted = tally(goal=GOAL, own=OWN, own_settled=True, local=mine, nearby=NODES[:3],
                    asked=NODES[:3], answers=[(NODES[1], Located(theirs, True, True)),
                                              (NODES[2], Located(mine, True, True))],
                    replication=3, distance=operator.xor)
    assert counted.rivals == ((NODES[1], theirs),)


def test_conclude_returns_the_route_or_refuses_for_a_chain_known_to_exist() -> None:
    known = route(b"a" * 32)
    found = count([NONE, None, None])
    assert conclude(KEY, count([Located(known, True, True), None, None]), known=None,
                    exists=False, replication=3, overlay=True, memory=600) == known
    assert conclude(KEY, found, known=known, exists=False, replication=3, overlay=True,
                    memory=600) == known
    for held, exists in ((True, False), (False, True)):
        held_found = count([Located(None, held, True), NONE, NONE])
        with pytest.raises(QuorumUnavailable, match="exists, but none of its brokers"):
            conclude(KEY, held_found, known=None, exists=exists, replication=3,
                     overlay=True, memory=600)


def test_conclude_creates_only_when_a_majority_near_the_key_vouches_for_absence() -> None:
    assert conclude(KEY, count([NONE, NONE, None]), known=None, exists=False, replication=3,
                    overlay=True, memory=600) == Creation(tuple(NODES[:3]))
    with pytest.raises(QuorumUnavailable, match="only 1 of the 4 nodes nearest"):
        conclude(KEY, count([None, None, None]), known=None, exists=False, replication=3,
                 overlay=True, memory=600)
    # Remembered nodes nearer than the overlay's, silent: absence cannot be told.
    silent = count([NONE, NONE, NONE, None, None], nearby=[NODES[0], *NODES[3:6]],
                   remembered=NODES[1:3])
    with pytest.raises(QuorumUnavailable, match="heard from within the last 600 s"):
        conclude(KEY, silent, known=None, exists=False, replication=3, overlay=True,
                 memory=600)
    few = Survey(None, False, 1, 1, 1, 1, nearby=(NODES[0],))
    with pytest.raises(QuorumUnavailable, match="only 1 node"):
        conclude(KEY, few, known=None, exists=False, replication=3, overlay=True, memory=600)
    assert conclude(KEY, few, known=None, exists=False, replication=3, overlay=False,
                    memory=600) == Creation((NODES[0],))


answers = st.none() | st.builds(Located, st.none() | st.just(route(b"a" * 32)), st.booleans(),
                                st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(answers, min_size=5, max_size=5), st.booleans())
def test_a_creation_never_follows_an_answer_that_knew_the_chain(
        said: list[Located | None], own_settled: bool) -> None:
    found = count(said, own_settled=own_settled, remembered=NODES[4:6])
    try:
        made = conclude(KEY, found, known=None, exists=False, replication=3, overlay=True,
                        memory=600)
    except QuorumUnavailable:
        return
    if isinstance(made, Creation):
        assert not any(a is not None and (a.held or a.route is not None) for a in said)
        settled = [m for m, a in zip(NODES[1:4], said[:3], strict=True)
                   if a is not None and a.settled]
        assert len(settled) + own_settled >= 2  # a majority of the overlay's nearest
    else:
        assert made == route(b"a" * 32)
