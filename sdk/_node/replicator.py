"""``Replicator``: the trio driver of this node's chain replicas.

It serves ``append`` and ``vote`` from other brokers, runs elections when
a chain needs a leader, and, for the chains this node leads, keeps one
sender per peer that carries every chain's pending appends to that peer in
one batched request at a time. It tracks commits (and wakes whoever waits
for one), moves chains when the overlay's view of their brokers has
changed for long enough, flushes commit marks, and exchanges one digest
per peer and interval with the brokers it shares chains with.

Every decision is made by the sans-IO cores (:mod:`ketten._core.replica`,
:mod:`ketten._core.reconfig`); this module reads what they need from the
store, carries their messages and writes what they decide.
"""

from __future__ import annotations

import bisect
import logging
import random
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from .._core.chain import genesis_wins, make_locator
from .._core.election import Ask, Election, Outcome
from .._core.event import Event
from .._core.identity import node_id_of
from .._core.membership import ChainConfig, ChainState, Member, Pos
from .._core.messages import (
    MAX_BATCH,
    Append,
    AppendAck,
    AppendItem,
    AppendReply,
    CommitNotice,
    CommitQuery,
    Digest,
    DigestReply,
    Fetch,
    Locate,
    Retire,
    Route,
    Vote,
    VoteItem,
    VoteReply,
    VoteResult,
)
from .._core.outbox import Outbox
from .._core.quota import RateLimit
from .._core.reconfig import Change, Reconfiguration
from .._core.recovery import Recovery
from .._core.replica import (
    AckStatus,
    AppendAckData,
    AppendPlan,
    Replica,
    Role,
)
from .._core.sync import Digests
from .._core.watch import MoveWatch
from ..errors import (
    ConfigError,
    DecodeError,
    InvalidEvent,
    KettenError,
    StoreError,
    UsageError,
)
from ..interfaces import Peer
from ..logs import RateLimitedLog
from .local_chains import LocalChains
from .replica_sets import ReplicaSets
from .rpc import Rpc, guarded

__all__ = ["ReplicationOptions", "ReplicationStatistics", "Replicator"]

_log = logging.getLogger("ketten.replication")
_MAX_LOADED = 1 << 16
_KNOWN_CURSOR = "ketten/known"
_LOST_CURSOR = "ketten/yielded"
"""Chains this node gave up (criterion and genesis, 64 bytes each): it refuses them."""
_FULL_ROUNDS = 64
"""Every this many background rounds look at every chain, changed or not: a safety
net (about every two minutes), as any change makes the next round a full one. At
every 8th round the safety net was most of an idle node's work (20 nodes holding
10,000 chains used 3.4 times the CPU of 20 holding none)."""
_VOUCH_MEMORY = 10.0
"""Seconds an answer to "is this sender a voter?" is remembered (see ``_vouched``)."""
_MAX_VOUCHES = 4096
_FLUSH_GROUP = 512
"""Chain states a flush writes side by side (one store transaction, where it groups)."""


def _positive(options: Mapping[str, Any], name: str, default: float,
              unit: str = "seconds") -> float:
    value = options.get(name, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"replication option {name!r} must be a positive number of {unit}, "
                          f"got {value!r}")
    return float(value)


