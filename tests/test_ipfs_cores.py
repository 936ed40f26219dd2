"""The ipfs overlay's sans-IO parts: provider records, the blockstore, the chain fetch."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ketten import Event, Identity, criterion_key
from ketten.errors import UsageError
from ketten.interfaces import Peer
from ketten.ipld import event_block
from ketten.plugins.ipfs._blocks import Blockstore
from ketten.plugins.ipfs._fetch import ChainFetch, FetchRequest, Kind
from ketten.plugins.ipfs._providers import ProviderRecords, Republisher

AUTHOR = Identity.from_seed(b"\x07" * 32)


def chain(n: int, name: str = "ipfs-core", payload: bytes = b"p") -> list[Event]:
    key = criterion_key(name)
    events: list[Event] = []
    prev = None
    for seq in range(n):
        event = Event.create(AUTHOR, criterion=key, seq=seq, prev=prev,
                             payload=payload + b"%d" % seq, time=1000 + seq)
        events.append(event)
        prev = event.hash
    return events


def peer(n: int) -> Peer:
    return Peer(f"node-{n}", bytes([n]) * 32)


# -- provider records -----------------------------------------------------------

def test_provider_records_renew_expire_and_order_newest_first() -> None:
    records = ProviderRecords(ttl=10.0)
    key = b"k" * 32
    assert records.add(key, peer(1), now=0.0)
    assert records.add(key, peer(2), now=1.0)
    assert records.providers(key, now=2.0) == [peer(2), peer(1)]
    assert records.add(key, peer(1), now=5.0)  # renewed: newest again, lives to 15
    assert records.providers(key, now=6.0) == [peer(1), peer(2)]
    assert records.providers(key, now=11.0) == [peer(1)]  # peer 2 lapsed at 11
    assert records.expire(now=15.0) == 1
    assert len(records) == 0 and records.providers(key, now=15.0) == []


def test_provider_records_are_bounded_per_key_per_provider_and_in_keys() -> None:
    records = ProviderRecords(ttl=100.0, per_key=3, max_keys=4, per_provider=2)
    key = b"a" * 32
    for n in range(1, 6):
        records.add(key, peer(n), now=float(n))
    assert records.providers(key, now=10.0) == [peer(5), peer(4), peer(3)]
    # Peer 5 holds one record; a second is taken, a third refused.
    assert records.add(b"b" * 32, peer(5), now=10.0)
    assert not records.add(b"c" * 32, peer(5), now=10.0)
    assert records.refused == 1
    for n in range(10):  # more keys than max_keys: the oldest keys go
        records.add(bytes([n + 100]) * 32, peer(50 + n), now=20.0 + n)
    assert records.providers(key, now=40.0) == []
    assert len(records) == 4
    # Forgotten records no longer count against their providers.
    assert records.add(b"d" * 32, peer(5), now=40.0)


def test_republisher_announces_at_once_then_every_interval_and_retries_failures() -> None:
    republisher = Republisher(interval=100.0)
    assert republisher.provide(b"x", now=0.0)
    assert not republisher.provide(b"x", now=1.0)
    assert republisher.due(now=0.0) == [b"x"]
    assert republisher.due(now=50.0) == []
    assert republisher.next_due() == 100.0
    republisher.failed(b"x", now=50.0, retry=5.0)
    assert republisher.due(now=55.0) == [b"x"]
    republisher.stop(b"x")
    assert republisher.next_due() is None and b"x" not in republisher


# -- blockstore -----------------------------------------------------------------

def test_blockstore_links_each_block_to_the_one_before() -> None:
    events = chain(5)
    store = Blockstore()
    blocks = store.add_events(events[:3]) + store.add_events(events[3:])
    assert blocks[0].prev_binary is None
    assert all(b.prev_binary == a.binary for a, b in zip(blocks, blocks[1:], strict=False))
    assert blocks[4].binary == event_block(events[4], blocks[3].binary).binary
    assert store.tip(events[0].criterion) == blocks[-1].binary
    assert store.walk(blocks[-1].binary, 10, 1 << 20) == [b.data for b in reversed(blocks)]
    assert store.walk(blocks[-1].binary, 2, 1 << 20) == [blocks[4].data, blocks[3].data]
    assert store.walk(blocks[-1].binary, 10, 1) == [blocks[4].data]  # at least one
    assert store.strides(blocks[-1].binary, 2, 10) == [blocks[4].binary, blocks[2].binary,
                                                       blocks[0].binary]
    with pytest.raises(UsageError, match="does not follow"):
        store.add_events(events[2:3])


def test_blockstore_collects_unpinned_chains_least_recently_used_first() -> None:
    pinned, loose = chain(20, "pinned"), chain(20, "loose")
    store = Blockstore(max_bytes=1)
    store.pin(pinned[0].criterion)
    kept = store.add_events(pinned)
    store.add_events(loose)
    assert all(block.binary in store for block in kept)
    assert len(store) == 20 and store.collected == 20
    store.unpin(pinned[0].criterion)
    assert len(store) == 0 and store.size == 0
    assert store.tip(pinned[0].criterion) is None


# -- fetch ------------------------------------------------------------------------

class Provider:
    """A provider for the fetch tests: honest, holding only some blocks, lying
    (wrong bytes for every block), claiming false segment starts, or silent."""

    def __init__(self, n: int, store: Blockstore, kind: str = "honest") -> None:
        self.peer = peer(n)
        self.store = store
        self.kind = kind
        self.decoy: bytes | None = None
        if kind == "false-claims":
            # It also holds another chain, and names that chain's blocks as
            # segment starts of the one fetched (and serves them).
            length = len(store)
            self.decoy = store.add_events(chain(length, f"decoy-{n}"))[-1].binary

    def answer(self, request: FetchRequest) -> list[bytes] | None:
        if self.kind == "silent":
            return None
        if request.kind is Kind.HAVE:
            cids = self.store.strides(request.root, request.stride, request.count)
            if self.decoy is not None and cids:
                return cids[:1] + self.store.strides(self.decoy, request.stride,
                                                     request.count)[1:]
            return cids
        blocks = self.store.walk(request.root, request.count, 1 << 20)
        if blocks and self.kind != "liar":
            assert len(blocks) == 1 or request.seq >= len(blocks) - 1
        if self.kind == "liar":
            return [data[:-1] + bytes([data[-1] ^ 1]) for data in blocks]
        return blocks


def run_fetch(root: bytes, providers: list[Provider], *, segment: int = 8,
              stop_seq: int = 0, seed: int = 0) -> ChainFetch:
    """Drive a fetch to its end, answering its open requests in a seeded random order."""
    rng = random.Random(seed)
    by_key = {p.peer.public_key: p for p in providers}
    first = providers[0].store.get(root) if providers else None
    root_seq = first.event.seq if first is not None else 0
    fetch = ChainFetch(root, root_seq, [p.peer for p in providers], deadline=100.0,
                       segment=segment, stop_seq=stop_seq)
    now = 0.0
    open_requests: list[FetchRequest] = []
    while not fetch.done and fetch.error is None:
        open_requests += fetch.requests(now)
        if fetch.done or fetch.error is not None:
            break
        if not open_requests:
            now = 100.0  # nothing left to wait for: the deadline
            fetch.requests(now)
            break
        request = open_requests.pop(rng.randrange(len(open_requests)))
        fetch.answered(request, by_key[request.provider.public_key].answer(request))
        now += 0.01
    return fetch


def full_store(events: list[Event]) -> Blockstore:
    store = Blockstore()
    store.add_events(events)
    return store


def test_a_fetch_gets_the_chain_from_several_providers_in_parallel() -> None:
    events = chain(100)
    store = full_store(events)
    root = store.tip(events[0].criterion)
    assert root is not None
    providers = [Provider(n, store) for n in range(1, 5)]
    fetch = run_fetch(root, providers)
    assert [b.event for b in fetch.result] == events
    assert len(fetch.served) == 4  # every provider served some of it
    assert sum(fetch.served.values()) == 100


def test_wrong_blocks_are_rejected_and_fetched_from_another_provider() -> None:
    events = chain(40)
    store = full_store(events)
    root = store.tip(events[0].criterion)
    assert root is not None
    liar = Provider(1, store, "liar")
    fetch = run_fetch(root, [liar, Provider(2, store)])
    assert [b.event for b in fetch.result] == events
    assert fetch.rejected >= 1 and liar.peer.public_key in fetch.bad_providers
    assert liar.peer.public_key not in fetch.served


def test_false_segment_claims_cost_their_claimer_its_standing_not_the_fetch() -> None:
    events = chain(40)
    store = full_store(events)
    root = store.tip(events[0].criterion)
    assert root is not None
    claimer = Provider(1, full_store(events), "false-claims")
    fetch = run_fetch(root, [claimer, Provider(2, store)])
    assert [b.event for b in fetch.result] == events
    assert claimer.peer.public_key in fetch.bad_providers


def test_a_fetch_fails_naming_the_block_nobody_serves() -> None:
    events = chain(30)
    partial = Blockstore()
    partial.add_events(events)
    root = partial.tip(events[0].criterion)
    assert root is not None
    older = Blockstore()
    older.add_events(events[:10])
    # One provider lost the middle of the chain; the other holds only its start.
    blocks = [event_block(events[0], None)]
    for event in events[1:]:
        blocks.append(event_block(event, blocks[-1].binary))
    holey = Blockstore()
    for block in blocks[20:]:
        holey.put(block)
    fetch = run_fetch(root, [Provider(1, holey), Provider(2, older), Provider(3, partial,
                                                                                "silent")])
    assert fetch.error is not None and "no provider served block" in fetch.error


def test_a_fetch_stops_at_the_blocks_the_caller_holds() -> None:
    events = chain(50)
    store = full_store(events)
    root = store.tip(events[0].criterion)
    assert root is not None
    fetch = run_fetch(root, [Provider(1, store)], stop_seq=45)
    assert [b.event.seq for b in fetch.result] == [45, 46, 47, 48, 49]


def test_a_fetch_without_providers_fails_at_once() -> None:
    fetch = ChainFetch(b"\x01" * 36, 5, [], deadline=10.0)
    assert fetch.requests(0.0) == []
    assert fetch.error is not None


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 80), kinds=st.lists(st.sampled_from(
    ["honest", "liar", "false-claims", "silent", "holey"]), min_size=1, max_size=5),
    segment=st.integers(1, 20), seed=st.integers(0, 1000))
def test_a_fetch_returns_the_true_chain_or_fails_only_without_an_honest_holder(
        n: int, kinds: list[str], segment: int, seed: int) -> None:
    events = chain(n)
    store = full_store(events)
    root = store.tip(events[0].criterion)
    assert root is not None
    blocks = [event_block(events[0], None)]
    for event in events[1:]:
        blocks.append(event_block(event, blocks[-1].binary))
    holey = Blockstore()
    for block in blocks[n // 2:]:
        holey.put(block)
    providers = [Provider(i + 1, holey if kind == "holey" else
                          full_store(events) if kind == "false-claims" else store,
                          "honest" if kind == "holey" else kind)
                 for i, kind in enumerate(kinds)]
    fetch = run_fetch(root, providers, segment=segment, seed=seed)
    complete = "honest" in kinds
    if fetch.done:
        assert [b.event for b in fetch.result] == events
    else:
        assert not complete, fetch.error


def test_provider_records_are_bounded_in_all() -> None:
    records = ProviderRecords(ttl=100.0, per_key=5, max_records=6)
    for n in range(10):
        assert records.add(bytes([n]) * 32, peer(n + 1), now=float(n))
        assert len(records) <= 6
    for n in range(5):  # one key takes more: the oldest keys go first
        records.add(b"z" * 32, peer(100 + n), now=20.0 + n)
    assert len(records) == 6
    assert len(records.providers(b"z" * 32, now=30.0)) == 5
    assert records.providers(bytes([9]) * 32, now=30.0) == [peer(10)]
    assert records.providers(bytes([3]) * 32, now=30.0) == []


def test_the_index_serves_blocks_only_where_the_store_still_matches_it() -> None:
    from ketten.plugins.ipfs._index import ChainIndex

    events = chain(10)
    index = ChainIndex()
    assert index.extend(events[:4]) and index.extend(events[4:])
    blocks = full_store(events)
    tip = blocks.tip(events[0].criterion)
    key = events[0].criterion
    assert index.tip(key) == (tip, 9)
    served = index.blocks(key, 9, events[::-1])
    assert [b.binary for b in served] == [index.cid(key, s) for s in range(9, -1, -1)]
    assert index.strides(key, 9, tip, 4, 10) == [index.cid(key, s) for s in (9, 5, 1)]
    assert index.strides(key, 9, tip, 4, 2) == [index.cid(key, s) for s in (9, 5)]
    assert index.strides(key, 8, tip, 4, 2) == []  # not the root at that seq
    other = chain(10, payload=b"q")  # the store changed under the index
    assert index.blocks(key, 9, other[::-1]) == []
    assert not index.extend([other[3]])  # does not follow what is indexed
    assert key not in index  # indexed again from the store when next asked


def test_a_block_every_provider_failed_once_is_asked_for_again() -> None:
    events = chain(20)
    store = full_store(events)
    root = store.tip(events[0].criterion)
    assert root is not None
    flaky = Provider(1, store)
    failures = {"left": 2}
    honest_answer = flaky.answer

    def answer(request: FetchRequest) -> list[bytes] | None:
        if request.kind is Kind.WANT and failures["left"]:
            failures["left"] -= 1
            return None  # lost
        return honest_answer(request)

    flaky.answer = answer  # type: ignore[method-assign]
    fetch = run_fetch(root, [flaky], segment=30)
    assert fetch.done and [b.event for b in fetch.result] == events
    failures["left"] = 10  # more failures than rounds: a clear failure
    fetch = run_fetch(root, [flaky], segment=30)
    assert fetch.error is not None and "no provider served block" in fetch.error


def test_head_records_keep_the_newest_per_key_bounded_per_publisher_and_in_all() -> None:
    from ketten.plugins.ipfs._heads import HeadRecords

    heads = HeadRecords(ttl=100.0, max_keys=3, per_publisher=2)
    a, b = b"a" * 32, b"b" * 32
    assert heads.offer(b"k1", b"cid5", 5, b"block5", a, 0.0)
    assert not heads.offer(b"k1", b"cid4", 4, b"block4", b, 0.0)  # older: the held one stays
    held = heads.get(b"k1", 0.0)
    assert held is not None and held.seq == 5
    assert heads.offer(b"k1", b"cid6", 6, b"block6", b, 0.0)  # newer, from anyone
    assert heads.offer(b"k2", b"x", 1, b"x", b, 0.0)
    assert not heads.offer(b"k3", b"y", 1, b"y", b, 0.0)  # b holds two records already
    assert heads.refused == 1
    # Two records at one seq (a fork): the same one wins everywhere.
    assert heads.offer(b"k4", b"cid-b", 2, b"", a, 0.0)
    assert heads.offer(b"k4", b"cid-a", 2, b"", a, 0.0)
    assert not heads.offer(b"k4", b"cid-c", 2, b"", a, 0.0)
    assert heads.get(b"k4", 0.0).cid == b"cid-a"  # type: ignore[union-attr]
    for n in range(5):  # more keys than max_keys: the least recently updated go
        heads.offer(bytes([n]) * 4, b"z", 1, b"z", bytes([n]) * 32, 0.0)
    assert len(heads) == 3 and heads.get(b"k1", 0.0) is None


def test_head_records_lapse_unless_put_again() -> None:
    from ketten.plugins.ipfs._heads import HeadRecords

    heads = HeadRecords(ttl=100.0)
    a = b"a" * 32
    assert heads.offer(b"k1", b"cid5", 5, b"block5", a, 0.0)
    assert heads.offer(b"k2", b"cid1", 1, b"block1", a, 0.0)
    assert heads.offer(b"k1", b"cid5", 5, b"block5", a, 60.0)  # the same record, put again
    assert heads.get(b"k2", 99.0) is not None
    assert heads.get(b"k2", 100.0) is None  # lapsed: never renewed
    assert heads.get(b"k1", 150.0) is not None  # renewed at 60: lives to 160
    assert heads.expire(160.0) == 1 and len(heads) == 0
    # A lapsed record no longer stands in the way of an older one.
    assert heads.offer(b"k1", b"cid3", 3, b"block3", a, 200.0)
    assert heads.get(b"k1", 200.0).seq == 3  # type: ignore[union-attr]
