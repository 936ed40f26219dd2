"""The replica state machine, checked without trio, a network or a store.

A tiny harness plays the driver: five replicas of one chain, each with a
list of events as its store and a "disk" for its durable state, and a pool
of messages in flight that are delivered in any order, dropped or
duplicated. Random steps elect, propose, change configurations, restart
replicas and deliver messages (appends, and commit marks sent alone); after
every step the harness checks Raft's safety properties:

* at most one leader per term;
* a position once committed is committed with one event only;
* every new leader holds every committed event (leader completeness);
* no replica ever cuts a committed event it holds;
* a replica's commit mark names an event it holds.

At the end the network heals and every replica must agree with the leader
up to the commit.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ketten import Event, Identity, criterion_key
from ketten._core.election import Election, Outcome, Phase
from ketten._core.membership import ChainConfig, ChainState, Member
from ketten._core.messages import VoteResult
from ketten._core.replica import AckStatus, AppendAckData, AppendPlan, Replica, Role

KEY = criterion_key("model")
AUTHOR = Identity.from_seed(b"\7" * 32)
KEYS = [bytes([i + 1]) * 32 for i in range(5)]
MEMBERS = [Member(k, f"m:{i}") for i, k in enumerate(KEYS)]


@attrs.define(eq=False, slots=False)
class Harness:
    rng: random.Random
    replicas: list[Replica] = attrs.field(factory=list)
    stores: list[list[Event]] = attrs.field(factory=list)
    disks: list[ChainState] = attrs.field(factory=list)
    pool: list[tuple[Any, ...]] = attrs.field(factory=list)
    now: float = 0.0
    leaders: dict[int, int] = attrs.field(factory=dict)
    committed: dict[int, bytes] = attrs.field(factory=dict)
    payloads: int = 0
    violations: list[str] = attrs.field(factory=list)
    elections: dict[int, Election] = attrs.field(factory=dict)
    waiting: dict[int, set[int]] = attrs.field(factory=dict)

    @classmethod
    def build(cls, seed: int) -> Harness:
        h = cls(random.Random(seed))
        first = ChainConfig(1, MEMBERS[:3], (), -1, 0)
        for key in KEYS:
            state = ChainState(configs=(first,)) if first.is_voter(key) else ChainState()
            h.replicas.append(Replica(KEY, key, state, None, election_timeout=3.0))
            h.stores.append([])
            h.disks.append(state)
        return h

    # -- helpers ---------------------------------------------------------------------

    def index(self, key: bytes) -> int:
        return KEYS.index(key)

    def persist(self, i: int) -> None:
        self.disks[i] = self.replicas[i].state
        self.note_commit(self.replicas[i].state.commit)

    def note_commit(self, pos: tuple[int, bytes] | None) -> None:
        if pos is None:
            return
        known = self.committed.setdefault(pos[0], pos[1])
        if known != pos[1]:
            self.violations.append(f"seq {pos[0]} committed twice with different events")
        # Everything below a committed event is committed too (hash links).
        for store in self.stores:
            if len(store) > pos[0] and store[pos[0]].hash == pos[1]:
                for event in store[: pos[0]]:
                    if self.committed.setdefault(event.seq, event.hash) != event.hash:
                        self.violations.append(f"seq {event.seq} committed twice")
                break

    def hashes(self, i: int, seqs: list[int]) -> dict[int, bytes]:
        store = self.stores[i]
        return {s: store[s].hash for s in seqs if 0 <= s < len(store)}

    def head(self, i: int) -> tuple[int, bytes] | None:
        store = self.stores[i]
        return None if not store else (store[-1].seq, store[-1].hash)

    # -- steps -----------------------------------------------------------------------

    def propose(self, i: int) -> None:
        r = self.replicas[i]
        if not r.is_leader:
            return
        store = self.stores[i]
        self.payloads += 1
        event = Event.create(AUTHOR, criterion=KEY, seq=len(store),
                             prev=store[-1].hash if store else None,
                             payload=b"%d" % self.payloads, time=0)
        store.append(event)
        r.local_appended((event.seq, event.hash))
        self.advance(i)

    def advance(self, i: int) -> None:
        r = self.replicas[i]
        seq = r._commit_candidate()
        if (seq is not None and seq < len(self.stores[i])
                and r.commit_to((seq, self.stores[i][seq].hash)) is not None):
            self.persist(i)

    def campaign(self, i: int, pre: bool) -> None:
        """Replica ``i`` stands, the way the replicator drives an :class:`Election`;
        without a pre-vote it is forced, as in a hand-over."""
        election = self.elections[i] = Election(KEY, force=not pre)
        self.begin(i, election)

    def begin(self, i: int, election: Election) -> None:
        step = election.begin(self.replicas[i])
        if isinstance(step, Outcome):
            return
        if step.persist is not None:
            self.persist(i)
        self.waiting[i] = {self.index(member.key) for member in step.members}
        for j in self.waiting[i]:
            self.pool.append(("vote", i, j, step.item))
        if not step.members:
            self.decide(i, election)

    def decide(self, i: int, election: Election) -> None:
        outcome = election.decide(self.replicas[i], self.now)
        if outcome is None:
            self.begin(i, election)
        elif outcome.persist is not None:
            self.became_leader(i)

    def became_leader(self, i: int) -> None:
        r = self.replicas[i]
        self.persist(i)
        term = r.term
        if self.leaders.setdefault(term, i) != i:
            self.violations.append(f"two leaders in term {term}")
        store = self.stores[i]
        for seq, value in self.committed.items():
            if seq >= len(store) or store[seq].hash != value:
                self.violations.append(f"leader {i} of term {term} lacks committed seq {seq}")
        self.advance(i)

    def send(self, i: int, j: int) -> None:
        r = self.replicas[i]
        mark = r.notice(KEYS[j])
        if mark is not None and self.rng.random() < 0.8:
            r.noticed(KEYS[j], mark)  # one way: counts as told once sent
            self.pool.append(("notice", i, j, r.term, mark))
            return
        plan = r.plan(KEYS[j], max_events=self.rng.randint(1, 4))
        if plan is None:
            return
        store = self.stores[i]
        prev = None if plan.prev < 0 else (plan.prev, store[plan.prev].hash)
        events = store[plan.first: plan.last + 1] if plan.last >= plan.first else []
        r.sent(plan)
        self.pool.append(("append", i, j, plan, prev, list(events)))

    def reconfigure(self, i: int) -> None:
        r = self.replicas[i]
        if not r.is_leader or not r.config_committed():
            return
        if len(r.state.configs) > 1:
            r.prune_configs()
            self.persist(i)
            return
        config = r.config
        assert config is not None
        head = -1 if r.head is None else r.head[0]
        if config.joint:
            new = ChainConfig(config.epoch + 1, config.voters, (), head, r.term)
        else:
            voters = self.rng.sample(MEMBERS, 3)
            if {m.key for m in voters} == config.voter_keys():
                return
            new = ChainConfig(config.epoch + 1, voters, config.voters, head, r.term)
        r.propose_config(new)
        self.persist(i)

    def restart(self, i: int) -> None:
        self.elections.pop(i, None)
        old = self.replicas[i]
        self.replicas[i] = Replica(KEY, old.own, self.disks[i], self.head(i),
                                   election_timeout=3.0)

    def vouched(self, j: int, i: int, configs: Sequence[ChainConfig]) -> bool:
        """What replica ``j``'s driver learns when it asks the others (every replica is
        near the key here) whether ``i`` is a voter it missed."""
        if not self.replicas[j].needs_voucher(KEYS[i], configs):
            return False
        return any(r.config is not None and r.config.is_voter(KEYS[i])
                   for n, r in enumerate(self.replicas) if n not in (i, j))

    def deliver(self, index: int, duplicate: bool) -> None:
        message = self.pool[index] if duplicate else self.pool.pop(index)
        kind = message[0]
        if kind == "vote":
            _, i, j, item = message
            answer = self.replicas[j].on_vote(
                KEYS[i], item.term, item.pre, item.rank, self.now, force=item.force,
                proposed=item.proposed,
                vouched=self.vouched(j, i, () if item.proposed is None else (item.proposed,)))
            if answer.state is not None:
                self.persist(j)
            self.pool.append(("voted", j, i, item,
                              VoteResult(KEY, answer.granted, answer.term)))
        elif kind == "voted":
            _, j, i, item, result = message
            election = self.elections.get(i)
            if election is None or election.phase is Phase.DONE:
                return  # a late answer to a campaign that ended
            if (item.term, item.pre) != (self.replicas[i].asked, self.replicas[i].pre):
                return  # an answer to an earlier campaign's request
            answered = election.on_reply(self.replicas[i], KEYS[j], [result])
            if answered.persist is not None:
                self.persist(i)
            self.waiting[i].discard(j)
            if answered.settled or not self.waiting[i]:
                self.decide(i, election)
        elif kind == "append":
            _, i, j, plan, prev, events = message
            follower = self.replicas[j]
            seqs = [e.seq for e in events]
            if prev is not None:
                seqs.append(prev[0])
            if plan.start is not None:
                seqs.append(plan.start[0])
            if follower.commit is not None:
                seqs.append(follower.commit[0])
            outcome = follower.on_append(KEYS[i], plan.term, plan.start, prev, events,
                                         plan.commit, plan.configs, self.now,
                                         self.hashes(j, seqs),
                                         vouched=self.vouched(j, i, plan.configs))
            store = self.stores[j]
            if outcome.truncate_from is not None:
                for seq in range(outcome.truncate_from, len(store)):
                    if self.committed.get(seq) == store[seq].hash:
                        self.violations.append(f"replica {j} cut committed seq {seq}")
                del store[outcome.truncate_from:]
            for event in outcome.append:
                assert event.seq == len(store)
                store.append(event)
            if outcome.state is not None:
                self.persist(j)
            locator_match = None
            if outcome.ack.status is AckStatus.MISMATCH:
                locator_match = -1
            self.pool.append(("acked", j, i, plan, outcome.ack, locator_match))
        elif kind == "notice":
            _, i, j, term, mark = message
            store = self.stores[j]
            held = store[mark[0]].hash if mark[0] < len(store) else None
            self.replicas[j].on_commit_notice(KEYS[i], term, mark, held)
        elif kind == "acked":
            _, j, i, plan, ack, _ = message
            leader = self.replicas[i]
            match = None
            if ack.status is AckStatus.MISMATCH:
                # The leader finds the highest seq of the follower's chain on its own.
                theirs, mine = self.stores[j], self.stores[i]
                common = [s for s in range(min(len(theirs), len(mine)))
                          if theirs[s].hash == mine[s].hash]
                match = max(common) if common else None
            seq, persist = leader.on_append_ack(KEYS[j], plan, ack, self.now,
                                                locator_match=match)
            if persist is not None:
                self.persist(i)
            if seq is not None:
                self.advance(i)

    def step(self) -> None:
        rng = self.rng
        self.now += rng.uniform(0.0, 1.5)
        roll = rng.random()
        n = len(self.replicas)
        if self.pool and roll < 0.55:
            index = rng.randrange(len(self.pool))
            if rng.random() < 0.1:
                self.pool.pop(index)  # lost
            else:
                self.deliver(index, duplicate=rng.random() < 0.05)
        elif roll < 0.65:
            i = rng.randrange(n)
            election = self.elections.get(i)
            if election is not None and election.phase is not Phase.DONE and rng.random() < 0.3:
                election.abandon(self.replicas[i])  # its time ran out
            else:
                self.campaign(i, pre=rng.random() < 0.7)
        elif roll < 0.8:
            self.propose(rng.randrange(n))
        elif roll < 0.93:
            i = rng.randrange(n)
            for j in range(n):
                if j != i:
                    self.send(i, j)
        elif roll < 0.97:
            self.reconfigure(rng.randrange(n))
        else:
            self.restart(rng.randrange(n))
        for i, r in enumerate(self.replicas):
            self.note_commit(r.state.commit)
            commit, store = r.state.commit, self.stores[i]
            # A replica's commit mark names an event it holds.
            if commit is not None and (commit[0] >= len(store)
                                       or store[commit[0]].hash != commit[1]):
                self.violations.append(f"replica {i} marks seq {commit[0]} committed "
                                       "without holding that event")

    def settle(self) -> None:
        """Heal: deliver everything, elect one leader, bring everyone in line."""
        for _ in range(2000):
            while self.pool:
                self.deliver(0, duplicate=False)
            leaders = [i for i, r in enumerate(self.replicas) if r.is_leader]
            leader = max(leaders, key=lambda i: self.replicas[i].term) if leaders else None
            if leader is None or any(r.term > self.replicas[leader].term
                                     for r in self.replicas):
                self.now += 10.0
                candidates = [i for i, r in enumerate(self.replicas) if r.is_voter()]
                self.campaign(self.rng.choice(candidates), pre=False)
                continue
            r = self.replicas[leader]
            for j in range(len(self.replicas)):
                if j != leader:
                    progress = r.progress.get(KEYS[j])
                    if progress is not None:
                        progress.inflight = False
                    self.send(leader, j)
            if not self.pool:
                self.propose(leader)
                for j in range(len(self.replicas)):
                    if j != leader:
                        self.send(leader, j)
                while self.pool:
                    self.deliver(0, duplicate=False)
                return
        raise AssertionError("the harness did not settle")


def run(seed: int, steps: int) -> Harness:
    h = Harness.build(seed)
    for _ in range(steps):
        h.step()
        if h.violations:
            break
    if not h.violations:
        h.settle()
    return h


@pytest.mark.parametrize("seed", range(200))
def test_replicas_keep_every_committed_event(seed: int) -> None:
    h = run(seed, 400)
    assert h.violations == []
    leader = next(i for i, r in enumerate(h.replicas) if r.is_leader)
    commit = h.replicas[leader].commit
    assert commit is not None
    reference = [e.hash for e in h.stores[leader][: commit[0] + 1]]
    config = h.replicas[leader].config
    assert config is not None
    for i, r in enumerate(h.replicas):
        if config.is_voter(r.own):
            assert [e.hash for e in h.stores[i][: commit[0] + 1]] == reference, (
                f"replica {i} differs from the leader below the commit")


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_replica_safety_under_any_schedule(seed: int) -> None:
    h = run(seed, 250)
    assert h.violations == []


def linked_events(count: int) -> list[Event]:
    events: list[Event] = []
    for n in range(count):
        events.append(Event.create(AUTHOR, criterion=KEY, seq=n,
                                   prev=events[-1].hash if events else None,
                                   payload=b"%d" % n, time=0))
    return events


def follower_in_line(count: int) -> tuple[ChainConfig, list[Event], Replica, dict[int, bytes]]:
    """A follower of term 1 holding ``count`` linked events, in line with that term."""
    first = ChainConfig(1, MEMBERS[:3], (), -1, 0)
    events = linked_events(count)
    follower = Replica(KEY, KEYS[1], ChainState(term=1, log_term=1, configs=(first,)),
                       (count - 1, events[-1].hash))
    return first, events, follower, {e.seq: e.hash for e in events}


def test_a_follower_in_a_new_term_is_cut_back_to_the_leaders_start() -> None:
    first, events, follower, hashes = follower_in_line(4)
    start = (1, events[1].hash)
    # The new leader's start is seq 1: seqs 2 and 3 were never committed.
    outcome = follower.on_append(KEYS[0], 2, start, start, [], None, (first,), 0.0, hashes)
    assert outcome.ack.status is AckStatus.OK
    assert outcome.truncate_from == 2
    assert follower.state.log_term == 2 and follower.head == start
    # But never below its commit mark: what it knows committed, the leader holds too.
    guarded = Replica(KEY, KEYS[1], ChainState(term=1, log_term=1, configs=(first,),
                                               commit=(2, events[2].hash)), (3, events[3].hash))
    kept = guarded.on_append(KEYS[0], 2, start, start, [], None, (first,), 0.0, hashes)
    assert kept.ack.status is AckStatus.OK and kept.truncate_from == 3
    assert guarded.state.log_term == 2 and guarded.head == (2, events[2].hash)
    # A copy that holds only committed events (kept on retiring) is in line at once:
    # the leader would otherwise cut it back to its start, forever refused.
    retired = Replica(KEY, KEYS[1], ChainState(term=1, commit=(3, events[3].hash)),
                      (3, events[3].hash))
    joined = retired.on_append(KEYS[0], 2, start, start, [], None, (first,), 0.0, hashes)
    assert joined.ack.status is AckStatus.OK and joined.truncate_from is None
    assert retired.head == (3, events[3].hash) and retired.state.log_term == 2
    # A leader whose events differ below the commit mark is refused.
    other = Event.create(AUTHOR, criterion=KEY, seq=1, prev=events[0].hash, payload=b"x",
                         time=0)
    guarded = Replica(KEY, KEYS[1], ChainState(term=1, log_term=1, configs=(first,),
                                               commit=(3, events[3].hash)), (3, events[3].hash))
    refused = guarded.on_append(KEYS[0], 2, (1, other.hash), (0, events[0].hash), [other],
                                None, (first,), 0.0, hashes)
    assert refused.ack.status is AckStatus.REFUSED
    assert refused.truncate_from is None


def test_a_leader_whose_chain_began_in_its_term_keeps_what_a_follower_knows_committed() -> None:
    # The leader was elected on an empty chain (start None) and has since committed
    # events; a former member holding them (and some tentative ones) joins again.
    first, events, _, hashes = follower_in_line(5)
    former = Replica(KEY, KEYS[1], ChainState(term=1, configs=(first,),
                                              commit=(2, events[2].hash)), (4, events[4].hash))
    outcome = former.on_append(KEYS[0], 2, None, None, [], None, (first,), 0.0, hashes)
    assert outcome.ack.status is AckStatus.OK
    assert outcome.truncate_from == 3
    assert former.head == (2, events[2].hash) and former.state.log_term == 2
    # Holding exactly its commit mark, nothing is cut.
    exact = Replica(KEY, KEYS[1], ChainState(term=1, configs=(first,),
                                             commit=(4, events[4].hash)), (4, events[4].hash))
    kept = exact.on_append(KEYS[0], 2, None, None, [], None, (first,), 0.0, hashes)
    assert kept.ack.status is AckStatus.OK and kept.truncate_from is None
    assert exact.head == (4, events[4].hash)
    # Without a commit mark everything is tentative and goes.
    bare = Replica(KEY, KEYS[1], ChainState(term=1, configs=(first,)), (4, events[4].hash))
    cleared = bare.on_append(KEYS[0], 2, None, None, [], None, (first,), 0.0, hashes)
    assert cleared.ack.status is AckStatus.OK and cleared.truncate_from == 0
    assert bare.head is None


def test_a_commit_mark_alone_waits_for_the_flush_a_configuration_does_not() -> None:
    first, events, follower, hashes = follower_in_line(3)
    follower.head = (1, events[1].hash)  # seq 2 is yet to come
    # In line with the leader: an append that moves only the commit mark is
    # acknowledged without a write of the state; the mark moved in memory.
    outcome = follower.on_append(KEYS[0], 1, None, (1, events[1].hash), [events[2]],
                                 (2, events[2].hash), (first,), 0.0, hashes)
    assert outcome.ack.status is AckStatus.OK and outcome.append == (events[2],)
    assert outcome.state is None
    assert outcome.committed == (2, events[2].hash) == follower.state.commit
    # A new configuration is written before the ack, with the mark.
    second = ChainConfig(2, MEMBERS[1:4], (), 2, 1)
    outcome = follower.on_append(KEYS[0], 1, None, (2, events[2].hash), [],
                                 (2, events[2].hash), (first, second), 0.0, hashes)
    assert outcome.state is not None and outcome.state.configs == (first, second)
    assert outcome.state.commit == (2, events[2].hash)
    # So is a new term.
    outcome = follower.on_append(KEYS[0], 2, (2, events[2].hash), (2, events[2].hash), [],
                                 (2, events[2].hash), (first, second), 0.0, hashes)
    assert outcome.state is not None and outcome.state.term == 2


def test_a_commit_mark_sent_alone_is_taken_only_from_the_leader_in_line_for_an_event_held(
) -> None:
    first, events, follower, hashes = follower_in_line(3)
    mark = (1, events[1].hash)
    # Before any append of this term the follower knows no leader.
    assert follower.on_commit_notice(KEYS[0], 1, mark, events[1].hash) is None
    follower.on_append(KEYS[0], 1, None, (2, events[2].hash), [], None, (first,), 0.0, hashes)
    assert follower.leader == KEYS[0]
    assert follower.on_commit_notice(KEYS[2], 1, mark, events[1].hash) is None  # not the leader
    assert follower.on_commit_notice(KEYS[0], 2, mark, events[1].hash) is None  # another term
    assert follower.on_commit_notice(KEYS[0], 1, mark, events[0].hash) is None  # other event
    assert follower.on_commit_notice(KEYS[0], 1, (5, b"h" * 32), None) is None  # not held
    assert follower.state.commit is None
    taken = follower.on_commit_notice(KEYS[0], 1, mark, events[1].hash)
    assert taken is not None and follower.state.commit == mark
    # An older mark (a notice overtaken by a newer one) never moves it back.
    assert follower.on_commit_notice(KEYS[0], 1, (0, events[0].hash), events[0].hash) is None
    assert follower.state.commit == mark
    # A follower not yet in line with this leader's term takes none.
    behind = Replica(KEY, KEYS[2], ChainState(term=1, log_term=0, configs=(first,)),
                     (2, events[2].hash))
    behind.role, behind.leader = Role.FOLLOWER, KEYS[0]
    assert behind.on_commit_notice(KEYS[0], 1, mark, events[1].hash) is None


def test_a_leader_sends_a_commit_mark_alone_only_when_that_is_all_it_owes() -> None:
    first = ChainConfig(1, MEMBERS[:3], (), -1, 0)
    events = linked_events(4)
    leader = Replica(KEY, KEYS[0], ChainState(term=2, configs=(first,)), (2, events[2].hash))
    leader.become_leader(0.0)
    assert leader.notice(KEYS[1]) is None  # not in line yet: it is owed a probe
    plan = leader.plan(KEYS[1])
    assert plan is not None
    leader.sent(plan)
    seq, _ = leader.on_append_ack(KEYS[1], plan, AppendAckData(
        AckStatus.OK, 2, 2, (2, events[2].hash), 1), 1.0)
    assert seq == 2
    leader.commit_to((2, events[2].hash))
    assert leader.notice(KEYS[2]) is None  # never heard from
    assert leader.notice(KEYS[1]) == (2, events[2].hash)
    leader.noticed(KEYS[1], (2, events[2].hash))
    assert leader.notice(KEYS[1]) is None and leader.plan(KEYS[1]) is None
    # Owed events go in an append (which carries the mark), never in a notice.
    leader.local_appended((3, events[3].hash))
    assert leader.notice(KEYS[1]) is None
    plan = leader.plan(KEYS[1])
    assert plan is not None and (plan.first, plan.last) == (3, 3)


def test_votes_are_given_once_per_term_and_only_to_the_up_to_date() -> None:
    first = ChainConfig(1, MEMBERS[:3], (), -1, 0)
    voter = Replica(KEY, KEYS[2], ChainState(term=3, log_term=3, configs=(first,)), (5, b"h" * 32))
    behind = (3, 4, 1)
    assert not voter.on_vote(KEYS[0], 4, False, behind, 100.0).granted
    level = (3, 5, 1)
    yes = voter.on_vote(KEYS[0], 4, False, level, 100.0)
    assert yes.granted and yes.state is not None and yes.state.voted_for == KEYS[0]
    assert not voter.on_vote(KEYS[1], 4, False, (4, 9, 1), 100.0).granted  # already voted
    assert not voter.on_vote(KEYS[3], 5, False, (9, 9, 9), 100.0).granted  # a stranger
    # A follower that heard from its leader lately refuses pre-votes.
    voter.leader, voter.heard = KEYS[0], 99.0
    assert not voter.on_vote(KEYS[1], 6, True, (9, 9, 9), 100.0).granted
    assert voter.on_vote(KEYS[1], 6, True, (9, 9, 9), 200.0).granted


def test_a_follower_grants_its_own_leader_a_later_term_at_once() -> None:
    # A leader never stands while it leads: asking for a later term, it restarted (or
    # resigned), so having heard from it just now is no reason to wait.
    first = ChainConfig(1, MEMBERS[:3], (), -1, 0)
    voter = Replica(KEY, KEYS[2], ChainState(term=3, log_term=3, configs=(first,)), (5, b"h" * 32))
    voter.leader, voter.heard = KEYS[0], 99.0
    assert not voter.on_vote(KEYS[1], 4, True, (3, 5, 1), 100.0).granted  # another one
    assert not voter.on_vote(KEYS[1], 4, False, (3, 5, 1), 100.0).granted
    assert voter.on_vote(KEYS[0], 4, True, (3, 5, 1), 100.0).granted
    assert not voter.on_vote(KEYS[0], 3, True, (3, 5, 1), 100.0).granted  # not its own term
    yes = voter.on_vote(KEYS[0], 4, False, (3, 5, 1), 100.0)
    assert yes.granted and yes.state is not None and yes.state.voted_for == KEYS[0]
    # Still only an up-to-date one: behind, it is refused and the follower stands.
    other = Replica(KEY, KEYS[2], ChainState(term=3, log_term=3, configs=(first,)), (5, b"h" * 32))
    other.leader, other.heard = KEYS[0], 99.0
    behind = other.on_vote(KEYS[0], 4, True, (3, 4, 1), 100.0)
    assert not behind.granted and behind.stand
    assert not other.on_vote(KEYS[0], 4, False, (3, 4, 1), 100.0).granted


def test_a_late_vote_request_of_its_own_term_leaves_a_leader_leading() -> None:
    # Two brokers stood for term 4 at once; the winner gets the loser's request late
    # (the network reordered it). It voted for itself in term 4 and keeps leading:
    # stepping down would leave term 4 without a leader while its followers, having
    # heard from it, take it for an idle leader and never stand.
    first = ChainConfig(1, MEMBERS[:3], (), -1, 0)
    leader = Replica(KEY, KEYS[0], ChainState(term=3, log_term=3, configs=(first,)),
                     (5, b"h" * 32))
    assert leader.begin_election(pre=False) == (4, [m for m in MEMBERS[:3] if m.key != KEYS[0]])
    leader.on_vote_answer(KEYS[1], True, 4, asked=4, pre=False)
    assert leader.elected()
    leader.become_leader(100.0)
    late = leader.on_vote(KEYS[2], 4, False, (3, 5, 1), 100.5)
    assert not late.granted and late.term == 4 and late.state is None
    assert leader.is_leader and leader.leader == KEYS[0]
    # A candidate asked by its rival in the same term stays a candidate.
    rival = Replica(KEY, KEYS[2], ChainState(term=3, log_term=3, configs=(first,)),
                    (5, b"h" * 32))
    rival.begin_election(pre=False)
    assert not rival.on_vote(KEYS[0], 4, False, (3, 5, 1), 100.5).granted
    assert rival.role is Role.CANDIDATE and rival.voting
    # A newer term still deposes the leader.
    newer = leader.on_vote(KEYS[1], 5, False, (4, 5, 1), 101.0)
    assert newer.granted and not leader.is_leader and leader.state.term == 5


def test_a_creation_of_a_known_chain_and_a_rival_chain_get_no_vote() -> None:
    proposed = ChainConfig(1, MEMBERS[:3], (), -1, 0)
    fresh = Replica(KEY, KEYS[2], ChainState(), None)
    creating = (0, -1, 1)
    refused = fresh.on_vote(KEYS[0], 1, False, creating, 0.0, proposed=proposed, exists=True)
    assert not refused.granted and refused.state is None, "never a second history"
    assert fresh.state.config is None and fresh.state.voted_for is None
    granted = fresh.on_vote(KEYS[0], 1, False, creating, 0.0, proposed=proposed)
    assert granted.granted and fresh.state.config == proposed
    # Once it holds the configuration, knowing the chain exists is no reason to refuse.
    again = Replica(KEY, KEYS[2], ChainState(term=1, configs=(proposed,)), None)
    assert again.on_vote(KEYS[1], 2, False, creating, 0.0, exists=True).granted
    # Another chain of the criterion is settled by the older genesis, never by a vote.
    level = Replica(KEY, KEYS[2], ChainState(term=3, log_term=3, configs=(proposed,)),
                    (5, b"h" * 32))
    assert not level.on_vote(KEYS[0], 4, False, (9, 9, 9), 0.0, rival=True).granted
    assert level.state.term == 3 and level.state.voted_for is None


def test_a_voter_whose_store_lost_committed_events_never_elects_a_candidate_without_them(
) -> None:
    # The voter's store lost seqs 6..9 (a damaged file, refetched later), but its
    # commit mark says 9 was committed: a candidate whose log ends before 9 would
    # lose committed events if it won, however its log compares with the damaged one.
    first = ChainConfig(1, MEMBERS[:3], (), -1, 0)
    voter = Replica(KEY, KEYS[2], ChainState(term=3, log_term=3, configs=(first,),
                                             commit=(9, b"c" * 32)), (5, b"h" * 32))
    short = (3, 7, 1)
    assert not voter.on_vote(KEYS[0], 4, True, short, 100.0).granted
    assert not voter.on_vote(KEYS[0], 4, False, short, 100.0).granted
    assert voter.state.voted_for is None
    whole = voter.on_vote(KEYS[1], 4, False, (3, 9, 1), 100.0)
    assert whole.granted


def test_a_voter_ahead_of_a_leaderless_candidate_stands_itself() -> None:
    # Elections start only when someone urges a broker; when the urged broker is
    # behind, the one that refuses it is the one that can win, so it must stand.
    first = ChainConfig(1, MEMBERS[:3], (), -1, 0)
    voter = Replica(KEY, KEYS[2], ChainState(term=1, log_term=1, configs=(first,)), (5, b"h" * 32))
    voter.leader, voter.heard = KEYS[0], 10.0
    behind = (1, 4, 1)
    answer = voter.on_vote(KEYS[1], 2, True, behind, 100.0)
    assert not answer.granted and answer.stand
    # Not while its leader is heard from, nor for a candidate that is up to date.
    assert not voter.on_vote(KEYS[1], 2, True, behind, 11.0).stand
    level = voter.on_vote(KEYS[1], 2, True, (1, 5, 1), 100.0)
    assert level.granted and not level.stand
    # A broker that is not a voter of the configuration cannot win: it does not stand.
    learner = Replica(KEY, KEYS[3], ChainState(term=1, log_term=1, configs=(first,)),
                      (5, b"h" * 32))
    assert not learner.on_vote(KEYS[1], 2, True, behind, 100.0).stand


def test_a_joint_configuration_needs_both_majorities() -> None:
    joint = ChainConfig(2, MEMBERS[2:5], MEMBERS[:3], 0, 1)
    assert not joint.quorum([KEYS[0], KEYS[1]])  # old majority only
    assert not joint.quorum([KEYS[3], KEYS[4]])  # new majority only
    assert not joint.quorum([KEYS[0], KEYS[3], KEYS[4]])  # one of the old voters
    assert joint.quorum([KEYS[0], KEYS[2], KEYS[3]])
    assert joint.quorum([KEYS[1], KEYS[2], KEYS[4]])


def test_a_plan_for_a_new_follower_probes_the_start_first() -> None:
    first = ChainConfig(1, MEMBERS[:3], (), -1, 0)
    leader = Replica(KEY, KEYS[0], ChainState(term=2, configs=(first,)), (7, b"h" * 32))
    leader.become_leader(0.0)
    plan = leader.plan(KEYS[1])
    assert isinstance(plan, AppendPlan)
    assert (plan.prev, plan.first, plan.last) == (7, 8, 7)  # no events: do you hold seq 7?
    leader.sent(plan)
    assert leader.plan(KEYS[1]) is None  # one in flight per member


def test_a_configuration_the_committed_chain_went_on_without_is_abandoned() -> None:
    members = [Member(bytes([i]) * 32, f"n:{i}") for i in range(5)]
    old = ChainConfig(1, members[:3], (), -1, 1)
    joint = ChainConfig(2, [members[0], members[3], members[4]], members[:3], 4, 2)
    learner = Replica(criterion_key("c"), members[3].key,
                      ChainState(term=2, configs=(old, joint), commit=(3, b"\0" * 32)),
                      (5, b"\1" * 32))
    # Committed in configuration 1 beyond where the joint one was made: abandoned.
    assert learner.abandoned(1, 9)
    # Not beyond it, or in a configuration at least as new: nothing to tell.
    assert not learner.abandoned(1, 4) and not learner.abandoned(2, 9)
    # A broker that knows a commit beyond the joint configuration holds it committed.
    sure = attrs.evolve(learner.state, commit=(5, b"\1" * 32))
    assert not Replica(learner.criterion, learner.own, sure, (5, b"\1" * 32)).abandoned(1, 9)
    # Nothing pending (one configuration), or the leader itself: never.
    settled = attrs.evolve(learner.state, configs=(joint,))
    assert not Replica(learner.criterion, learner.own, settled, (5, b"\1" * 32)).abandoned(1, 9)
    learner.role = Role.LEADER
    assert not learner.abandoned(1, 9)


STRANGER = b"\x66" * 32
FORGED = ChainConfig(2, [Member(STRANGER, "x:1")], (), -1, 0)
"""A configuration a stranger invents: itself the only voter."""


def test_a_stranger_carrying_its_own_configuration_cannot_lead_a_chain() -> None:
    first, events, follower, hashes = follower_in_line(3)
    before = follower.state
    head = (2, events[2].hash)
    forged = Event.create(AUTHOR, criterion=KEY, seq=3, prev=events[2].hash, payload=b"f",
                          time=0)
    for term in (before.term, before.term + 1, (1 << 63) - 1):
        outcome = follower.on_append(STRANGER, term, head, head, [forged], (3, forged.hash),
                                     (FORGED,), 0.0, hashes)
        assert outcome.ack.status is AckStatus.REFUSED
        assert "not a voter" in outcome.ack.reason
        assert outcome.append == () and outcome.state is None and outcome.committed is None
    assert follower.state == before and follower.leader is None
    assert follower.needs_voucher(STRANGER, (FORGED,))
    assert not follower.needs_voucher(KEYS[0], (first,))
    # Once nodes it trusts named the sender a voter (a configuration it missed), it follows.
    vouched = follower.on_append(STRANGER, before.term + 1, head, head, [], None, (FORGED,),
                                 0.0, hashes, vouched=True)
    assert vouched.ack.status is AckStatus.OK and follower.leader == STRANGER


def test_a_stranger_proposing_its_own_configuration_gets_no_vote_and_moves_no_term() -> None:
    first, _events, voter, _hashes = follower_in_line(3)
    before = voter.state
    rank = (before.log_term, 10, 0)
    for pre in (True, False):
        answer = voter.on_vote(STRANGER, (1 << 63) - 1, pre, rank, 100.0, force=True,
                               proposed=FORGED)
        assert not answer.granted and answer.state is None
    assert voter.state == before
    vouched = voter.on_vote(STRANGER, before.term + 1, False, rank, 100.0, force=True,
                            proposed=FORGED, vouched=True)
    assert vouched.granted
    # A broker that holds no configuration yet (a new member) still takes the proposed one.
    fresh = Replica(KEY, STRANGER, ChainState(), None)
    assert fresh.on_vote(KEYS[0], 2, False, rank, 100.0, proposed=first).granted


def test_a_voter_of_an_older_configuration_held_here_still_gets_a_vote() -> None:
    # B holds C1 and a pending C2 that leaves S out; C2 is abandoned and S, further
    # ahead, stands in C1: B must not refuse it (only strangers need a voucher).
    s_key, b_key = KEYS[0], KEYS[1]
    c1 = ChainConfig(1, MEMBERS[:3], (), -1, 1)
    c2 = ChainConfig(2, MEMBERS[1:4], (), 5, 1)
    voter = Replica(KEY, b_key, ChainState(term=2, log_term=1, configs=(c1, c2)), (5, b"h" * 32))
    assert voter.trusts(s_key) and not voter.needs_voucher(s_key, (c1,))
    assert voter.on_vote(s_key, 3, True, (2, 9, 1), 100.0, proposed=c1).granted
    answer = voter.on_vote(s_key, 3, False, (2, 9, 1), 100.0, proposed=c1)
    assert answer.granted and voter.state.term == 3


def test_a_caller_is_sent_to_a_live_leader_and_never_back_to_the_broker_it_asked() -> None:
    first = ChainConfig(1, MEMBERS[:3], (), -1, 0)
    follower = Replica(KEY, KEYS[1], ChainState(term=3, log_term=3, configs=(first,)), None)
    assert not follower.defers_to_leader(0.0, urge=False)  # no leader known: stand
    follower.leader, follower.heard = KEYS[0], 10.0
    assert follower.defers_to_leader(11.0, urge=False)
    assert follower.defers_to_leader(11.0, urge=True)  # heard from it just now
    assert not follower.defers_to_leader(100.0, urge=True)  # silent, and urged
    assert follower.defers_to_leader(100.0, urge=False)  # silent is not dead
    # A follower that names itself leader does not lead: it must not redirect to itself.
    follower.leader = KEYS[1]
    assert not follower.defers_to_leader(11.0, urge=False)
