"""The anti-entropy digest exchange (``ketten._core.sync``) on its own: two
brokers' entries in, the chains each must pull out, no network."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ketten._core.messages import Digest, DigestReply
from ketten._core.sync import BUCKETS, MAX_FOREIGN, Digests, Entry, bucket_of

A, B = b"a" * 32, b"b" * 32

keys = st.binary(min_size=32, max_size=32)
positions = st.tuples(st.integers(0, 3), st.integers(-1, 5))


def exchange(mine: dict[bytes, tuple[int, int]], theirs: dict[bytes, tuple[int, int]],
             shared: list[bytes], a: Digests, b: Digests, *, round_: int = 1,
             activity: int = 0, their_activity: int = 0) -> tuple[list[Entry], list[Entry], bool]:
    """One round of ``a`` with ``b``: what ``a`` pulls, what ``b`` pulls, in step?"""

    def entry_a(c: bytes) -> Entry:
        return (c, *mine.get(c, (0, -1)))

    def entry_b(c: bytes) -> Entry:
        return (c, *theirs.get(c, (0, -1)))

    buckets = a.buckets_for(B, shared, activity, entry_a, peers=1, held=len(shared))
    sync = a.start(B, shared, buckets, round_, activity)
    request = Digest.from_wire(sync.request().to_wire())  # what travels
    assert not request.wanted
    reply = DigestReply(b.buckets_for(A, shared, their_activity, entry_b, peers=1, held=len(shared)))
    listing = sync.on_buckets(B, DigestReply.from_wire(reply.to_wire()), entry_a)
    if listing is None:
        return [], [], True
    listing = Digest.from_wire(listing.to_wire())
    answer, b_pulls = b.answer_listing(listing, shared, entry_b, lambda c: None)
    return list(DigestReply.from_wire(answer.to_wire()).entries), b_pulls, False


@given(st.lists(keys, unique=True, max_size=40), st.data())
def test_an_exchange_lists_every_chain_where_the_two_differ(shared: list[bytes],
                                                             data: st.DataObject) -> None:
    shared.sort()
    mine = {c: data.draw(positions) for c in shared}
    theirs = {c: (mine[c] if data.draw(st.booleans()) else data.draw(positions)) for c in shared}
    differ = {c for c in shared if mine[c] != theirs[c]}
    a_pulls, b_pulls, in_step = exchange(mine, theirs, shared, Digests(), Digests())
    assert in_step == (not differ)
    # Each side sees the other's entries of every chain in a differing bucket.
    listed = {c for c, _, _ in a_pulls}
    assert differ <= listed and differ <= {c for c, _, _ in b_pulls}
    assert {bucket_of(c) for c in listed} == {bucket_of(c) for c in differ}
    assert all(theirs[c] == (e, k) for c, e, k in a_pulls)
    assert all(mine[c] == (e, k) for c, e, k in b_pulls)


def test_a_peer_in_step_is_asked_less_often_until_something_changes() -> None:
    shared = sorted(bytes([i * 16]) + bytes(31) for i in range(4))
    same = {c: (1, 3) for c in shared}
    a, b = Digests(), Digests()
    rounds = [r for r in range(1, 10) if a.due({B: shared}, r, activity=5)
              and exchange(same, same, shared, a, b, round_=r, activity=5)[2]]
    assert rounds == [1, 2, 4, 8]
    assert a.due({B: shared}, 9, activity=6)  # a change here: at once
    ahead = {**same, shared[2]: (1, 4)}
    a_pulls, b_pulls, in_step = exchange(same, ahead, shared, a, b, round_=9, activity=6,
                                           their_activity=1)
    assert not in_step and a_pulls == [(shared[2], 1, 4)] and b_pulls == [(shared[2], 1, 3)]
    assert a.due({B: shared}, 10, activity=6)  # out of step: every round again


def test_buckets_are_worked_out_again_only_after_a_change() -> None:
    digests = Digests()
    chains = [bytes([0x10]) + bytes(31), bytes([0xF0]) + bytes(31)]
    calls: list[bytes] = []
    position = {c: (1, 0) for c in chains}

    def entry(c: bytes) -> Entry:
        calls.append(c)
        return (c, *position[c])

    first = digests.buckets_for(B, chains, 3, entry, peers=1, held=2)
    assert len(first) == BUCKETS and first[1] != bytes(16) and first[0xF] != bytes(16)
    assert all(first[i] == bytes(16) for i in range(BUCKETS) if i not in (1, 0xF))
    assert digests.fresh(B, chains, 3) and not digests.fresh(B, chains, 4)
    assert digests.buckets_for(B, chains, 3, entry, peers=1, held=2) is first
    assert len(calls) == 2  # the cached buckets cost no entry lookups
    position[chains[0]] = (1, 1)
    second = digests.buckets_for(B, chains, 4, entry, peers=1, held=2)
    assert second[1] != first[1] and second[0xF] == first[0xF]


def test_a_wrong_or_malformed_answer_ends_the_round_out_of_step() -> None:
    chains = [bytes(32)]
    for answered_by, buckets in ((A, (bytes(16),) * BUCKETS), (B, ())):
        digests = Digests()
        mine = digests.buckets_for(B, chains, 0, lambda c: (c, 1, 0), peers=1, held=1)
        sync = digests.start(B, chains, mine, 1, 0)
        assert sync.on_buckets(answered_by, DigestReply(buckets), lambda c: (c, 1, 0)) is None
        assert digests.due({B: chains}, 2, 0)  # not counted as in step
    sync = digests.start(B, chains, mine, 3, 0)
    sync.failed()
    assert digests.due({B: chains}, 4, 0)


def test_chains_a_peer_lists_that_are_not_shared_are_answered_from_elsewhere() -> None:
    shared = [bytes([0x20]) + bytes(31)]
    given_up = bytes([0x21]) + bytes(31)
    foreign = [bytes([0x22]) + i.to_bytes(31, "big") for i in range(MAX_FOREIGN + 10)]
    asked: list[bytes] = []

    def elsewhere(c: bytes) -> Entry | None:
        asked.append(c)
        return (c, 0, -1) if c == given_up else None

    listing = Digest((), (2,), ((shared[0], 1, 9), (given_up, 1, 2),
                                *((c, 1, 0) for c in foreign)))
    reply, behind = Digests.answer_listing(listing, shared, lambda c: (c, 1, 4), elsewhere)
    assert reply.entries == ((shared[0], 1, 4), (given_up, 0, -1))
    assert behind == [(shared[0], 1, 9)]
    # A long list is looked at only so far (the shared chain is among the first).
    assert len(asked) == MAX_FOREIGN - 1
