"""The sans-IO Kademlia pieces: ids, routing table (Hypothesis) and the lookup."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ketten.errors import UsageError
from ketten.interfaces import Peer
from ketten.plugins.kademlia._ids import (
    ID_BITS,
    Contact,
    bucket_index,
    id_in_bucket,
    leading_zero_bits,
    puzzle_ok,
    solve_puzzle,
)
from ketten.plugins.kademlia._lookup import Lookup
from ketten.plugins.kademlia._routing import Outcome, RoutingTable


def contact(seed: int) -> Contact:
    key = hashlib.sha256(b"key%d" % seed).digest()
    return Contact.of(Peer(f"mem:{seed}", key))


def near(own: int, bits: int, seed: int) -> Contact:
    """A contact whose id shares at least ``bits`` leading bits with ``own`` (fake key)."""
    rng = random.Random(seed)
    node_id = id_in_bucket(own, bits, rng)
    return Contact(node_id, Peer(f"fake:{seed}", rng.randbytes(32)))


ids = st.integers(min_value=0, max_value=2**ID_BITS - 1)


@given(ids, st.integers(min_value=0, max_value=ID_BITS - 1), st.integers(0, 2**32))
def test_id_in_bucket_has_exact_prefix(own: int, index: int, seed: int) -> None:
    assert bucket_index(own, id_in_bucket(own, index, random.Random(seed))) == index


def test_puzzle() -> None:
    assert leading_zero_bits(b"\x00\x0f") == 12
    identity = solve_puzzle(6, random.Random(1))
    assert puzzle_ok(identity.node_id, 6)
    assert leading_zero_bits(hashlib.sha256(identity.node_id).digest()) >= 6
    unsolved = next(c for c in map(contact, range(100)) if not puzzle_ok(c.node_id, 6))
    table = RoutingTable(contact(1000).id, difficulty=6)
    assert table.observe(unsolved, 0.0).outcome is Outcome.REFUSED
    assert unsolved.id not in table


def test_own_id_is_refused() -> None:
    me = contact(1)
    table = RoutingTable(me.id)
    assert table.observe(me, 0.0).outcome is Outcome.REFUSED
    assert len(table) == 0


def test_only_siblings_not_heard_from_lately_need_a_ping() -> None:
    me = contact(1)
    table = RoutingTable(me.id)
    others = [contact(n) for n in range(2, 8)]
    for n, c in enumerate(others):
        table.observe(c, float(n))
    siblings = table.siblings()
    assert table.unheard_siblings(0.0) == []
    assert table.unheard_siblings(100.0) == siblings
    table.observe(siblings[0], 50.0)  # it spoke up (say, pinged us) since
    assert table.unheard_siblings(10.0) == [c for c in siblings if c != siblings[0]]
    assert table.unheard_siblings(3.0) == [c for c in siblings
                                           if c != siblings[0] and others.index(c) < 3]


class TableMachine(RuleBasedStateMachine):
    """The table against a model: the set of contacts observed and not removed."""

    @initialize(own=ids, k=st.integers(1, 4), siblings=st.integers(0, 5))
    def setup(self, own: int, k: int, siblings: int) -> None:
        self.own = own
        self.table = RoutingTable(own, k=k, sibling_size=siblings, stale_after=2)
        self.known: dict[int, Contact] = {}
        self.pinging: dict[int, int] = {}
        self.now = 0.0

    def _candidate(self, bits: int, seed: int) -> Contact:
        return near(self.own, bits, seed)

    @rule(bits=st.integers(0, 8), seed=st.integers(0, 40))
    def observe(self, bits: int, seed: int) -> None:
        c = self._candidate(bits, seed)
        self.now += 1
        was_in = c.id in self.table
        bucketed = {b.id for i in range(ID_BITS) for b in self.table.bucket(i)}
        seen = self.table.observe(c, self.now)
        index = bucket_index(self.own, c.id)
        if self.pinging.get(index) == c.id and c in self.table.bucket(index):
            del self.pinging[index]  # seen alive: the check is settled
        if was_in:
            assert seen.outcome in (Outcome.UPDATED, Outcome.CACHED)
        elif seen.outcome is Outcome.ADDED:
            assert c.id in self.table
        else:
            assert seen.outcome is Outcome.CACHED and c.id not in self.table
            assert c in self.table.replacements(bucket_index(self.own, c.id))
        if seen.ping is not None:
            index = bucket_index(self.own, seen.ping.id)
            assert index not in self.pinging, "one outstanding ping per bucket"
            assert seen.ping == self.table.bucket(index)[0], "the least-recently seen is pinged"
            self.pinging[index] = seen.ping.id
        if c.id in self.table:
            self.known[c.id] = c
        dropped = set(self.known) - {x.id for x in self.table.contacts()}
        assert not dropped & bucketed, "only sibling-only entries leave on a newcomer"
        for node_id in dropped:
            del self.known[node_id]

    @precondition(lambda self: self.pinging)
    @rule(data=st.data(), alive=st.booleans())
    def answer_ping(self, data: st.DataObject, alive: bool) -> None:
        index = data.draw(st.sampled_from(sorted(self.pinging)))
        node_id = self.pinging.pop(index)
        self.now += 1
        if alive and node_id in self.known:
            self.table.observe(self.known[node_id], self.now)
            assert self.table.bucket(index)[-1].id == node_id
        else:
            waiting = bool(self.table.replacements(index))
            promoted = self.table.failed(node_id, self.now)
            if waiting:
                assert node_id not in self.table or node_id not in {
                    c.id for c in self.table.bucket(index)}
            if promoted is not None:
                assert promoted.id in self.table
                self.known[promoted.id] = promoted
            if node_id not in self.table:
                self.known.pop(node_id, None)

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        node_id = data.draw(st.sampled_from(sorted(self.known)))
        self.now += 1
        promoted = self.table.failed(node_id, self.now)
        for index, pinged in list(self.pinging.items()):
            if pinged == node_id:
                del self.pinging[index]
        if node_id not in self.table:
            del self.known[node_id]
        if promoted is not None:
            self.known[promoted.id] = promoted

    @rule(key=ids, count=st.integers(0, 30))
    def closest_is_brute_force(self, key: int, count: int) -> None:
        got = self.table.closest(key, count)
        everything = sorted(self.table.contacts(), key=lambda c: c.id ^ key)
        assert got == everything[:count]

    @invariant()
    def consistent(self) -> None:
        table = self.table
        present = {c.id for c in table.contacts()}
        assert self.own not in present
        assert present == set(self.known)
        in_buckets: set[int] = set()
        for index in range(ID_BITS):
            bucket = table.bucket(index)
            assert len(bucket) <= table.k
            for c in bucket:
                assert bucket_index(self.own, c.id) == index
                in_buckets.add(c.id)
            assert len(table.replacements(index)) <= table.k
            assert not {c.id for c in table.replacements(index)} & {c.id for c in bucket}
        siblings = [c.id for c in table.siblings()]
        assert len(siblings) <= table.sibling_size
        assert siblings == sorted(siblings, key=lambda i: i ^ self.own)
        assert present == in_buckets | set(siblings)
        # the sibling list holds the nearest known nodes to the own id
        nearest = sorted(present, key=lambda i: i ^ self.own)[: len(siblings)]
        assert siblings == nearest


TableMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40,
                                          deadline=None)
test_routing_table_state_machine = TableMachine.TestCase


@given(st.lists(st.integers(0, 400), unique=True, max_size=120), ids)
def test_nonfull_buckets_keep_everyone(seeds: list[int], own: int) -> None:
    table = RoutingTable(own, k=20, sibling_size=0)
    contacts = [contact(s) for s in seeds]
    for i, c in enumerate(contacts):
        table.observe(c, float(i))
    by_bucket: dict[int, list[Contact]] = {}
    for c in contacts:
        by_bucket.setdefault(bucket_index(own, c.id), []).append(c)
    for index, members in by_bucket.items():
        # ping-before-evict: the first k stay, newcomers wait as replacements
        assert table.bucket(index) == members[:20]
        assert table.replacements(index) == members[20:][-20:]


def test_refresh_and_touch() -> None:
    own = contact(0).id
    table = RoutingTable(own)
    for s in range(1, 50):
        table.observe(contact(s), 0.0)
    stale = table.stale_buckets(10.0, 100.0)
    assert stale == list(range(max(stale) + 1))
    target = table.refresh_target(3, random.Random(1))
    table.touch(target, 10.0)
    assert 3 not in table.stale_buckets(50.0, 100.0)
    assert 3 in table.stale_buckets(110.0, 100.0)


def test_a_join_refreshes_only_buckets_its_own_lookup_did_not_complete() -> None:
    own = contact(0).id
    network = [contact(s) for s in range(1, 400)]
    table = RoutingTable(own, k=8)
    for c in network:
        table.observe(c, 0.0)
    closest = sorted(network, key=lambda c: c.id ^ own)[:8]
    farthest = bucket_index(own, closest[-1].id)
    before = table.stale_buckets(10.0, 100.0)
    assert max(before) > farthest + 1
    table.joined(closest, 10.0)
    # Every node of a deeper bucket is nearer than the 8th closest: it was found.
    assert all(c in closest for c in network if bucket_index(own, c.id) > farthest)
    assert table.stale_buckets(10.0, 100.0) == list(range(farthest + 1))
    # A lookup that found fewer than k nodes proves nothing about any bucket.
    fresh = RoutingTable(own, k=8)
    for c in network:
        fresh.observe(c, 0.0)
    fresh.joined(closest[:7], 10.0)
    assert fresh.stale_buckets(10.0, 100.0) == before


# -- lookup ------------------------------------------------------------------


class Network:
    """Tiny synchronous network: every node knows every other (for lookup unit tests)."""

    def __init__(self, size: int) -> None:
        self.contacts = [contact(s) for s in range(size)]

    def answer(self, node_id: int, target: int, k: int) -> list[Contact]:
        return sorted((c for c in self.contacts if c.id != node_id),
                      key=lambda c: c.id ^ target)[:k]


def drive(lookup: Lookup, net: Network, seeds: list[Contact], dead: set[int] = frozenset(),  # type: ignore[assignment]
          ) -> int:
    queue = list(lookup.start(seeds))
    rounds = 0
    while queue:
        rounds += 1
        query = queue.pop(0)
        node_id = query.contact.id
        if node_id in dead:
            queue.extend(lookup.on_failure(node_id))
        else:
            queue.extend(lookup.on_reply(node_id, net.answer(node_id, lookup.target, lookup.k)))
    assert lookup.finished
    return rounds


@pytest.mark.parametrize("paths", [1, 3])
def test_lookup_finds_the_closest_and_skips_the_dead(paths: int) -> None:
    net = Network(300)
    rng = random.Random(4)
    me = net.contacts[0]
    for _ in range(20):
        target = rng.getrandbits(256)
        dead = {c.id for c in rng.sample(net.contacts[1:], 30)}
        lookup = Lookup(target, me.id, k=8, alpha=3, paths=paths)
        drive(lookup, net, rng.sample(net.contacts[1:], 10), dead)
        live = [c for c in net.contacts[1:] if c.id not in dead]
        assert lookup.result(5) == sorted(live, key=lambda c: c.id ^ target)[:5]
        assert me not in lookup.result(100)
        stats = lookup.statistics()
        assert stats.failures == len(dead & set(lookup._tried))
        assert stats.answered + stats.failures == stats.queries


def test_disjoint_paths_never_share_a_node() -> None:
    net = Network(200)
    lookup = Lookup(12345, net.contacts[0].id, k=6, alpha=2, paths=4)
    queried: list[tuple[int, int]] = []
    queue = list(lookup.start(net.contacts[1:40]))
    while queue:
        query = queue.pop()
        queried.append((query.contact.id, query.path))
        queue.extend(lookup.on_reply(query.contact.id, net.answer(query.contact.id, 12345, 6)))
    nodes = [node for node, _ in queried]
    assert len(nodes) == len(set(nodes))
    assert len({path for _, path in queried}) == 4


def test_lookup_ignores_unknown_and_repeated_answers() -> None:
    net = Network(50)
    lookup = Lookup(7, net.contacts[0].id, k=4, alpha=1)
    (query,) = lookup.start(net.contacts[1:5])
    assert lookup.on_reply(123, []) == []
    lookup.on_reply(query.contact.id, [])
    assert lookup.on_reply(query.contact.id, net.contacts) == []
    assert lookup.on_failure(query.contact.id) == []


def test_lookup_without_seeds_finishes_empty() -> None:
    lookup = Lookup(1, 2)
    assert lookup.start([]) == [] and lookup.finished and lookup.result(3) == []
    with pytest.raises(UsageError):
        lookup.start([])
    with pytest.raises(UsageError):
        Lookup(1, 2, paths=0)


@pytest.mark.parametrize("liars_first", [False, True])
@pytest.mark.parametrize("paths", [1, 3])
def test_liars_naming_keys_at_trap_addresses_cannot_hide_them(paths: int,
                                                              liars_first: bool) -> None:
    """A tenth of the nodes lie: they name the real closest keys at trap addresses of
    their own (where nobody answers with those keys), answering in random order or
    before everyone else. Each path tries the other addresses it heard for a key, so
    the lookup still finds the real closest nodes, each at its real address."""
    net = Network(300)
    rng = random.Random(9)
    me = net.contacts[0]
    real = {c.id: c.peer.address for c in net.contacts}
    liars = {c.id for c in rng.sample(net.contacts[1:], 30)}
    honest = [c for c in net.contacts[1:] if c.id not in liars]
    for _ in range(40):
        target = rng.getrandbits(256)

        def lie(node_id: int, target: int = target) -> list[Contact]:
            return [Contact(c.id, Peer(f"trap:{node_id}:{c.id % 97}", c.peer.public_key))
                    for c in net.answer(node_id, target, 8)]

        lookup = Lookup(target, me.id, k=8, alpha=3, paths=paths)
        queue = list(lookup.start(rng.sample(net.contacts[1:], 8)))
        while queue:
            if liars_first:
                queue.sort(key=lambda q: q.contact.id not in liars)
            query = queue.pop(0 if liars_first else rng.randrange(len(queue)))
            node_id = query.contact.id
            if query.contact.peer.address != real[node_id]:
                queue.extend(lookup.on_failure(node_id))  # nobody with that key answers there
            elif node_id in liars:
                queue.extend(lookup.on_reply(node_id, lie(node_id)))
            else:
                queue.extend(lookup.on_reply(node_id, net.answer(node_id, target, 8)))
        assert lookup.finished
        found = [c for c in lookup.result(30) if c.id not in liars][:4]
        assert found == sorted(honest, key=lambda c: c.id ^ target)[:4]
        assert all(c.peer.address == real[c.id] for c in lookup.result(30))
        assert lookup.statistics().queries <= 3 * len(lookup._tried)
