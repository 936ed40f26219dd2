"""Chain rules: appends, tampering, forks, locators and the ancestor search."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ketten import (
    AncestorSearch,
    BrokenLink,
    Chain,
    DecodeError,
    Event,
    Identity,
    InvalidEvent,
    InvalidSignature,
    Placement,
    Verify,
    WriterNotAllowed,
    check_successor,
    choose_branch,
    classify,
    criterion_key,
    highest_match,
    make_locator,
    scan_encoded_chain,
)
from ketten._core.chain import WriterPolicy, check_run

ALICE = Identity.from_seed(b"\x0a" * 32)
BOB = Identity.from_seed(b"\x0b" * 32)
KEY = criterion_key("chain-tests")


def build(length: int, *, author: Identity = ALICE, base: list[Event] | None = None,
          tag: bytes = b"", writers: list[bytes] | None = None) -> list[Event]:
    events = list(base or [])
    while len(events) < length:
        seq = len(events)
        events.append(Event.create(
            author, criterion=KEY, seq=seq, prev=events[-1].hash if events else None,
            payload=tag + b"%d" % seq, time=seq, writers=writers if seq == 0 else None,
        ))
    return events


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40))
def test_valid_chains_are_accepted(length: int) -> None:
    events = build(length)
    chain = Chain(KEY, events=events)
    assert chain.height == length
    assert chain.head == events[-1]
    scanned = list(scan_encoded_chain((e.to_bytes() for e in events), verify=Verify.FULL))
    assert [h for _, h, _ in scanned] == [e.hash for e in events]


CHAIN = build(12)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(CHAIN) - 1), st.data())
def test_any_tampered_byte_is_rejected(index: int, data: st.DataObject) -> None:
    raw = bytearray(CHAIN[index].to_bytes())
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= 1 << data.draw(st.integers(0, 7))
    encoded = [e.to_bytes() for e in CHAIN]
    encoded[index] = bytes(raw)
    with pytest.raises((DecodeError, InvalidEvent)):
        list(scan_encoded_chain(encoded, verify=Verify.FULL))
    try:
        tampered = Event.from_bytes(bytes(raw))
    except DecodeError:
        return
    chain = Chain(KEY, events=CHAIN[:index])
    with pytest.raises(InvalidEvent):
        chain.append(tampered)
        # A tampered event that still fits its place breaks the next link.
        if index + 1 < len(CHAIN):
            chain.append(CHAIN[index + 1])
        else:
            tampered.verify()


def test_link_rules() -> None:
    events = build(3)
    check_successor(None, events[0])
    check_successor(events[0], events[1])
    with pytest.raises(BrokenLink, match="first event"):
        check_successor(None, events[1])
    with pytest.raises(BrokenLink, match="cannot follow"):
        check_successor(events[0], events[2])
    other = build(2, tag=b"other")
    with pytest.raises(BrokenLink, match="does not link"):
        check_successor(events[0], other[1])
    # links only: a bad signature passes, full: it does not
    forged = Event.from_bytes(events[1].to_bytes()[:-64] + b"\x00" * 64)
    check_successor(events[0], forged, verify=Verify.LINKS)
    with pytest.raises(InvalidSignature):
        check_successor(events[0], forged, verify=Verify.FULL)


def test_writer_policy_from_genesis() -> None:
    events = build(2, writers=[ALICE.public_key])
    chain = Chain(KEY, events=events)
    intruder = Event.create(BOB, criterion=KEY, seq=2, prev=events[1].hash, payload=b"", time=0)
    with pytest.raises(WriterNotAllowed):
        chain.append(intruder)
    assert chain.policy is not None and chain.policy.allows(ALICE.public_key)
    # the same event on an open chain is fine
    open_chain = Chain(KEY, events=build(2))
    ok = Event.create(BOB, criterion=KEY, seq=2, prev=open_chain.head.hash, payload=b"", time=0)  # type: ignore[union-attr]
    open_chain.append(ok)
    encoded = [e.to_bytes() for e in [*events, intruder]]
    with pytest.raises(WriterNotAllowed):
        list(scan_encoded_chain(encoded, verify=Verify.FULL))
    assert len(list(scan_encoded_chain(encoded, verify=Verify.LINKS))) == 3


def test_a_run_of_events_must_follow_its_predecessor_and_its_writers() -> None:
    events = build(4, writers=[ALICE.public_key])
    policy = WriterPolicy.of(events[0])
    check_run(KEY, None, events, policy=None)  # the genesis sets the policy
    check_run(KEY, events[1], events[2:], policy=policy)
    check_run(KEY, (1, events[1].hash), events[2:], policy=policy)
    with pytest.raises(BrokenLink, match="seq 3 does not follow seq 1"):
        check_run(KEY, events[1], [events[3]], policy=policy)
    with pytest.raises(BrokenLink, match="does not follow"):
        check_run(KEY, (1, b"\0" * 32), events[2:], policy=policy)
    with pytest.raises(BrokenLink, match="another criterion"):
        check_run(criterion_key("elsewhere"), events[1], events[2:], policy=policy)
    intruder = Event.create(BOB, criterion=KEY, seq=4, prev=events[3].hash, payload=b"",
                            time=0)
    with pytest.raises(WriterNotAllowed, match="seq 4"):
        check_run(KEY, None, [*events, intruder], policy=None)
    check_run(KEY, events[3], [intruder], policy=None)  # an open chain
    check_run(KEY, events[3], [intruder], policy=policy, verify=Verify.LINKS)
    forged = Event.from_bytes(events[2].to_bytes()[:-64] + b"\x00" * 64)
    check_run(KEY, events[1], [forged], policy=policy, verify=Verify.LINKS)
    with pytest.raises(InvalidSignature):
        check_run(KEY, events[1], [forged], policy=policy)


def test_classify_and_forks() -> None:
    ours = build(6)
    theirs = build(8, base=ours[:3], tag=b"b")
    chain = Chain(KEY, events=ours)
    assert classify(chain, ours[4]) is Placement.PRESENT
    assert classify(chain, theirs[4]) is Placement.FORK
    assert classify(chain, theirs[7]) is Placement.GAP
    assert classify(chain, theirs[6]) is Placement.FOREIGN
    assert classify(Chain(KEY), ours[0]) is Placement.APPEND
    fork = chain.fork_with(theirs[3])
    assert fork is not None and fork.seq == 3 and fork.ours == ours[3]
    assert chain.fork_with(ours[3]) is None


def test_replay_view_truncate() -> None:
    events = build(10)
    chain = Chain(KEY, events=events)
    assert list(chain.replay(7)) == events[7:]
    view = chain.view(events[4].hash)
    assert view.height == 5 and view.head == events[4]
    with pytest.raises(KeyError):
        chain.view(b"\x00" * 32)
    removed = chain.truncate(6)
    assert removed == events[6:] and chain.head == events[5]
    assert chain.seq_of(events[7].hash) is None


def test_locator_is_logarithmic() -> None:
    loc = make_locator(lambda s: s.to_bytes(32, "big"), low=0, high=100_000)
    seqs = [s for s, _ in loc]
    assert seqs[0] == 100_000 and seqs[-1] == 0
    assert seqs == sorted(seqs, reverse=True)
    assert len(seqs) < 8 + 20


def brute_force_ancestor(a: list[Event], b: list[Event]) -> int | None:
    last = None
    for x, y in zip(a, b):
        if x.hash != y.hash:
            break
        last = x.seq
    return last


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 300), st.integers(0, 60), st.integers(0, 60), st.booleans())
def test_ancestor_search_agrees_with_brute_force(
    common: int, extra_a: int, extra_b: int, different_genesis: bool
) -> None:
    base = build(common) if not different_genesis else []
    a = build(common + extra_a, base=base, tag=b"a")
    b = build(common + extra_b, base=base, tag=b"b")
    if not a:
        return
    peer = Chain(KEY, verify=Verify.NONE, events=b)
    search = AncestorSearch(lambda s: a[s].hash, len(a))
    while not search.done:
        search.feed(highest_match(search.next_locator(), peer.seq_of))
        assert search.rounds <= 64
    assert search.result == brute_force_ancestor(a, b)
    # O(log n) rounds
    assert search.rounds <= 2 + (len(a).bit_length())


def test_ancestor_search_rejects_unoffered_match() -> None:
    a = build(50)
    search = AncestorSearch(lambda s: a[s].hash, len(a))
    search.next_locator()
    with pytest.raises(DecodeError, match="not offered"):
        search.feed(17_000)


def test_choose_branch_is_deterministic() -> None:
    h1, h2, h3 = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
    assert choose_branch({h1: 1, h2: 2}, {h1: 9, h2: 3}) == h2
    assert choose_branch({h1: 2, h2: 2}, {h1: 3, h2: 5}) == h2
    assert choose_branch({h3: 1, h1: 1}, {h1: 4, h3: 4}) == h1