def _at_least_zero(options: Mapping[str, Any], name: str, default: float) -> float:
    value = options.get(name, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1e9:
        raise ConfigError(f"replication option {name!r} must be a number of seconds of at "
                          f"least 0, got {value!r}")
    return float(value)


def _at_least(options: Mapping[str, Any], name: str, default: int, least: int = 1,
              why: str = "") -> int:
    value = options.get(name, default)
    if type(value) is not int or value < least:
        raise ConfigError(f"replication option {name!r} must be an integer of at least "
                          f"{least}{why}, got {value!r}")
    return value


@attrs.frozen
class ReplicationOptions:
    """The ``replication`` options of a node (times in seconds)."""

    anti_entropy: float = 2.0
    """Period of the background round: digests, moves, commit marks."""
    hysteresis: float = 30.0
    """How long the overlay must name other brokers before a chain moves."""
    election_timeout: float = 3.0
    """How long a follower waits after the leader fell silent before it votes for another."""
    commit_flush: float = 1.0
    """How often commit marks are written."""
    commit_notice: float = 0.0
    """How long a leader may hold back telling a follower of a commit, waiting for the
    next append to it to carry the news (0, the default: tell at once, in a one-way
    commit notice each; a follower that must confirm commits itself then learns them
    late)."""
    catch_up_limit: float = 120.0
    """How long new members may take to catch up before a move is tried again."""
    creation_memory: float = 600.0
    """How long a node heard from still counts as near a key when the overlay no longer
    names it: a new chain is started only if most of the nodes nearest to its key,
    these included, answered that none holds it."""
    creations_per_second: float = 64.0
    creation_burst: int = 1024
    """A broker starts at most ``creation_burst`` chains of one author at once, then
    ``creations_per_second``; beyond that a publish that would start one fails with
    :class:`~ketten.errors.QuotaExceeded`."""
    peer_chains_per_second: float = 1024.0
    peer_chain_burst: int = 16384
    """One peer makes this node a broker of at most ``peer_chain_burst`` chains it held
    nothing of (appends and vote requests) at once, then ``peer_chains_per_second``;
    beyond that they are refused, so a stranger cannot fill its disk."""
    author_bytes_per_second: float = float(16 << 20)
    author_bytes_burst: int = 256 << 20
    """A leader accepts at most ``author_bytes_burst`` bytes of events of one author at
    once, then ``author_bytes_per_second``; beyond that a publish fails with
    :class:`~ketten.errors.QuotaExceeded` and stores nothing."""
    allow_recovery: bool = False
    """Permit :meth:`ketten.Node.recover` (it can lose acknowledged events)."""
    max_publishing: int = 16
    """Publish calls this node works on at once; later calls wait their turn (in call
    order) before their ``deadline`` starts, so an overloaded node slows its
    publishers down instead of failing them."""
    copies_events: int = 1_000_000
    """Events this node keeps in copies of chains it does not replicate (what reads,
    syncs and subscriptions stored here); beyond that the least recently used
    copies are dropped, except pinned ones and those with a subscription open."""
    verify_threads: int | None = None
    """Worker threads that check the signatures of long runs of received events
    (catch-up, reads, subscriptions); 0: on the event loop. ``None``: as many as
    cores, up to 4, except under a virtual clock (``trio.testing.MockClock``), which
    a worker thread would race."""
    request_timeout: float = 5.0
    batch_bytes: int = 1 << 20
    time: Callable[[], int] | None = None

    KNOWN = frozenset({"anti_entropy", "hysteresis", "election_timeout", "commit_flush",
                       "commit_notice",
                       "catch_up_limit", "creation_memory", "allow_recovery",
                       "creations_per_second", "creation_burst", "author_bytes_per_second",
                       "author_bytes_burst", "max_publishing", "copies_events", "verify_threads",
                       "peer_chains_per_second", "peer_chain_burst", "time"})

    @classmethod
    def parse(cls, options: Mapping[str, Any], *, request_timeout: float,
              batch_bytes: int, max_event_size: int) -> ReplicationOptions:
        """Raises :class:`~ketten.errors.ConfigError` for unknown or bad options."""
        unknown = set(options) - cls.KNOWN
        if unknown:
            raise ConfigError(f"unknown replication options: {', '.join(sorted(unknown))} "
                              f"(known: {', '.join(sorted(cls.KNOWN))})")
        clock = options.get("time")
        if clock is not None and not callable(clock):
            raise ConfigError("replication option 'time' must be a callable returning ms")
        threads = options.get("verify_threads")
        if threads is not None and (type(threads) is not int or not 0 <= threads <= 64):
            raise ConfigError("replication option 'verify_threads' must be an integer from 0 "
                              f"to 64, got {threads!r}")
        allow = options.get("allow_recovery", False)
        if type(allow) is not bool:
            raise ConfigError("replication option 'allow_recovery' must be true or false")
        return cls(
            anti_entropy=_positive(options, "anti_entropy", 2.0),
            hysteresis=_positive(options, "hysteresis", 30.0),
            election_timeout=_positive(options, "election_timeout", request_timeout),
            commit_flush=_positive(options, "commit_flush", 1.0),
            commit_notice=_at_least_zero(options, "commit_notice", 0.0),
            catch_up_limit=_positive(options, "catch_up_limit", 120.0),
            creation_memory=_positive(options, "creation_memory", 600.0),
            creations_per_second=_positive(options, "creations_per_second", 64.0, "chains"),
            creation_burst=_at_least(options, "creation_burst", 1024),
            peer_chains_per_second=_positive(options, "peer_chains_per_second", 1024.0,
                                             "chains"),
            peer_chain_burst=_at_least(options, "peer_chain_burst", 16384),
            author_bytes_per_second=_positive(options, "author_bytes_per_second",
                                              float(16 << 20), "bytes"),
            author_bytes_burst=_at_least(options, "author_bytes_burst", 256 << 20,
                                         max_event_size,
                                         " (max_event_size: one event must fit)"),
            allow_recovery=allow,
            max_publishing=_at_least(options, "max_publishing", 16),
            copies_events=_at_least(options, "copies_events", 1_000_000, 0),
            verify_threads=threads,
            request_timeout=request_timeout,
            batch_bytes=batch_bytes,
            time=clock,
        )


@attrs.frozen
class ReplicationStatistics:
    """Counters of a node's replication (see :meth:`ketten.Node.replication_statistics`)."""

    chains_led: int
    chains_held: int
    elections_won: int
    elections_lost: int
    appends_sent: int
    append_requests: int
    commit_notices: int
    """Commit marks sent alone, one way (a follower owed nothing else)."""
    events_synced: int
    forks_resolved: int
    events_orphaned: int
    reconfigurations: int
    anti_entropy_rounds: int
    full_rounds: int
    """Background rounds that looked at every chain (the others looked only at
    chains being moved: nothing had changed)."""
    digests_sent: int
    peer_failures: int
    chains_yielded: int
    """Chains given up because the same criterion had been started twice (on two sides
    of a partition) and the other chain won."""
    recoveries: int
    """Operator recoveries run here (:meth:`ketten.Node.recover`)."""
    quarantines: int
    """Chains cut back where the store found damage, to be fetched again from the
    members (see :meth:`Replicator.quarantine`)."""
    retirements: int
    """Chains this node stopped replicating when their leader said a configuration
    without it was committed; each copy stays as a reader's copy, within
    ``copies_events``."""
    state_writes: int
    lookups: int
    claims_refuted: int = 0
    """Peers that claimed an address nobody answered at as them (forgotten, see
    ``ketten._core.claims``)."""


@attrs.define(eq=False, repr=False)
class Replicator:
    """The replicas of the chains this node holds, and the tasks that keep them."""

    own: Callable[[], Member]
    rpc: Rpc
    chains: LocalChains
    sets: ReplicaSets
    options: ReplicationOptions
    rng: random.Random
    _replicas: OrderedDict[bytes, Replica] = attrs.field(factory=OrderedDict, init=False)
    _short: set[bytes] = attrs.field(factory=set, init=False)
    """Chains whose store holds less than their commit mark when loaded."""
    _reconfigs: dict[bytes, Reconfiguration] = attrs.field(factory=dict, init=False)
    _changed: dict[bytes, trio.Event] = attrs.field(factory=dict, init=False)
    _outboxes: dict[bytes, Outbox] = attrs.field(factory=dict, init=False)
    _sending: set[bytes] = attrs.field(factory=set, init=False)
    _wakes: dict[bytes, trio.Event] = attrs.field(factory=dict, init=False)
    """Per peer whose sender waits with only commit marks owed: set when more is owed."""
    _campaigns: dict[bytes, trio.Event] = attrs.field(factory=dict, init=False)
    _creations: dict[bytes, trio.Event] = attrs.field(factory=dict, init=False)
    _dirty_states: dict[bytes, None] = attrs.field(factory=dict, init=False)
    _flush_wanted: trio.Event = attrs.field(factory=trio.Event, init=False)
    _members: dict[bytes, frozenset[bytes]] = attrs.field(factory=dict, init=False)
    """Voters of every chain this node holds state of (for background rounds)."""
    _held_sorted: list[bytes] | None = attrs.field(default=None, init=False)
    """The chains of :attr:`_members` in key order (``None``: one was added since)."""
    _shared_cache: dict[bytes, list[bytes]] | None = attrs.field(default=None, init=False)
    """Per peer, the chains shared with it (see :meth:`_shared`); ``None`` after a change."""
    _activity: int = attrs.field(default=0, init=False)
    """Bumped by every change a background round looks at (see :meth:`maintain`)."""
    _round_seen: tuple[int | None, int] | None = attrs.field(default=None, init=False)
    """The routing table's version and :attr:`_activity` when the last round began."""
    _rounds: int = attrs.field(default=0, init=False)
    _unsettled: set[bytes] = attrs.field(factory=set, init=False)
    """Chains the last full round found unsettled: a move watched or under way."""
    _sync: Digests = attrs.field(factory=Digests, init=False)
    """Anti-entropy: which peers are due, and the digest buckets shared with each."""
    _watch_moves: MoveWatch = attrs.field(init=False)
    _committed: list[Callable[[bytes, Pos], None]] = attrs.field(factory=list, init=False)
    _released: list[Callable[[bytes, int], None]] = attrs.field(factory=list, init=False)
    _learner_members: dict[bytes, Member] = attrs.field(factory=dict, init=False)
    _taken_on: RateLimit = attrs.field(init=False)
    """Chains this node took on as a broker, per peer that asked it to."""
    _vouches: OrderedDict[bytes, tuple[bool, float]] = attrs.field(factory=OrderedDict,
                                                                  init=False)
    """The answers of :meth:`_vouched`, :meth:`_rival_held` and :meth:`_unknown_there`
    (per chain and sender, or per chain and rival genesis), and until when each stands."""
    _repairs: dict[bytes, float] = attrs.field(factory=dict, init=False)
    _genesis: dict[bytes, tuple[bytes, int]] = attrs.field(factory=dict, init=False)
    """Hash and time of each held chain's genesis: which chain of a criterion this is."""
    _lost: OrderedDict[bytes, frozenset[bytes]] = attrs.field(factory=OrderedDict, init=False)
    """Geneses of chains this node gave up to an older one: never taken up again."""
    _given_up: weakref.WeakSet[Replica] = attrs.field(factory=weakref.WeakSet, init=False)
    """Replicas whose state :meth:`_release` gave up: a task that still holds one (a
    flush, an ack) must not store its state again."""
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _counts: dict[str, int] = attrs.field(init=False)
    _events: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(_log, interval=1.0),
                                          init=False)

    def __attrs_post_init__(self) -> None:
        self._watch_moves = MoveWatch(self.options.hysteresis)
        self._taken_on = RateLimit(self.options.peer_chains_per_second,
                                   self.options.peer_chain_burst)
        self._counts = dict.fromkeys(
            ("elections_won", "elections_lost", "appends_sent", "append_requests", "commit_notices",
             "events_synced", "forks_resolved", "reconfigurations", "anti_entropy_rounds",
             "full_rounds", "digests_sent", "peer_failures", "chains_yielded", "recoveries", "quarantines",
             "retirements"), 0)
        self.rpc.serve(Append, self._serve_append)
        self.rpc.serve(Vote, self._serve_vote)
        self.rpc.serve(Digest, self._serve_digest)
        self.rpc.serve_messages("elect", self._take_elect)
        self.rpc.serve_messages(CommitNotice.SERVICE, self._take_commit_notice)
        self.rpc.serve_messages(Retire.SERVICE, self._take_retire)
        self.chains.on_appended(self._appended)
        self.chains.on_orphaned(self._orphaned)
        self.chains.on_dropped(self._dropped)

    # -- facts -----------------------------------------------------------------

    def statistics(self) -> ReplicationStatistics:
        local = self.chains.statistics()
        return ReplicationStatistics(
            chains_led=sum(1 for r in self._replicas.values() if r.is_leader),
            chains_held=len(self._members),
            events_orphaned=local.events_orphaned,
            state_writes=local.state_writes,
            lookups=self.sets.lookups,
            claims_refuted=self.sets.claims_refuted,
            **self._counts,
        )

    def on_committed(self, observer: Callable[[bytes, Pos], None]) -> None:
        """Call ``observer(criterion, commit)`` whenever a commit position advances here."""
        self._committed.append(observer)

    def on_released(self, observer: Callable[[bytes, int], None]) -> None:
        """Call ``observer(criterion, events)`` when this node gives up its replication
        state of a chain and keeps ``events`` of it as a reader's copy."""
        self._released.append(observer)

    def loaded(self, criterion: bytes) -> Replica | None:
        return self._replicas.get(criterion)

    def busy(self, criterion: bytes) -> bool:
        """Is the chain being created or campaigned for here (a replica that may
        have no configuration yet)? A replica loaded only for its term and vote (a
        broker that retired, say) is not."""
        replica = self._replicas.get(criterion)
        return replica is not None and (
            replica.config is not None or replica.role is not Role.FOLLOWER
            or criterion in self._campaigns or criterion in self._creations)

    def holds(self, criterion: bytes) -> bool:
        """Does this node hold replication state of the chain (a member, or once one)?

        Such a copy changes only through its leader: committed events copied
        from elsewhere would come without the configurations made among them.
        """
        if criterion in self._members:
            return True
        replica = self._replicas.get(criterion)
        return replica is not None and replica.config is not None

    def handover_for(self, asker: Member, after: bytes, limit: int) -> tuple[list[bytes], bool]:
        """The chains held here, in key order after ``after``, that ``asker`` is nearer
        to than one of their voters (it may come to be asked about them), at most
        ``limit`` of them; and whether there are more."""
        asker_id = int.from_bytes(asker.node_id, "big")
        ids: dict[bytes, int] = {}
        found: list[bytes] = []
        if self._held_sorted is None:
            self._held_sorted = sorted(self._members)
        held = self._held_sorted
        for criterion in held[bisect.bisect_right(held, after):]:
            if criterion not in self._members:
                continue
            key = int.from_bytes(criterion, "big")
            near = self.sets.distance(asker_id, key)
            voters = [ids.get(v) or ids.setdefault(v, int.from_bytes(node_id_of(v), "big"))
                      for v in self._members[criterion] if v != asker.key]
            if any(self.sets.distance(voter, key) > near for voter in voters):
                if len(found) == limit:
                    return found, True
                found.append(criterion)
        return found, False

    def route_of(self, criterion: bytes) -> Route | None:
        """What this node knows of the chain, from a loaded replica (no store access)."""
        replica = self._replicas.get(criterion)
        if replica is None or replica.config is None:
            return None
        genesis = self._genesis.get(criterion)
        return Route(replica.config, replica.term, replica.leader, replica.commit,
                     *(genesis or (None, None)))

    async def route(self, criterion: bytes) -> Route | None:
        replica = await self.replica(criterion)
        if replica is None or replica.config is None:
            return None
        genesis = await self._genesis_of(criterion)
        return Route(replica.config, replica.term, replica.leader, replica.commit,
                     *(genesis or (None, None)))

    async def genesis(self, criterion: bytes) -> bytes | None:
        """The hash of the genesis held here (``None``: no events yet)."""
        known = await self._genesis_of(criterion)
        return None if known is None else known[0]

    async def _genesis_of(self, criterion: bytes) -> tuple[bytes, int] | None:
        known = self._genesis.get(criterion)
        if known is None:
            first = await self.chains.range(criterion, 0, 1)
            if first:
                if len(self._genesis) > _MAX_LOADED:
                    self._genesis.clear()
                known = self._genesis[criterion] = (first[0].hash, first[0].time)
        return known

    def settle_rival_soon(self, criterion: bytes, rival: bytes, address: str,
                          configs: Sequence[ChainConfig] = ()) -> None:
        """:meth:`settle_rival` in the background, for a rival a survey found."""
        self._spawn(self.settle_rival, criterion, rival, address, configs)

    async def _is_rival(self, criterion: bytes, genesis: bytes | None,
                        configs: Sequence[ChainConfig]) -> bool:
        """Is the chain with first event ``genesis`` and configurations ``configs`` a rival
        of the chain held here? Not if the first events agree (or one is unknown), nor
        if the two share a configuration: then they are one replication group, whatever
        their first events, its leader's log wins where they differ (Raft's log
        matching), and a genesis held here that its leader lacks was never committed.
        Only chains of two groups, started on two sides of a partition, are settled
        by the older genesis."""
        own = await self.genesis(criterion)
        if genesis is None or own is None or genesis == own:
            return False
        replica = await self.replica(criterion)
        return replica is None or not any(c in replica.state.configs for c in configs)

    def _give_up(self, criterion: bytes, genesis: bytes) -> None:
        self._lost[criterion] = self._lost.get(criterion, frozenset()) | {genesis}
        self._lost.move_to_end(criterion)
        while len(self._lost) > _MAX_LOADED:
            self._lost.popitem(last=False)

    async def _rival_genesis(self, address: str, criterion: bytes, rival: bytes) -> Event | None:
        """The genesis ``rival`` of ``criterion`` as ``address`` holds it, verified."""
        try:
            _, reply = await self.rpc.call(address, Fetch(criterion, None, 1 << 16, False),
                                           timeout=self.options.request_timeout,
                                           retransmit=True)
            if not reply.events:
                return None
            event = self.chains.decode(reply.events[0], criterion, where="rival genesis")
            if event.seq != 0 or event.hash != rival:
                return None
            event.verify()
        except KettenError:
            self._counts["peer_failures"] += 1
            return None
        return event

    async def settle_rival(self, criterion: bytes, rival: bytes | None, address: str,
                           configs: Sequence[ChainConfig] = ()) -> bool:
        """Another chain of the same criterion exists, with genesis ``rival``, held
        at ``address``.

        That happens only when a criterion was started on both sides of a
        partition (the one side never learned the other had it). The older
        chain stays, everywhere alike (:func:`~ketten._core.chain.genesis_wins`);
        if ours loses, this node gives up its copy: every event becomes an
        orphan (reported through ``ketten_fork_resolved`` with no head), the
        replication state is dropped, and the node can join the winner later
        like any new broker. Returns whether ours lost. ``configs``: the rival's
        configurations, if known; sharing one with ours makes it no rival (see
        :meth:`_is_rival`).
        """
        if rival is None or not await self._is_rival(criterion, rival, configs):
            return False
        own = await self.genesis(criterion)
        theirs = await self._rival_genesis(address, criterion, rival)
        first = await self.chains.range(criterion, 0, 1)
        if theirs is None or not first or first[0].hash != own or genesis_wins(first[0], theirs):
            return False
        if not await self._rival_held(criterion, rival, address):
            return False
        source = address
        async with self.chains.lock(criterion):
            if await self.genesis(criterion) != own:
                return False
            replica = self._replicas.pop(criterion, None)
            if replica is not None:
                replica.role = Role.FOLLOWER
            # The refusal is stored before the copy goes: a crash in between must not
            # leave a node that neither holds the chain nor refuses it.
            self._give_up(criterion, own)
            try:
                await self.chains.store.put_cursor(_LOST_CURSOR, b"".join(
                    lost + genesis for lost, geneses in self._lost.items()
                    for genesis in sorted(geneses)))
            except StoreError as exc:
                _log.warning("cannot store the chains given up: %s", exc)
            orphans = await self.chains.cut(criterion, 0, [], force=True)
            self._genesis.pop(criterion, None)
            await self.chains.save_state(criterion, ChainState())
            self._drop_members(criterion)
            self._reconfigs.pop(criterion, None)
        self._counts["chains_yielded"] += 1
        try:
            _, located = await self.rpc.call(address, Locate((criterion,)),
                                             timeout=self.options.request_timeout,
                                             retransmit=True)
            winner = located.routes[0] if located.routes else None
            if winner is not None and winner.genesis == rival:
                self.sets.learn(criterion, winner)
        except KettenError:
            pass  # found again by the next lookup
        self._events.warning(
            "chain_replaced", "%s: criterion %s was started twice, on two sides of a partition; "
            "this chain (genesis %s) lost to the one with genesis %s (learned from %s): "
            "%d events orphaned", self.own().address, criterion.hex()[:16], own.hex()[:16],
            rival.hex()[:16], source, len(orphans), criterion=criterion.hex(),
            genesis=own.hex(), winner=rival.hex(), source=source, orphaned=len(orphans))
        self._signal(criterion)
        return True

    def _address_of(self, replica: Replica, key: bytes) -> str | None:
        config = replica.config
        found = config.address_of(key) if config is not None else None
        if found is None and key in self._learner_members:
            return self.sets.address(self._learner_members[key])
        return None if found is None else self.sets.address(Member(key, found))

    def _now(self) -> float:
        return trio.current_time()

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Run a background task in the replicator's nursery (``False``: the node is
        closing, nothing runs). A bug in it ends that task (logged), never the node."""
        if self._nursery is None:
            return False
        try:
            self._nursery.start_soon(guarded, fn, *args)
        except RuntimeError:  # the nursery is closing
            return False
        return True

    def _signal(self, criterion: bytes) -> None:
        self._activity += 1
        event = self._changed.pop(criterion, None)
        if event is not None:
            event.set()

    async def _wait_change(self, criterion: bytes, until: float) -> None:
        event = self._changed.get(criterion)
        if event is None:
            event = self._changed[criterion] = trio.Event()
        with trio.move_on_at(until):
            await event.wait()

    # -- loading ---------------------------------------------------------------

    async def replica(self, criterion: bytes, *, create: bool = False) -> Replica | None:
        """The replica of ``criterion`` (loaded from the store); with ``create`` a fresh
        one for a chain this node holds no state of."""
        replica = self._replicas.get(criterion)
        if replica is not None:
            self._replicas.move_to_end(criterion)
            return replica
        state = await self.chains.state(criterion)
        if state is None and not create:
            return None
        replica = self._replicas.get(criterion)  # loaded while we read
        if replica is not None:
            return replica
        replica = self._new_replica(criterion, state or ChainState(),
                                    await self.chains.head_pos(criterion))
        self._replicas[criterion] = replica
        self._index(criterion, replica.state)
        self._evict()
        return replica

    def _evict(self) -> None:
        while len(self._replicas) > _MAX_LOADED:
            for key, replica in self._replicas.items():
                if replica.role is Role.FOLLOWER and key not in self._campaigns:
                    del self._replicas[key]
                    self._activity += 1
                    break
            else:
                return

    def _index(self, criterion: bytes, state: ChainState) -> None:
        self._activity += 1
        config = state.config
        if config is None:
            self._drop_members(criterion)
        elif self._members.get(criterion) != config.keys():
            if criterion not in self._members:
                self._held_sorted = None
            self._members[criterion] = config.keys()
            self._shared_cache = None

    def _drop_members(self, criterion: bytes) -> None:
        self._activity += 1
        if self._members.pop(criterion, None) is not None:
            self._shared_cache = None
        self._watch_moves.forget(criterion)

    async def _save(self, replica: Replica) -> None:
        """Persist the replica's state now (the caller holds the chain's lock); not that
        of a replica given up meanwhile (see :meth:`_release`)."""
        if replica in self._given_up:
            return
        await self.chains.save_state(replica.criterion, replica.state)
        self._dirty_states.pop(replica.criterion, None)
        self._index(replica.criterion, replica.state)

    async def load_all(self) -> None:
        """Index every chain this node holds replication state of, and recall the chains
        it knew to exist (at start)."""
        self._load_states(await self.chains.states(), await self.chains.store.heads())
        known = await self.chains.store.get_cursor(_KNOWN_CURSOR)
        if known is not None:
            self.sets.load_known(known)
        lost = await self.chains.store.get_cursor(_LOST_CURSOR) or b""
        for start in range(0, len(lost) - len(lost) % 64, 64):
            self._give_up(lost[start:start + 32], lost[start + 32:start + 64])

    def _load_states(self, states: Mapping[bytes, ChainState],
                     heads: Mapping[bytes, tuple[int, bytes]]) -> None:
        """Index the chains of ``states`` and load their replicas (as many as are kept
        loaded), so that no background round reads a state from the store again."""
        for criterion, state in states.items():
            self._index(criterion, state)
            self.sets.note_exists(criterion)
            head = heads.get(criterion)
            if state.commit is not None and (head is None or head[0] < state.commit[0]):
                # The store lost committed events (a damaged tail, a quarantine):
                # the leader is asked to send them again once the node runs.
                self._short.add(criterion)
            if criterion not in self._replicas and len(self._replicas) < _MAX_LOADED:
                self._replicas[criterion] = self._new_replica(
                    criterion, state, None if head is None else (head[0], head[1]))

    def _new_replica(self, criterion: bytes, state: ChainState, head: Pos | None) -> Replica:
        return Replica(criterion, self.own().key, state, head,
                       election_timeout=self.options.election_timeout)

    # -- observers of the store ----------------------------------------------------

    def _appended(self, events: Sequence[Event]) -> None:
        last: dict[bytes, Event] = {}
        for event in events:
            last[event.criterion] = event
        for event in events:
            if event.seq == 0:
                self._genesis[event.criterion] = (event.hash, event.time)
        for criterion, event in last.items():
            self.sets.note_exists(criterion)
            replica = self._replicas.get(criterion)
            if replica is not None and (replica.head is None or replica.head[0] < event.seq):
                replica.head = (event.seq, event.hash)

    def _dropped(self, criterion: bytes) -> None:
        # A reader's copy went (only a chain this node does not hold or work on):
        # a replica loaded for its term and vote alone must not keep the old head.
        replica = self._replicas.get(criterion)
        if replica is not None and not self.busy(criterion):
            del self._replicas[criterion]
            self._activity += 1

    def _orphaned(self, criterion: bytes, orphans: Any, head: Any) -> None:
        self._counts["forks_resolved"] += 1
        if any(e.seq == 0 for e in orphans):
            self._genesis.pop(criterion, None)
        replica = self._replicas.get(criterion)
        if replica is not None:
            replica.head = None if head is None else (head.seq, head.hash)
        self._signal(criterion)

    # -- commits ---------------------------------------------------------------

    def _commit_learned(self, criterion: bytes, pos: Pos) -> None:
        self._dirty_states[criterion] = None
        self.flush_soon()
        self._signal(criterion)
        for observer in self._committed:
            observer(criterion, pos)

    async def _advance(self, replica: Replica) -> None:
        """Move the leader's commit as far as its members' acknowledgements allow."""
        seq = replica._commit_candidate()
        if seq is None:
            return
        value = await self.chains.hash_at(replica.criterion, seq)
        if value is None:
            return
        if replica.commit_to((seq, value)) is not None:
            self._commit_learned(replica.criterion, (seq, value))
            self._mark(replica)

    async def wait_commit(self, criterion: bytes, seq: int, expected: bytes,
                          until: float) -> bool | None:
        """Wait until position ``seq`` is committed here; ``True`` if it holds ``expected``,
        ``False`` if it holds something else, ``None`` if time ran out."""
        while True:
            replica = self._replicas.get(criterion)
            commit = None if replica is None else replica.commit
            if commit is not None and commit[0] >= seq:
                return await self.chains.hash_at(criterion, seq) == expected
            if replica is not None and replica.head is not None and replica.head[0] >= seq:
                held = await self.chains.hash_at(criterion, seq)
                if held is not None and held != expected:
                    return False
            if self._now() >= until:
                return None
            await self._wait_change(criterion, until)

    async def barrier(self, criterion: bytes, until: float) -> tuple[bool, Pos | None]:
        """As leader, confirm with a quorum that we still lead, then give the commit.

        Returns ``(confirmed, commit)``.
        """
        replica = self._replicas.get(criterion)
        if replica is None or not replica.is_leader:
            return False, None
        round_ = replica.begin_round()
        self._mark(replica)
        while True:
            if not replica.is_leader:
                return False, None
            start = replica.start
            commit = replica.commit
            started = start is None or (commit is not None and commit[0] >= start[0])
            if started and replica.round_confirmed(round_):
                return True, commit
            if self._now() >= until:
                return False, None
            await self._wait_change(criterion, until)

    async def leader_appended(self, replica: Replica, head: Pos) -> None:
        """The leader stored its own event at ``head``: replicate it."""
        replica.local_appended(head)
        self._mark(replica)
        await self._advance(replica)

    # -- following -------------------------------------------------------------------

    async def _serve_append(self, peer: Peer, request: Append) -> AppendReply:
        acks: list[AppendAck | None] = [None] * len(request.items)

        async def one(index: int, item: AppendItem) -> None:
            acks[index] = await self._follow(peer, item)

        if len(request.items) == 1:
            await one(0, request.items[0])
        else:
            async with trio.open_nursery() as nursery:
                for index, item in enumerate(request.items):
                    nursery.start_soon(one, index, item)
        return AppendReply(tuple(a for a in acks if a is not None))

    def _ack(self, criterion: bytes, replica: Replica | None, data: AppendAckData | None,
             *, status: str | None = None, reason: str = "",
             locator: tuple[Pos, ...] = ()) -> AppendAck:
        if data is None:
            assert replica is not None
            state = replica.state
            return AppendAck(criterion, status or "refused", state.term, state.log_term,
                             replica.head, state.epoch, state.commit, locator, reason)
        return AppendAck(criterion, status or data.status.value, data.term, data.log_term,
                         data.head, data.epoch, data.commit, locator, reason or data.reason)

    async def _follow(self, peer: Peer, item: AppendItem) -> AppendAck:
        criterion = item.criterion
        if item.genesis is not None and item.genesis in self._lost.get(criterion, ()):
            return AppendAck(criterion, "refused", 0, 0, None, 0, None, (),
                             "that chain lost to an older one of the same criterion")
        rival = await self._is_rival(criterion, item.genesis, item.configs)
        if rival and not await self.settle_rival(criterion, item.genesis, peer.address):
            replica = await self.replica(criterion, create=True)
            assert replica is not None
            return AppendAck(criterion, "conflict", 0, 0, replica.head, replica.state.epoch,
                             None, (), "another chain of this criterion",
                             await self.genesis(criterion))
        if not await self.may_take_on(criterion, peer):
            return AppendAck(criterion, "refused", 0, 0, None, 0, None, (),
                             "this peer made this node a broker of too many chains lately")
        if await self._unknown_there(criterion, peer.public_key):
            return AppendAck(criterion, "refused", 0, 0, None, 0, None, (),
                             "the nodes near the key know this chain without the sender "
                             "as a voter")
        vouched = await self._vouched(criterion, peer, item.configs)
        async with self.chains.lock(criterion):
            replica = await self.replica(criterion, create=True)
            assert replica is not None
            try:
                events = [self.chains.decode(raw, criterion, where=f"append of "
                                             f"{criterion.hex()[:16]}") for raw in item.events]
            except DecodeError as exc:
                self.chains.count_invalid()
                return self._ack(criterion, replica, None, reason=str(exc))
            seqs = [e.seq for e in events]
            if item.prev is not None:
                seqs.append(item.prev[0])
            if item.start is not None:
                seqs.append(item.start[0])
            if replica.commit is not None:
                seqs.append(replica.commit[0])
            hashes = await self.chains.hashes(criterion, seqs)
            if events:
                try:
                    await self.chains.verify_run(criterion, item.prev, events)
                except InvalidEvent as exc:
                    return self._ack(criterion, replica, None, reason=f"invalid events: {exc}")
            was_voter = replica.is_voter()
            before = replica.state.configs
            outcome = replica.on_append(peer.public_key, item.term, item.start, item.prev,
                                        events, item.commit, item.configs, self._now(), hashes,
                                        vouched=vouched)
            try:
                if outcome.truncate_from is not None:
                    await self.chains.cut(criterion, outcome.truncate_from, outcome.append)
                elif outcome.append:
                    await self.chains.append(outcome.append)
            except StoreError as exc:
                replica.head = await self.chains.head_pos(criterion)
                return self._ack(criterion, replica, None, reason=f"store: {exc}")
            if outcome.append:
                self._counts["events_synced"] += len(outcome.append)
            if outcome.state is not None:
                if _log.isEnabledFor(logging.DEBUG) and outcome.state.configs != before:
                    _log.debug("%s: chain %s configurations %s (term %d, from %s)",
                               self.own().address, criterion.hex()[:16],
                               [c.epoch for c in outcome.state.configs], item.term,
                               peer.address)
                await self._save(replica)
            if was_voter != replica.is_voter():
                self._signal(criterion)
        locator: tuple[Pos, ...] = ()
        if outcome.ack.status is AckStatus.MISMATCH:
            locator = await self._locator(criterion, replica.head)
        if outcome.committed is not None:
            self._commit_learned(criterion, outcome.committed)
        self._signal(criterion)
        return self._ack(criterion, replica, outcome.ack, locator=locator)

    def _remembered(self, key: bytes) -> bool | None:
        """An answer of :meth:`_vouched`, :meth:`_rival_held` or :meth:`_unknown_there`
        given lately (``None``: none that still stands)."""
        known = self._vouches.get(key)
        return known[0] if known is not None and known[1] > trio.current_time() else None

    def _remember(self, key: bytes, answer: bool) -> bool:
        self._vouches[key] = (answer, trio.current_time() + _VOUCH_MEMORY)
        while len(self._vouches) > _MAX_VOUCHES:
            self._vouches.popitem(last=False)
        return answer

    async def _ask_around(self, criterion: bytes, first: Iterable[Member],
                          skip: Collection[bytes], enough: Callable[[Member, Route], bool],
                          *, near: int | None = None) -> list[tuple[Member, Route]]:
        """The routes of ``criterion`` that ``first`` and the ``near`` nodes nearest to
        the key (default ``r``) know (all asked at once; neither this node nor
        ``skip``), until one for which ``enough`` holds comes in."""
        own = self.own().key
        asked: dict[bytes, Member] = {}
        nearby = (self.sets.desired(criterion) if near is None
                  else self.sets.nearest(criterion, near))
        for member in [*first, *nearby]:
            if member.key != own and member.key not in skip:
                asked.setdefault(member.key, member)
        found: list[tuple[Member, Route]] = []

        async def ask(member: Member) -> None:
            located = await self.sets.locate(member, criterion)
            route = None if located is None else located.route
            if route is not None:
                found.append((member, route))
                if enough(member, route):
                    nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for member in asked.values():
                nursery.start_soon(ask, member)
        return found

    async def _vouched(self, criterion: bytes, peer: Peer,
                       configs: Sequence[ChainConfig]) -> bool:
        """Whether nodes this one trusts name ``peer`` a voter of ``criterion``, when
        it is a voter only of the ``configs`` it sent (see
        :meth:`Replica.needs_voucher`; ``False`` when it need not be vouched for).

        The members of the configuration held here and the nodes nearest to the key
        are asked what they know of the chain; one that names the sender a voter
        vouches for it. The answer is remembered for a while, so a stranger's
        messages do not turn into a stream of questions."""
        sender = peer.public_key
        replica = await self.replica(criterion)
        if replica is None or not replica.needs_voucher(sender, configs):
            return False
        key = criterion + sender
        known = self._remembered(key)
        if known is not None:
            return known

        def names(member: Member, route: Route) -> bool:
            return route.config.is_voter(sender)

        held = replica.config
        routes = await self._ask_around(criterion, () if held is None else held.members(),
                                        (sender,), names)
        vouched = any(names(*found) for found in routes)
        if not vouched:
            self._events.warning(
                "voter_refused", "%s: %s (%s) claims to be a voter of criterion %s; no member "
                "and no node near the key names it one: its appends and vote requests are "
                "refused", self.own().address, peer.address, sender.hex()[:16],
                criterion.hex()[:16], key="voter_refused", criterion=criterion.hex(),
                sender=sender.hex(), address=peer.address)
        return self._remember(key, vouched)

    async def _rival_held(self, criterion: bytes, rival: bytes, source: str) -> bool:
        """Whether a node this one trusts holds the chain with genesis ``rival`` as one of
        its voters: a member of the configuration held here or one of the ``2r`` nodes
        nearest to the key.

        Anyone can sign a first event of any criterion and stamp it as old as it
        likes; were the word of the node that tells of it enough, one message from a
        stranger would orphan a whole chain. Two chains of a criterion started on two
        sides of a partition meet near its key after the heal; the ``r`` nearest
        may all hold the younger one, so the ``2r`` nearest are asked (each side
        started its chain on the nodes nearest to the key that it could see). The
        answer is remembered for a while, like a voucher's."""
        key = b"rival" + criterion + rival
        known = self._remembered(key)
        if known is not None:
            return known

        def holds(member: Member, route: Route) -> bool:
            return route.genesis == rival and route.config.is_voter(member.key)

        replica = await self.replica(criterion)
        held = None if replica is None else replica.config
        routes = await self._ask_around(criterion, () if held is None else held.members(),
                                        (), holds, near=2 * self.sets.replication)
        found = any(holds(*answer) for answer in routes)
        if not found:
            self._events.warning(
                "rival_refused", "%s: %s told of another chain of criterion %s (genesis %s, "
                "older than the one held here), but no member and no node near the key "
                "holds it: the chain held here stays", self.own().address, source,
                criterion.hex()[:16], rival.hex()[:16], key="rival_refused",
                criterion=criterion.hex(), rival=rival.hex(), source=source)
        return self._remember(key, found)

    async def _unknown_there(self, criterion: bytes, sender: bytes) -> bool:
        """Before a node that holds no configuration of ``criterion`` takes one on from
        ``sender`` (an append) or votes on one it proposes: do the nodes that know the
        chain know it without ``sender`` as a voter?

        Anyone can name itself the leader of a chain it never belonged to, or start a
        chain of its own for a criterion that has one, stamped as old as it likes. A
        node that took it would store the stranger's events as committed, and, as a
        node near the key, be believed that an older chain exists (see
        :meth:`_rival_held`), so the real chain's brokers would give way to it. So
        unless ``sender`` is one of the ``2r`` nodes nearest to the key, trusted like
        a broker, in a routing table the hand-over has settled there, this node asks
        the nodes nearest to the key and the members of the route known here: if one
        of them is a voter of the chain and none names ``sender`` one, the sender is
        refused. The answer is remembered for a while, like a voucher's."""
        replica = await self.replica(criterion)
        if replica is not None and replica.state.configs:
            return False
        near = self.sets.nearest(criterion, 2 * self.sets.replication)
        if any(m.key == sender for m in near) and self.sets.settled_for(criterion):
            return False
        key = b"there" + criterion + sender
        known = self._remembered(key)
        if known is not None:
            return known

        def speaks(member: Member, route: Route) -> bool:
            # Only a voter speaks for the chain (a route cached elsewhere may be stale).
            return route.config.is_voter(member.key)

        def names(member: Member, route: Route) -> bool:
            return speaks(member, route) and route.config.is_voter(sender)

        route = self.sets.cached(criterion)
        routes = await self._ask_around(criterion, () if route is None else route.config.members(),
                                        (sender,), names)
        unknown = (any(speaks(*answer) for answer in routes)
                   and not any(names(*answer) for answer in routes))
        if unknown:
            self._events.warning(
                "chain_refused", "%s: %s is no voter of criterion %s that the nodes near "
                "the key know of: this node, which holds no configuration of it, does not "
                "take one on from it", self.own().address, sender.hex()[:16],
                criterion.hex()[:16], key="chain_refused", criterion=criterion.hex(),
                sender=sender.hex())
        return self._remember(key, unknown)

    async def may_take_on(self, criterion: bytes, peer: Peer) -> bool:
        """Whether ``peer`` may make this node a broker of ``criterion`` now: always for a
        chain it holds state of; else within the peer's share (``peer_chain_burst`` at
        once, then ``peer_chains_per_second``)."""
        if await self.replica(criterion) is not None:
            return True
        if self._taken_on.allow(peer.public_key, trio.current_time()):
            return True
        self._events.warning(
            "broker_quota", "%s: %s (%s) asked this node to become a broker of more than %d "
            "chains at once, then more than %g per second: refused", self.own().address,
            peer.address, peer.public_key.hex()[:16], self.options.peer_chain_burst,
            self.options.peer_chains_per_second, key="broker_quota",
            peer=peer.address, criterion=criterion.hex())
        return False

    async def _locator(self, criterion: bytes, head: Pos | None) -> tuple[Pos, ...]:
        if head is None:
            return ()
        seqs = [seq for seq, _ in make_locator(lambda s: b"", low=0, high=head[0])]
        hashes = await self.chains.hashes(criterion, seqs)
        return tuple((s, hashes[s]) for s in seqs if s in hashes)[:128]

    # -- voting ----------------------------------------------------------------------

    async def _serve_vote(self, peer: Peer, request: Vote) -> VoteReply:
        results = []
        for item in request.items:
            results.append(await self._vote(peer, item))
        return VoteReply(tuple(results))

    async def _vote(self, peer: Peer, item: VoteItem) -> VoteResult:
        criterion = item.criterion
        if item.proposed is not None and (
                not await self.may_take_on(criterion, peer)
                or await self._unknown_there(criterion, peer.public_key)):
            return VoteResult(criterion, False, 0)
        vouched = await self._vouched(criterion, peer,
                                      () if item.proposed is None else (item.proposed,))
        async with self.chains.lock(criterion):
            # A member the leader never reached holds no state yet: it judges the
            # request by the candidate's configuration (it must name both).
            lost = item.genesis in self._lost.get(criterion, ())  # lost to an older chain
            replica = None if lost else await self.replica(criterion,
                                                           create=item.proposed is not None)
            if replica is None:
                return VoteResult(criterion, False, 0)
            rival = await self._is_rival(criterion, item.genesis, () if item.proposed is None
                                         else (item.proposed,))
            mine = replica.rank()
            answer = replica.on_vote(peer.public_key, item.term, item.pre, item.rank,
                                     self._now(), force=item.force, proposed=item.proposed,
                                     rival=rival, vouched=vouched,
                                     exists=await self._exists_besides(criterion, item.proposed))
            _log.debug("%s: %svote for %s in term %d on %s: theirs %s, ours %s: %s",
                       self.own().address, "pre-" if item.pre else "", peer.address,
                       item.term, criterion.hex()[:16], item.rank, mine, answer.granted)
            if answer.state is not None:
                await self._save(replica)
        if rival:
            self._spawn(self.settle_rival, criterion, item.genesis, peer.address)
        if answer.stand and criterion not in self._campaigns:
            self._spawn(self._campaign_quietly, criterion, False)
        return VoteResult(criterion, answer.granted, answer.term)

    async def _exists_besides(self, criterion: bytes, proposed: ChainConfig | None) -> bool:
        """Does this node know of a chain of ``criterion`` other than the creation that
        proposes ``proposed``? A route naming exactly that first configuration, with
        nothing committed and no genesis, is this very creation: a candidate that stood
        for it once and lost keeps the configuration and names it when asked. Refusing
        it would leave the criterion with a chain that exists by name only and that
        nobody can lead."""
        if await self.chains.head(criterion) is not None:
            return True
        if not self.sets.exists(criterion):
            return False
        known = self.sets.cached(criterion)
        return not (known is not None and proposed is not None and known.config == proposed
                    and known.commit is None and known.genesis is None)

    async def _take_elect(self, peer: Peer, body: Any) -> None:
        """A leader that left the configuration hands the chain over to us."""
        if type(body) is not dict or type(body.get("c")) is not bytes or len(body["c"]) != 32:
            raise DecodeError("expected {c: criterion}", where="elect")
        criterion = body["c"]
        replica = await self.replica(criterion)
        if replica is None or replica.is_leader or not replica.is_voter():
            return
        config = replica.config
        if config is None or (not config.is_voter(peer.public_key) and replica.leader != peer.public_key):
            return
        if criterion not in self._campaigns:
            self._spawn(self._campaign_quietly, criterion, True)

    async def _campaign_quietly(self, criterion: bytes, force: bool) -> None:
        try:
            await self.campaign(criterion, force=force)
        except KettenError as exc:
            _log.debug("campaign for %s failed: %s", criterion.hex()[:16], exc)

    async def campaign(self, criterion: bytes, *, force: bool = False,
                       proposed: ChainConfig | None = None) -> bool:
        """Stand for leader of ``criterion``; ``True`` if this node leads it now.

        The election runs in the replicator's nursery, one per chain at a
        time: a caller that stops waiting (its deadline passed) does not
        cut it short, and a second caller waits for the running one.
        """
        running = self._campaigns.get(criterion)
        if running is None:
            if self._nursery is None:
                return False
            running = self._campaigns[criterion] = trio.Event()
            if not self._spawn(self._run_campaign, criterion, force, proposed, running):
                del self._campaigns[criterion]
                return False
        await running.wait()
        replica = self._replicas.get(criterion)
        return replica is not None and replica.is_leader

    async def _run_campaign(self, criterion: bytes, force: bool, proposed: ChainConfig | None,
                            done: trio.Event) -> None:
        election = Election(criterion, force=force, proposed=proposed)
        try:
            with trio.move_on_after(self.options.request_timeout * 2):
                await self._campaign(election, create=proposed is not None)
        except KettenError as exc:
            _log.debug("campaign for %s failed: %s", criterion.hex()[:16], exc)
        finally:
            del self._campaigns[criterion]
            done.set()
            replica = self._replicas.get(criterion)
            won = election.outcome is not None and election.outcome.won
            if replica is not None:
                won = election.abandon(replica).won
        self._counts["elections_won" if won else "elections_lost"] += 1

    async def _campaign(self, election: Election, *, create: bool) -> None:
        criterion = election.criterion
        while True:
            async with self.chains.lock(criterion):
                replica = await self.replica(criterion, create=create)
                if replica is None:
                    return
                step = election.begin(replica)
                if isinstance(step, Outcome):
                    await self._end_campaign(replica, step)
                    return
                if step.persist is not None:
                    await self._save(replica)
            await self._ask(replica, election, step)
            async with self.chains.lock(criterion):
                outcome = election.decide(replica, self._now())
                if outcome is None:
                    continue
                await self._end_campaign(replica, outcome)
            if outcome.persist is not None:
                _log.debug("%s leads %s in term %d (epochs %s, votes %s)", self.own().address,
                           criterion.hex()[:16], replica.term,
                           [c.epoch for c in replica.state.configs],
                           sorted(self.sets.address(Member(k, "?")) for k in replica.votes))
                self._signal(criterion)
                self._mark(replica)
                await self._advance(replica)
            return

    async def _end_campaign(self, replica: Replica, outcome: Outcome) -> None:
        """Under the chain's lock: persist a new leader's state, or forget a replica
        made only for a creation that did not happen (nothing was stored)."""
        criterion = replica.criterion
        if outcome.persist is not None:
            await self._save(replica)
            self._reconfigs.pop(criterion, None)
        if outcome.forget and self._replicas.get(criterion) is replica and replica.head is None:
            del self._replicas[criterion]
            self._drop_members(criterion)

    async def _ask(self, replica: Replica, election: Election, ask: Ask) -> None:
        """Send ``ask``; stop once the outcome is clear."""
        if not ask.members:
            return
        item = attrs.evolve(ask.item, genesis=await self.genesis(election.criterion))
        timeout = self.options.request_timeout / 2
        async with trio.open_nursery() as nursery:

            async def one(member: Member) -> None:
                try:
                    _, reply = await self.rpc.call(self.sets.address(member), Vote((item,)),
                                                   timeout=timeout, retransmit=True,
                                                   expect=member.key)
                except KettenError:
                    self._counts["peer_failures"] += 1
                    return
                answered = election.on_reply(replica, member.key, reply.results)
                if answered.persist is not None:
                    async with self.chains.lock(item.criterion):
                        await self._save(replica)
                if answered.settled:
                    nursery.cancel_scope.cancel()

            for member in ask.members:
                nursery.start_soon(one, member)

    async def create(self, criterion: bytes, members: tuple[Member, ...]) -> Replica | Route | None:
        """Create the chain on ``members`` (this node among them), unless it exists.

        Asks the nodes nearest to the key first; returns the route of an
        existing chain, this node's replica if it now leads the new chain, or
        ``None`` if that did not happen (yet). The work runs in the
        replicator's nursery: a caller that stops waiting does not cut it short.
        """
        existing = await self.replica(criterion)
        if existing is not None and existing.config is not None:
            return existing if existing.is_leader else await self.route(criterion)
        running = self._creations.get(criterion)
        if running is None:
            if self._nursery is None:
                return None
            running = self._creations[criterion] = trio.Event()
            if not self._spawn(self._run_creation, criterion, members, running):
                del self._creations[criterion]
                return None
        await running.wait()
        replica = self._replicas.get(criterion)
        if replica is not None and replica.is_leader:
            return replica
        return await self.route(criterion) or self.sets.cached(criterion)

    async def _run_creation(self, criterion: bytes, members: tuple[Member, ...],
                            done: trio.Event) -> None:
        try:
            with trio.move_on_after(self.options.request_timeout * 3):
                if self.sets.exists(criterion):
                    return  # known to exist: never a second chain
                found = await self.sets.survey(criterion)
                if (found.route is not None or found.held
                        or self.sets.doubt(criterion, found) is not None
                        or await self.chains.head(criterion) is not None):
                    # It exists; or someone holds a copy (an old reader's cache, say);
                    # or nodes near the key that may hold it are silent: not ours to start.
                    return
                proposed = ChainConfig(1, members, (), -1, 0)
                if proposed.is_voter(self.own().key):
                    self._events.info("chain_created", "%s: creating chain %s on %s",
                                      self.own().address, criterion.hex()[:16],
                                      ", ".join(m.address for m in members),
                                      criterion=criterion.hex(),
                                      members=[m.address for m in members])
                    await self.campaign(criterion, proposed=proposed)
        except KettenError as exc:
            _log.debug("creating %s failed: %s", criterion.hex()[:16], exc)
        finally:
            del self._creations[criterion]
            done.set()

    async def lead(self, criterion: bytes, *, urge: bool) -> Replica | Route | None:
        """This node's replica if it leads ``criterion`` (standing for it when urged and
        no leader is active), else the route to the leader, else ``None``."""
        replica = await self.replica(criterion)
        if replica is None or replica.config is None:
            return None
        if replica.is_leader:
            return replica
        route = Route(replica.config, replica.term, replica.leader, replica.commit,
                      *(self._genesis.get(criterion) or (None, None)))
        if not replica.is_voter():
            return route
        if replica.defers_to_leader(self._now(), urge=urge):
            return route
        if await self.campaign(criterion):
            return self._replicas.get(criterion)
        return await self.route(criterion)

    # -- operator recovery -------------------------------------------------------------

    async def recover(self, criterion: bytes) -> ChainConfig:
        """Start a new epoch of a chain whose configuration lost its majority for good.

        Like Kafka's unclean leader election: events acknowledged by brokers
        that are gone, beyond what the longest surviving copy holds, are lost.
        Asks every member it can reach for its copy; this node must hold the
        longest. The new configuration keeps the surviving members and fills
        up with the nodes the overlay names; this node leads it at once, in a
        term above every term it learned of. Raises
        :class:`~ketten.errors.UsageError` when recovery is not allowed or
        this node does not hold the longest copy.
        """
        if not self.options.allow_recovery:
            raise UsageError("operator recovery is off: set the replication option "
                             "'allow_recovery' to true on this node (it can lose acknowledged "
                             "events)")
        replica = await self.replica(criterion)
        if replica is None or replica.config is None:
            raise UsageError(f"this node holds no replica of chain {criterion.hex()[:16]}")
        own = self.own()
        config = replica.config
        recovery = Recovery(own, config, replica.term)
        timeout = self.options.request_timeout
        for member in recovery.members_to_ask():
            address = self.sets.address(member)
            try:
                peer, reply = await self.rpc.call(address, Locate((criterion,)),
                                                  timeout=timeout, retransmit=True,
                                                  expect=member.key)
            except KettenError:
                continue
            if not recovery.located(member, peer.public_key,
                                    reply.routes[0] if reply.routes else None):
                continue
            try:
                _, fetched = await self.rpc.call(address, Fetch(criterion, replica.head, 1, False),
                                                 timeout=timeout, retransmit=True,
                                                 expect=member.key)
            except KettenError:
                continue
            recovery.compared(member, fetched.on and bool(fetched.events))
        if recovery.longer is not None:
            raise UsageError(f"{recovery.longer.address} holds a longer copy of chain "
                             f"{criterion.hex()[:16]}: recover there")
        # Fill up with the nodes nearest to the key that answer now.
        candidates = await self.sets.candidates(criterion, 3 * len(config.voters))
        for member in recovery.fill_from(candidates):
            if recovery.full():
                break
            try:
                peer, _ = await self.rpc.call(self.sets.address(member), Locate((criterion,)),
                                              timeout=timeout, retransmit=True)
            except KettenError:
                continue
            recovery.add(member, peer.public_key)
        async with self.chains.lock(criterion):
            head = replica.head
            new = recovery.configuration(head)
            replica.take_over(new, recovery.new_term, self._now())
            await self._save(replica)
        voters = new.voters
        self._counts["recoveries"] += 1
        self._events.warning(
            "chain_recovered",
            "%s: operator recovery of chain %s: epoch %d from this copy (head seq %s) in term "
            "%d, voters %s; events acknowledged by lost brokers beyond this copy are lost",
            own.address, criterion.hex()[:16], new.epoch, None if head is None else head[0],
            new.term, ", ".join(m.address for m in voters), key=f"recover:{criterion.hex()}",
            criterion=criterion.hex(), epoch=new.epoch, voters=[m.address for m in voters])
        self._reconfigs.pop(criterion, None)
        self._mark(replica)
        await self._advance(replica)
        self._signal(criterion)
        return new

    # -- leading: the senders ------------------------------------------------------------

    def _mark(self, replica: Replica) -> None:
        """Every member of ``replica`` may be owed an append now."""
        self._activity += 1
        if not replica.is_leader:
            return
        config = replica.config
        addresses = {m.key: m for m in config.members()} if config is not None else {}
        for key in replica.members_to_send():
            member = addresses.get(key) or self._learner_members.get(key)
            outbox = self._outboxes.get(key)
            if outbox is None:
                if member is None:
                    continue
                outbox = self._outboxes[key] = Outbox(
                    member, MAX_BATCH, max_delay=self.options.request_timeout,
                    lazy_delay=self.options.commit_notice)
            elif member is not None:
                outbox.member = member
            self._owe(outbox, replica, key)
            if key not in self._sending and self._spawn(self._send_loop, key):
                self._sending.add(key)

    def _owe(self, outbox: Outbox, replica: Replica, key: bytes) -> None:
        urgent = replica.urgent(key)
        outbox.owe(replica.criterion, lazy=not urgent, now=trio.current_time())
        wake = self._wakes.get(key)
        if urgent and wake is not None and not outbox.failures:
            wake.set()

    async def _send_loop(self, key: bytes) -> None:
        outbox = self._outboxes[key]
        try:
            while outbox:
                wait = outbox.delay(self.rng.random(), trio.current_time())
                if wait > 0:
                    # Only commit marks are owed (or the peer is backed off): wait, but
                    # wake for events owed in the meantime.
                    wake = self._wakes[key] = trio.Event()
                    with trio.move_on_after(wait):
                        await wake.wait()
                    del self._wakes[key]
                    if wake.is_set():
                        continue
                await self._send_batch(key, outbox)
        finally:
            self._sending.discard(key)
            self._wakes.pop(key, None)
            if not outbox and self._outboxes.get(key) is outbox:
                del self._outboxes[key]

    async def _send_batch(self, key: bytes, outbox: Outbox) -> None:
        budget = self.options.batch_bytes
        items: list[AppendItem] = []
        plans: list[tuple[Replica, AppendPlan]] = []
        notices: list[tuple[Replica, Pos]] = []
        for criterion in outbox.take():
            replica = self._replicas.get(criterion)
            if replica is None or not replica.is_leader:
                continue
            mark = replica.notice(key)
            if mark is not None:
                notices.append((replica, mark))
                continue
            plan = replica.plan(key)
            if plan is None:
                continue
            built = await self._build(replica, plan, max(budget, 1))
            if built is None:
                continue
            item, plan = built
            budget -= sum(len(e) for e in item.events)
            replica.sent(plan)
            items.append(item)
            plans.append((replica, plan))
        if notices:
            await self._send_notices(key, outbox, notices)
        if not items:
            return
        self._counts["append_requests"] += 1
        self._counts["appends_sent"] += sum(len(i.events) for i in items)
        try:
            _, reply = await self.rpc.call(self.sets.address(outbox.member), Append(tuple(items)),
                                           timeout=self.options.request_timeout, retransmit=True,
                                           expect=outbox.member.key)
        except KettenError as exc:
            _log.debug("append to %s failed: %s", outbox.member.address, exc)
            self._counts["peer_failures"] += 1
            for replica, _plan in plans:
                replica.send_failed(key)
            outbox.failed([r.criterion for r, _ in plans if r.is_leader])
            return
        acks = {a.criterion: a for a in reply.acks}
        for replica, plan in plans:
            await self._take_ack(replica, key, plan, acks.get(replica.criterion))
            if replica.is_leader and replica.plan(key) is not None:
                self._owe(outbox, replica, key)
        outbox.answered(len(plans), sum(1 for r, _ in plans
                                        if acks.get(r.criterion) is None
                                        or acks[r.criterion].status == "refused"))

    async def _send_notices(self, key: bytes, outbox: Outbox,
                            notices: list[tuple[Replica, Pos]]) -> None:
        """Commit marks alone go one way: no answer to wait for, nothing to send back."""
        notice = CommitNotice(tuple((r.criterion, r.state.term, mark) for r, mark in notices))
        try:
            await self.rpc.notify(self.sets.address(outbox.member), CommitNotice.SERVICE,
                                  notice.to_wire())
        except KettenError as exc:
            _log.debug("commit notice to %s failed: %s", outbox.member.address, exc)
            self._counts["peer_failures"] += 1
            outbox.failed([r.criterion for r, _ in notices if r.is_leader])
            return
        self._counts["commit_notices"] += len(notices)
        for replica, mark in notices:
            replica.noticed(key, mark)

    async def _take_commit_notice(self, peer: Peer, body: Any) -> None:
        for criterion, term, commit in CommitNotice.from_wire(body).items:
            # Only a chain in memory: a notice never loads one (it cannot concern a
            # chain this node has not followed lately).
            replica = self._replicas.get(criterion)
            if replica is None or replica.leader != peer.public_key:
                continue
            async with self.chains.lock(criterion):
                held = await self.chains.hash_at(criterion, commit[0])
                if replica.on_commit_notice(peer.public_key, term, commit, held) is not None:
                    self._commit_learned(criterion, commit)

    async def _farewell(self, member: Member, message: Retire) -> None:
        """Tell a broker a committed configuration left out to retire (one try: one
        that does not hear it is told again when its next digest lists the chain)."""
        with trio.move_on_after(self.options.request_timeout):
            try:
                await self.rpc.notify(self.sets.address(member), Retire.SERVICE,
                                      message.to_wire())
            except KettenError:
                pass

    async def _take_retire(self, peer: Peer, body: Any) -> None:
        for criterion, term, config, commit in Retire.from_wire(body).items:
            if criterion in self._members:  # only chains held here: nothing else is loaded
                await self._retire(peer.public_key, criterion, term, config, commit)

    async def _retire(self, sender: bytes, criterion: bytes, term: int, config: ChainConfig,
                      commit: Pos | None) -> None:
        """The chain's leader says it no longer needs this node (see
        :meth:`Replica.retired_by`): give up the replication state (the term and vote
        are kept) and keep what is known committed as a reader's copy, which the copy
        budget may drop."""
        async with self.chains.lock(criterion):
            replica = await self.replica(criterion)
            if (replica is None or criterion in self._campaigns
                    or not replica.retired_by(sender, term, config)):
                return
            keep = -1 if replica.commit is None else replica.commit[0]
            if (commit is not None and commit[0] > keep
                    and await self.chains.hash_at(criterion, commit[0]) == commit[1]):
                keep = commit[0]  # the hash chain makes everything up to it committed
            held, dropped = await self._release(replica, keep, retired=config.epoch)
        self._retired(criterion, config.epoch, held, dropped)

    async def _release(self, replica: Replica, keep: int, *, retired: int = 0) -> tuple[int, int]:
        """Give up the replication state of ``replica``'s chain (the term and vote are
        kept, and ``retired``: see :attr:`ChainState.retired`) and the events after seq
        ``keep``; what stays is a reader's copy. The caller holds the chain's lock.
        Returns the events kept and those cut off."""
        criterion = replica.criterion
        self._replicas.pop(criterion, None)
        self._given_up.add(replica)
        state = ChainState(term=replica.state.term, voted_for=replica.state.voted_for,
                           retired=max(retired, replica.state.retired))
        await self.chains.save_state(criterion, state)
        self._index(criterion, state)
        self._dirty_states.pop(criterion, None)
        self._reconfigs.pop(criterion, None)
        self.sets.forget(criterion)
        orphans = await self.chains.cut(criterion, keep + 1, [])
        head = await self.chains.head_pos(criterion)
        return 0 if head is None else head[0] + 1, len(orphans)

    def _retired(self, criterion: bytes, epoch: int, held: int, dropped: int) -> None:
        self._counts["retirements"] += 1
        self._events.info("retired", "%s: chain %s moved to configuration %d without this "
                          "node; it keeps %d committed events as a reader's copy (%d "
                          "uncommitted dropped)", self.own().address, criterion.hex()[:16],
                          epoch, held, dropped, criterion=criterion.hex(), epoch=epoch,
                          kept=held, dropped=dropped)
        self._copy_released(criterion, held)

    def _copy_released(self, criterion: bytes, held: int) -> None:
        for observer in self._released:
            observer(criterion, held)
        self._signal(criterion)

    async def _build(self, replica: Replica, plan: AppendPlan,
                     budget: int) -> tuple[AppendItem, AppendPlan] | None:
        criterion = replica.criterion
        prev: Pos | None = None
        if plan.prev >= 0:
            value = await self.chains.hash_at(criterion, plan.prev)
            if value is None:
                return None
            prev = (plan.prev, value)
        raws: list[bytes] = []
        last = plan.last
        if plan.last >= plan.first:
            raws, _ = await self.chains.read_batch(criterion, plan.first, budget,
                                                   stop=plan.last + 1)
            last = plan.first + len(raws) - 1
        reach = max(last, plan.prev)
        commit = plan.commit if plan.commit is not None and plan.commit[0] <= reach else None
        configs = tuple(c for c in plan.configs if c.at <= reach) or plan.configs[:1]
        plan = attrs.evolve(plan, last=last, commit=commit, configs=configs)
        return AppendItem(criterion, plan.term, plan.start, prev, tuple(raws), commit,
                          configs, await self.genesis(criterion)), plan

    async def _take_ack(self, replica: Replica, key: bytes, plan: AppendPlan,
                        ack: AppendAck | None) -> None:
        self._activity += 1
        if ack is None:
            replica.send_failed(key)
            return
        if ack.status == "conflict":
            replica.send_failed(key)
            address = self._address_of(replica, key)
            if address is not None:
                await self.settle_rival(replica.criterion, ack.genesis, address)
            return
        try:
            status = AckStatus(ack.status)
        except ValueError:
            replica.send_failed(key)
            return
        match = None
        if status is AckStatus.MISMATCH and ack.locator:
            hashes = await self.chains.hashes(replica.criterion, [s for s, _ in ack.locator])
            common = [s for s, h in ack.locator if hashes.get(s) == h]
            match = max(common) if common else None
        data = AppendAckData(status, ack.term, ack.log_term, ack.head, ack.epoch, ack.commit,
                             ack.reason)
        was_leader = replica.is_leader
        seq, persist = replica.on_append_ack(key, plan, data, self._now(), locator_match=match)
        if status is AckStatus.REFUSED:
            _log.debug("%s refused an append of %s: %s", key.hex()[:8],
                       replica.criterion.hex()[:16], ack.reason)
        if persist is not None:
            async with self.chains.lock(replica.criterion):
                await self._save(replica)
        if seq is not None:
            await self._advance(replica)
        if was_leader and replica.is_leader and replica.config is not None:
            reconfig = self._reconfigs.get(replica.criterion)
            if (reconfig is not None and reconfig.pending) or replica.reconfiguring():
                await self._reconfigure(replica)
        self._signal(replica.criterion)

    # -- moving chains ----------------------------------------------------------------

    async def _reconfigure(self, replica: Replica) -> None:
        """Carry out the next step of moving ``replica``'s chain (see
        :meth:`Replica.next_move` and :meth:`Replica.carry_out`)."""
        criterion = replica.criterion
        reconfig = self._reconfigs.get(criterion) or self._reconfigs.setdefault(
            criterion, Reconfiguration(self.own().key, self.options.hysteresis,
                                       self.options.catch_up_limit))
        decision = replica.next_move(reconfig, self._now(), self.sets.desired(criterion))
        if decision.change is Change.NOTHING:
            return
        configs_seen = replica.state.configs
        released: tuple[int, int] | None = None
        async with self.chains.lock(criterion):
            if replica.state.configs != configs_seen:
                return  # someone moved it meanwhile: decide again next time
            move = replica.carry_out(decision)
            self._learner_members.update((m.key, m) for m in move.learners)
            if move.persist is not None:
                await self._save(replica)
            if move.release is not None:
                released = await self._release(replica, move.release[0],
                                               retired=move.release[1])
            farewell = Retire(((criterion, replica.term, replica.config, replica.commit),)
                              ) if move.retire and replica.config is not None else None
        if move.release is not None and released is not None:
            self._retired(criterion, move.release[1], *released)
        if move.hand_over is not None:
            with trio.move_on_after(self.options.request_timeout):
                try:
                    await self.rpc.notify(self.sets.address(move.hand_over), "elect",
                                          {"c": criterion})
                except KettenError:
                    pass
        if move.proposed is not None:
            self._moved(criterion, move.proposed)
        if farewell is not None:
            for member in move.retire:
                self._spawn(self._farewell, member, farewell)
        if move.replicate:
            self._mark(replica)
            await self._advance(replica)
            self._signal(criterion)

    def _moved(self, criterion: bytes, config: ChainConfig) -> None:
        self._counts["reconfigurations"] += 1
        self._events.info("reconfiguration", "chain %s: configuration %d %s (voters %s)",
                          criterion.hex()[:16], config.epoch,
                          "joint" if config.joint else "in force",
                          ", ".join(m.address for m in config.voters),
                          criterion=criterion.hex(), epoch=config.epoch, joint=config.joint,
                          voters=[m.address for m in config.voters])

    # -- background ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the senders and run the background rounds until cancelled."""
        await self.load_all()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._flush_loop)
                for criterion in sorted(self._short):
                    nursery.start_soon(guarded, self.repair, criterion)
                task_status.started()
                interval = self.options.anti_entropy
                while True:
                    await trio.sleep(interval * (0.5 + self.rng.random()))
                    with trio.move_on_after(interval * 10):
                        await guarded(self.maintain)
        finally:
            self._nursery = None  # closed: background work is refused from now on

    def flush_soon(self) -> None:
        """Something to store: the flush loop writes it within ``commit_flush`` seconds."""
        self._flush_wanted.set()

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_wanted.wait()
            await trio.sleep(self.options.commit_flush)
            self._flush_wanted = trio.Event()  # before the flush: what it misses waits a turn
            await guarded(self.flush)

    async def flush(self) -> None:
        """Write the commit marks that moved since the last flush, and the chains this
        node learned to exist."""
        known = self.sets.known_bytes()
        if known is not None:
            try:
                await self.chains.store.put_cursor(_KNOWN_CURSOR, known)
            except StoreError as exc:
                _log.warning("cannot store the known chains: %s", exc)
        dirty, self._dirty_states = self._dirty_states, {}
        replicas = [r for r in map(self._replicas.get, dirty) if r is not None]

        async def save(replica: Replica) -> None:
            try:
                async with self.chains.lock(replica.criterion):
                    await self._save(replica)
            except StoreError as exc:
                _log.warning("cannot store the state of chain %s: %s",
                             replica.criterion.hex()[:16], exc)

        # Side by side, so that a store that commits in groups writes them together.
        for start in range(0, len(replicas), _FLUSH_GROUP):
            async with trio.open_nursery() as nursery:
                for replica in replicas[start:start + _FLUSH_GROUP]:
                    nursery.start_soon(save, replica)

    async def maintain(self) -> None:
        """One background round: moves, stand-ins for silent leaders, digests.

        A *full* round looks at every chain. It runs when the overlay's routing
        table or anything replicated here changed since the last round began,
        and every ``_FULL_ROUNDS`` rounds in any case; the rounds between look
        only at the chains the last full round found unsettled (a move watched
        or under way) and reuse each peer's digest, so an idle node's rounds
        cost per peer, not per chain.
        """
        self._counts["anti_entropy_rounds"] += 1
        now = self._now()
        for criterion in sorted(self._short):
            await self._refill(criterion)
        self._rounds += 1
        version = self.sets.routing_version()
        seen = (version, self._activity)
        full = version is None or seen != self._round_seen or self._rounds % _FULL_ROUNDS == 0
        self._round_seen = seen
        self._counts["full_rounds"] += full
        chains = list(self._members) if full else sorted(self._unsettled)
        unsettled: set[bytes] = set()
        leaders = ([r for r in self._replicas.values() if r.is_leader] if full else
                   [r for r in map(self._replicas.get, chains) if r is not None and r.is_leader])
        for replica in leaders:
            await self._reconfigure(replica)
            reconfig = self._reconfigs.get(replica.criterion)
            if (replica.reconfiguring() or not replica.config_committed()
                    or any(p.learner for p in replica.progress.values())
                    or (reconfig is not None and reconfig.pending)):
                unsettled.add(replica.criterion)
        unsettled |= await self._watch(now, chains)
        self._unsettled = unsettled
        await self._digests()

    async def _watch(self, now: float, chains: list[bytes]) -> set[bytes]:
        """Chains whose configuration the overlay no longer matches, with no leader
        moving them: after the hysteresis period, stand for leader (and move them).
        Returns those of ``chains`` that mismatch."""
        own = self.own().key
        watched: set[bytes] = set()
        for criterion in chains:
            voters = self._members.get(criterion)
            if voters is None:
                continue
            replica = self._replicas.get(criterion)
            mismatched = own in voters and (
                self.sets.desired_keys(criterion) != voters
                or (replica is not None and replica.reconfiguring()))
            if mismatched:
                watched.add(criterion)
            if not self._watch_moves.due(criterion, now, mismatched=mismatched):
                continue
            replica = await self.replica(criterion)
            if (replica is None or replica.is_leader or replica.leader_active(now)
                    or criterion in self._campaigns or self._nursery is None):
                continue
            self._watch_moves.stood(criterion, now)
            self._spawn(self._stand_in, criterion)
        return watched

    async def _stand_in(self, criterion: bytes) -> None:
        """The leader has been silent while the chain should move: if it does not
        answer (an idle leader is not a dead one), stand for leader."""
        replica = self._replicas.get(criterion)
        if replica is None:
            return
        leader = replica.leader
        config = replica.config
        if leader is not None and config is not None:
            address = config.address_of(leader)
            if address is not None:
                try:
                    _, reply = await self.rpc.call(
                        self.sets.address(Member(leader, address)), CommitQuery(criterion),
                        timeout=self.options.request_timeout, retransmit=True, expect=leader)
                    if reply.kind == "commit":
                        return  # alive and leading: it moves the chain
                except KettenError:
                    pass
        await self._campaign_quietly(criterion, False)

    # -- anti-entropy ----------------------------------------------------------------------

    def _shared(self) -> dict[bytes, list[bytes]]:
        """Per peer key, the chains this node shares with it (sorted). Worked out again
        only after a chain's members changed here."""
        if self._shared_cache is not None:
            return self._shared_cache
        own = self.own().key
        out: dict[bytes, list[bytes]] = {}
        for criterion, voters in self._members.items():
            if own not in voters:
                continue
            for key in voters:
                if key != own:
                    out.setdefault(key, []).append(criterion)
        for chains in out.values():
            chains.sort()
        self._shared_cache = out
        return out

    def _entry(self, criterion: bytes) -> tuple[bytes, int, int]:
        replica = self._replicas.get(criterion)
        if replica is None:
            return criterion, 0, -1
        commit = replica.commit
        return criterion, replica.state.epoch, -1 if commit is None else commit[0]

    async def _peer_buckets(self, key: bytes, chains: list[bytes]) -> tuple[bytes, ...]:
        """The digest buckets of ``chains`` (those shared with peer ``key``)."""
        if not self._sync.fresh(key, chains, self._activity):
            for criterion in chains:
                await self.replica(criterion)
        return self._sync.buckets_for(key, chains, self._activity, self._entry,
                                      peers=len(self._shared()), held=len(self._members))

    def _elsewhere(self, criterion: bytes) -> tuple[bytes, int, int] | None:
        """Where this node stands on a chain a peer believes they share."""
        if criterion in self._members:
            return self._entry(criterion)
        if criterion in self._lost:
            return criterion, 0, -1  # given up (epoch 0: none of ours); a Locate tells more
        return None

    async def _serve_digest(self, peer: Peer, request: Digest) -> DigestReply:
        shared = self._shared().get(peer.public_key, [])
        if not request.wanted:
            return DigestReply(await self._peer_buckets(peer.public_key, shared))
        farewells: list[tuple[bytes, int, ChainConfig, Pos | None]] = []

        def elsewhere(criterion: bytes) -> tuple[bytes, int, int] | None:
            item = self._farewell_item(criterion, peer.public_key)
            if item is not None and len(farewells) < MAX_BATCH:
                farewells.append(item)
            return self._elsewhere(criterion)

        reply, behind = self._sync.answer_listing(request, shared, self._entry, elsewhere)
        if farewells:
            # A former member that missed its retire message still lists the chain.
            self._spawn(self._farewell, Member(peer.public_key, peer.address),
                        Retire(tuple(farewells)))
        await self._pull_ahead(peer, behind)
        return reply

    def _farewell_item(self, criterion: bytes,
                       key: bytes) -> tuple[bytes, int, ChainConfig, Pos | None] | None:
        """What tells ``key`` to retire from ``criterion``, if this node leads it with a
        committed configuration (the only one it holds) that leaves ``key`` out."""
        replica = self._replicas.get(criterion)
        if (replica is None or not replica.is_leader or len(replica.state.configs) != 1
                or not replica.config_committed()):
            return None
        config = replica.config
        if config is None or config.is_voter(key):
            return None
        return criterion, replica.term, config, replica.commit

    async def _digests(self) -> None:
        shared = self._shared()
        if not shared or self._nursery is None:
            return
        async with trio.open_nursery() as nursery:
            for key in self._sync.due(shared, self._rounds, self._activity):
                nursery.start_soon(guarded, self._digest_with, key, shared[key])

    async def _peer_member(self, key: bytes, chains: list[bytes]) -> Member | None:
        """Peer ``key`` with the address a configuration of one of ``chains`` gives it."""
        for criterion in chains:
            replica = self._replicas.get(criterion)
            config = None if replica is None else replica.config
            address = None if config is None else config.address_of(key)
            if address is not None:
                return Member(key, address)
        state = await self.chains.state(chains[0])
        address = state.config.address_of(key) if state and state.config else None
        return None if address is None else Member(key, address)

    async def _digest_with(self, key: bytes, chains: list[bytes]) -> None:
        round_, activity = self._rounds, self._activity
        member = await self._peer_member(key, chains)
        if member is None:
            return
        sync = self._sync.start(key, chains, await self._peer_buckets(key, chains),
                                round_, activity)
        self._counts["digests_sent"] += 1
        address = self.sets.address(member)
        try:
            peer, reply = await self.rpc.call(address, sync.request(),
                                              timeout=self.options.request_timeout,
                                              retransmit=True, expect=key)
            listing = sync.on_buckets(peer.public_key, reply, self._entry)
            if listing is None:
                return
            _, listed = await self.rpc.call(address, listing,
                                            timeout=self.options.request_timeout,
                                            retransmit=True)
        except KettenError:
            self._counts["peer_failures"] += 1
            sync.failed()
            return
        await self._pull_ahead(peer, list(listed.entries))

    async def _pull_ahead(self, peer: Peer, entries: list[tuple[bytes, int, int]]) -> None:
        """Copy committed events from ``peer`` for every listed chain where it is ahead."""
        for criterion, epoch, commit in entries:
            replica = await self.replica(criterion)
            if replica is None:
                continue
            if epoch != replica.state.epoch:
                await self._compare_genesis(peer, criterion)
                replica = self._replicas.get(criterion)
                if replica is None:
                    continue
                if replica.abandoned(epoch, commit):
                    await self._leave_abandoned(criterion, epoch, commit)
                    await self.pull_committed(peer.address, criterion)
                    continue
            mine = -1 if replica.commit is None else replica.commit[0]
            if commit <= mine:
                continue
            await self.pull_committed(peer.address, criterion)

    async def _leave_abandoned(self, criterion: bytes, epoch: int, commit: int) -> None:
        """The configuration that made this node a broker of ``criterion`` was abandoned
        (see :meth:`Replica.abandoned`): give up the replication state (the term and
        vote are kept) and the events beyond the commit mark, which were appended
        under it; what is committed stays, a plain copy the members extend."""
        async with self.chains.lock(criterion):
            replica = self._replicas.get(criterion)
            if replica is None or not replica.abandoned(epoch, commit):
                return
            keep = -1 if replica.commit is None else replica.commit[0]
            pending = replica.state.configs[1]
            held, dropped = await self._release(replica, keep)
        self._events.info("reconfiguration_abandoned",
                          "%s: configuration %d of %s (made at seq %d) was abandoned; the chain "
                          "is committed beyond it in configuration %d: this node is no broker "
                          "of it (%d uncommitted events dropped)", self.own().address,
                          pending.epoch, criterion.hex()[:16], pending.at, epoch, dropped,
                          criterion=criterion.hex(), epoch=pending.epoch, in_force=epoch,
                          dropped=dropped)
        self._copy_released(criterion, held)

    async def _compare_genesis(self, peer: Peer, criterion: bytes) -> None:
        """``peer`` knows ``criterion`` in another epoch: if that chain is another
        instance of the criterion (started twice), settle which one stays (asking a
        member of it for its genesis)."""
        try:
            _, reply = await self.rpc.call(peer.address, Locate((criterion,)),
                                           timeout=self.options.request_timeout,
                                           retransmit=True)
        except KettenError:
            self._counts["peer_failures"] += 1
            return
        route = reply.routes[0] if reply.routes else None
        if route is None or route.genesis is None or route.genesis == await self.genesis(
                criterion):
            return
        own = self.own().key
        holders = [m for m in route.config.members() if m.key != own]
        holders.sort(key=lambda m: m.key != peer.public_key)
        if holders:
            await self.settle_rival(criterion, route.genesis, self.sets.address(holders[0]),
                                    (route.config,))

    async def quarantine(self, criterion: bytes, seq: int) -> None:
        """The store found ``criterion`` damaged at ``seq``: give the chain up from
        there and fetch it again from its members.

        A leader steps down first: it must never extend a chain it lost part
        of. The store's ``quarantine`` (when it has one) cuts the chain back
        and reports the range; the replica is loaded again with the shorter
        head, so it votes only for candidates holding its commit mark, and the
        background rounds ask the leader for the rest until it is back.
        """
        cut = getattr(self.chains.store, "quarantine", None)
        if cut is None or criterion in self._short:
            return
        self._short.add(criterion)
        async with self.chains.lock(criterion):
            stale = self._replicas.pop(criterion, None)
            if stale is not None:
                stale.resign()
            await cut(criterion, seq)
            self.chains.forget(criterion)
            self._counts["quarantines"] += 1
        await self.replica(criterion)
        self._signal(criterion)

    async def _refill(self, criterion: bytes) -> None:
        """Ask again for the committed events the store lost, until it holds them."""
        replica = await self.replica(criterion)
        head = await self.chains.head_pos(criterion)
        if (replica is None or replica.commit is None
                or (head is not None and head[0] >= replica.commit[0])):
            self._short.discard(criterion)
            return
        await self.repair(criterion)

    async def repair(self, criterion: bytes) -> None:
        """This node's copy of a chain it is a member of is behind: ask the leader to
        bring it in line (a confirmation round sends every member what it lacks)."""
        now = self._now()
        if now - self._repairs.get(criterion, float("-inf")) < self.options.request_timeout:
            return
        if len(self._repairs) > _MAX_LOADED:
            self._repairs.clear()
        self._repairs[criterion] = now
        replica = await self.replica(criterion)
        if replica is None or replica.config is None or replica.is_leader:
            return
        config = replica.config
        leader = replica.leader
        targets = [m for m in config.members() if m.key == leader] or [
            m for m in config.members() if m.key != self.own().key]
        for member in targets[:2]:
            try:
                _, reply = await self.rpc.call(
                    self.sets.address(member), CommitQuery(criterion, urge=leader is None),
                    timeout=self.options.request_timeout, retransmit=True, expect=member.key)
            except KettenError:
                self._counts["peer_failures"] += 1
                continue
            if reply.kind == "commit":
                return

    async def fetch_committed(self, address: str, criterion: bytes, after: Pos | None,
                              until: Pos) -> list[Any]:
        """The committed events ``address`` holds after ``after`` up to ``until``, verified,
        stored nowhere (a read on a member that is behind)."""
        out: list[Any] = []
        prev: Pos | None = after
        while prev is None or prev[0] < until[0]:
            _, reply = await self.rpc.call(
                address, Fetch(criterion, prev, self.options.batch_bytes, True),
                timeout=self.options.request_timeout, retransmit=True)
            if not reply.on or not reply.events:
                break
            events = [self.chains.decode(raw, criterion, where="fetch reply")
                      for raw in reply.events]
            await self.chains.verify_run(criterion, prev, events)
            out.extend(e for e in events if e.seq <= until[0])
            prev = (events[-1].seq, events[-1].hash)
            if not reply.more:
                break
        return out

    async def pull_committed(self, address: str, criterion: bytes, *,
                             strict: bool = False) -> int:
        """Copy the committed events ``address`` holds beyond our copy, and its commit mark.

        Only for copies this node is not a member of (a reader's cache): only
        committed events are taken, so this is safe without the leader. For a
        chain replicated here the leader is asked to resend instead. Returns
        how many events were added. ``strict``: a peer that does not answer raises
        instead of ending the pull.
        """
        if self.holds(criterion):
            await self.repair(criterion)
            return 0
        added = 0
        while True:
            head = await self.chains.head_pos(criterion)
            try:
                _, reply = await self.rpc.call(
                    address, Fetch(criterion, head, self.options.batch_bytes, True),
                    timeout=self.options.request_timeout, retransmit=True)
            except KettenError:
                self._counts["peer_failures"] += 1
                if strict:
                    raise
                return added
            if not reply.on:
                return added
            try:
                events = [self.chains.decode(raw, criterion, where="fetch reply")
                          for raw in reply.events]
                fresh = await self.chains.accept_committed(criterion, events)
                added += fresh
                self._counts["events_synced"] += fresh
            except (DecodeError, InvalidEvent):
                self._counts["peer_failures"] += 1  # counted as invalid; nothing of it is kept
                return added
            if reply.commit is not None:
                async with self.chains.lock(criterion):
                    replica = self._replicas.get(criterion)
                    if replica is not None:
                        held = await self.chains.hash_at(criterion, reply.commit[0])
                        if held == reply.commit[1] and replica.on_commit_learned(
                                reply.commit) is not None:
                            self._commit_learned(criterion, reply.commit)
            if not reply.more or not events:
                return added
