"""Lease renewals and lease list pushes as sans-IO rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ketten import DecodeError, criterion_key
from ketten._core.lease_rounds import (
    HURRY_AFTER_MS,
    RETRY_PERIOD,
    Renewal,
    RenewalPlan,
    merge_batches,
)
from ketten._core.membership import Member

SID = b"s" * 16
OWN = b"\0" * 32
PEERS = [Member(bytes([i + 1]) * 32, f"tcp://127.0.0.1:{7000 + i}") for i in range(6)]
ME = Member(OWN, "tcp://127.0.0.1:6999")
KEYS = [criterion_key(f"c{i}") for i in range(5)]


def renewal(keys: list[bytes] = KEYS, check: float = 10.0) -> Renewal:
    return Renewal(SID, tuple(keys), 30.0, check)


def test_one_request_per_broker_and_the_local_share_apart() -> None:
    brokers = {KEYS[0]: [ME, PEERS[0], PEERS[1]], KEYS[1]: [PEERS[1], PEERS[2], PEERS[0]],
               KEYS[2]: [PEERS[2], ME, PEERS[3]], KEYS[3]: [PEERS[0]], KEYS[4]: [PEERS[3]]}
    plan = renewal().plan(OWN, 5_000, brokers, live=True)
    assert plan.placed
    assert plan.local == (KEYS[0], KEYS[2])
    remote = {member.key: keys for member, keys in plan.remote}
    assert [member.key for member, _ in plan.remote] == sorted(remote)
    assert remote == {PEERS[0].key: (KEYS[0], KEYS[1], KEYS[3]),
                      PEERS[1].key: (KEYS[0], KEYS[1]),
                      PEERS[2].key: (KEYS[1], KEYS[2]),
                      PEERS[3].key: (KEYS[2], KEYS[4])}
    request = plan.request(remote[PEERS[1].key])
    assert request == {"op": "lease", "s": SID, "c": [KEYS[0], KEYS[1]], "v": 5_000,
                       "t": 30_000, "live": True}
    lease = plan.local_lease(ME, 6_000)
    assert (lease.sid, lease.subscriber, lease.address, lease.version, lease.expires,
            lease.live) == (SID, OWN, ME.address, 5_000, 36_000, True)


@pytest.mark.parametrize("missing", [None, []])
def test_a_criterion_whose_brokers_are_not_found_is_retried_soon(missing: object) -> None:
    r = renewal(KEYS[:2])
    plan = r.plan(OWN, 0, {KEYS[0]: [PEERS[0]], KEYS[1]: missing}, live=True)  # type: ignore[dict-item]
    assert not plan.placed
    assert plan.remote == ((PEERS[0], (KEYS[0],)),)
    assert r.next_in(False, 0.0) == pytest.approx(0.75 * RETRY_PERIOD)
    assert r.next_in(True, 0.0) == pytest.approx(7.5)
    assert r.next_in(True, 0.999) < 12.5
    assert renewal(check=0.2).next_in(False, 0.5) == pytest.approx(0.2)


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=20))
def test_versions_rise_whatever_the_clock_says(clock: list[int]) -> None:
    r = renewal(KEYS[:1])
    versions = [r.plan(OWN, now, {KEYS[0]: [PEERS[0]]}, live=i % 2 == 0).version
                for i, now in enumerate(clock)]
    assert all(b > a for a, b in zip(versions, versions[1:], strict=False))
    assert all(v >= now for v, now in zip(versions, clock, strict=True))


def test_notifications_count_from_the_brokers_of_this_round_and_the_one_before() -> None:
    r = renewal(KEYS[:2])
    assert not r.leased_at(KEYS[0], PEERS[0].key)  # nothing found yet: nobody counts
    r.plan(OWN, 1_000, {KEYS[0]: [PEERS[0], PEERS[1]], KEYS[1]: [PEERS[2]]}, live=True)
    assert r.leased_at(KEYS[0], PEERS[0].key) and r.leased_at(KEYS[1], PEERS[2].key)
    assert not r.leased_at(KEYS[1], PEERS[0].key)  # a broker of another criterion
    assert not r.leased_at(KEYS[0], PEERS[5].key)
    # The chain moves: the former broker still counts for one round, then not.
    r.plan(OWN, 2_000, {KEYS[0]: [PEERS[1], PEERS[3]], KEYS[1]: None}, live=True)
    assert r.leased_at(KEYS[0], PEERS[0].key) and r.leased_at(KEYS[0], PEERS[3].key)
    assert r.leased_at(KEYS[1], PEERS[2].key)  # not found this round: the last ones stay
    r.plan(OWN, 3_000, {KEYS[0]: [PEERS[1], PEERS[3]], KEYS[1]: None}, live=True)
    assert not r.leased_at(KEYS[0], PEERS[0].key) and r.leased_at(KEYS[0], PEERS[3].key)
    assert r.leased_at(KEYS[1], PEERS[2].key)


def test_a_notification_from_an_unknown_broker_hurries_the_next_round_once() -> None:
    r = renewal(KEYS[:1], check=1.0)
    assert not r.hurry(10_000)  # no round yet: the first one is on its way
    r.plan(OWN, 10_000, {KEYS[0]: [PEERS[0]]}, live=True)
    assert not r.hurry(10_000 + HURRY_AFTER_MS - 1)  # too soon after the round
    assert r.hurry(10_000 + HURRY_AFTER_MS)
    assert not r.hurry(10_000 + 5 * HURRY_AFTER_MS)  # once per round
    r.plan(OWN, 20_000, {KEYS[0]: [PEERS[0]]}, live=True)
    assert r.hurry(20_000 + HURRY_AFTER_MS)
    slow = renewal(KEYS[:1], check=10.0)  # rounds every 10 s: not before 5 s
    slow.plan(OWN, 0, {KEYS[0]: [PEERS[0]]}, live=True)
    assert not slow.hurry(4_999) and slow.hurry(5_000)


def test_a_drop_is_a_lease_that_is_not_live() -> None:
    plan = renewal(KEYS[:1]).plan(OWN, 1, {KEYS[0]: [ME]}, live=False)
    assert plan.local_lease(ME, 1).live is False
    assert plan.request([KEYS[0]])["live"] is False


def test_commit_replies_are_checked() -> None:
    keys = KEYS[:2]
    assert RenewalPlan.commits(keys, {"h": [None, [3, b"h" * 32]]}) == [None, (3, b"h" * 32)]
    for reply in ({"h": [None]}, {"h": "no"}, [], {"h": [None, [3]]}):
        with pytest.raises(DecodeError) as info:
            RenewalPlan.commits(keys, reply)
        assert "lease reply" in str(info.value)


def test_lists_are_pushed_to_each_co_broker_in_bounded_requests() -> None:
    lists = {key: [[i]] for i, key in enumerate(KEYS)}
    brokers = {key: [ME, PEERS[0]] for key in KEYS}
    brokers[KEYS[4]] = [ME, PEERS[1]]
    del brokers[KEYS[3]]  # not found this round: skipped
    batches = merge_batches(lists, brokers, OWN, 2)
    first = sorted(KEYS[:3])
    assert [(m, [list(r) for r in requests]) for m, requests in batches] == [
        (PEERS[0], [first[:2], first[2:]]),
        (PEERS[1], [[KEYS[4]]]),
    ]
    assert batches[0][1][0][KEYS[0]] == [[0]]


@given(st.dictionaries(st.sampled_from(KEYS),
                       st.lists(st.sampled_from([*PEERS, ME]), unique=True, max_size=4)),
       st.integers(1, 4))
def test_every_list_reaches_every_co_broker_once(brokers: dict[bytes, list[Member]],
                                                 chunk: int) -> None:
    lists = {key: [[key]] for key in KEYS}
    sent: list[tuple[bytes, bytes]] = []
    for member, requests in merge_batches(lists, brokers, OWN, chunk):
        assert member.key != OWN
        for request in requests:
            assert 0 < len(request) <= chunk
            sent.extend((member.key, key) for key in request)
    expected = {(m.key, key) for key, members in brokers.items() for m in members
                if m.key != OWN}
    assert sorted(sent) == sorted(expected)
