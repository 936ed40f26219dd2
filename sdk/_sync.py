"""Sync, fork resolution and anti-entropy: the trio driver of the replica set.

Wire services (bodies are CBOR maps; a ``pair`` is ``[seq, hash]`` or null):

* ``probe``  ``{c, a: pair}`` -> ``{h: head pair, k: commit pair, on: bool, n: hash|null}``:
  is ``a`` on your main chain, and what follows it?
* ``fetch``  ``{c, a: pair, m: max bytes}`` -> ``{on: bool, e: [event bytes], more: bool}``:
  the events after ``a``, in a batch bounded in bytes.
* ``locate`` ``{c, l: [pair, ...]}`` -> ``{m: seq|null}``: the highest locator entry on your
  chain (the peer side of :class:`~ketten._chain.AncestorSearch`).
* ``heads``  ``{cs: [criterion, ...]}`` -> ``{h: [pair, ...]}``: anti-entropy digests.
* one-way ``nudge``  ``{c}``: "you are behind on ``c``, pull it".

The decisions are made by :mod:`._replication`; this module only asks peers,
verifies what they send, and writes the store.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._core.chain import AncestorSearch, Verify, WriterPolicy, check_successor
from ._core.event import Event
from ._replication import OtherBranch, choose_at, majority
from ._wire import field
from .errors import (
    DecodeError,
    InvalidEvent,
    KettenError,
    ProtocolError,
    QuorumUnavailable,
    StoreError,
)
from .interfaces import Peer, Store

if TYPE_CHECKING:
    from ._node import Node

__all__ = ["Probe", "ReplicationStatistics", "Replicator"]

Pair = tuple[int, bytes]
_MAX_ROUNDS = 16
_MAX_LOCATOR = 256
_MAX_HEADS = 4096
_FETCH_PAGE = 256


def encode_pair(value: Pair | Event | None) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, Event):
        return [value.seq, value.hash]
    return [value[0], value[1]]


def decode_pair(value: Any, *, where: str) -> Pair | None:
    if value is None:
        return None
    if (
        type(value) is not list
        or len(value) != 2
        or type(value[0]) is not int
        or value[0] < 0
        or type(value[1]) is not bytes
        or len(value[1]) != 32
    ):
        raise DecodeError("expected [seq, 32-byte hash] or null", where=where)
    return value[0], value[1]


def criterion_of(body: Any, where: str) -> bytes:
    key: bytes = field(body, "c", bytes, where=where)
    if len(key) != 32:
        raise DecodeError("criterion must be 32 bytes", where=where)
    return key


@attrs.frozen
class Probe:
    """A peer's answer to ``probe``."""

    head: Pair | None
    commit: Pair | None
    on: bool
    next: bytes | None


@attrs.frozen
class ReplicationStatistics:
    """Counters of a node's replication (see :meth:`Replicator.statistics`)."""

    syncs: int
    events_synced: int
    forks_resolved: int
    events_orphaned: int
    nudges_sent: int
    anti_entropy_rounds: int
    peer_failures: int


def _tally(
    probes: list[tuple[Peer, Probe]], position: int, heights: dict[bytes, int]
) -> tuple[dict[bytes, bytes | None], dict[bytes, int], dict[bytes, Peer], bytes | None]:
    """What the probed peers hold at ``position``: their votes, the height of each
    candidate branch (starting from ``heights``), a peer holding each candidate,
    and the candidate a peer reports as committed."""
    votes: dict[bytes, bytes | None] = {}
    holders: dict[bytes, Peer] = {}
    committed: bytes | None = None
    for peer, probe in probes:
        if not probe.on:
            votes[peer.node_id] = OtherBranch(peer.node_id)
            continue
        votes[peer.node_id] = probe.next
        if probe.next is None:
            continue
        height = probe.head[0] if probe.head is not None else position
        if height >= heights.get(probe.next, -1):
            heights[probe.next] = height
            holders[probe.next] = peer
        if probe.commit is not None and probe.commit[0] >= position:
            committed = probe.next
    return votes, heights, holders, committed


async def read_batch(store: Store, criterion: bytes, start: int,
                     budget: int) -> tuple[list[bytes], bool]:
    """Encoded main-chain events from ``start`` on, at most ``budget`` bytes
    (but at least one event); and whether more follow."""
    out: list[bytes] = []
    used = 0
    while True:
        page = await store.range(criterion, start, start + _FETCH_PAGE)
        for event in page:
            raw = event.to_bytes()
            if out and used + len(raw) > budget:
                return out, True
            out.append(raw)
            used += len(raw)
        if len(page) < _FETCH_PAGE:
            return out, False
        start += _FETCH_PAGE


@attrs.define(eq=False)
class Replicator:
    """Keeps this node's copies of the chains it brokers in line with the replica set."""

    node: Node
    interval: float = 2.0
    replica_ttl: float = 1.0
    _commits: dict[bytes, Pair] = attrs.field(factory=dict, init=False)
    _claims: dict[bytes, Pair] = attrs.field(factory=dict, init=False)
    _replica_cache: dict[bytes, tuple[float, list[Peer]]] = attrs.field(factory=dict, init=False)
    _nudged: dict[bytes, None] = attrs.field(factory=dict, init=False)
    _nudge_send: trio.MemorySendChannel[bytes] = attrs.field(init=False)
    _nudge_recv: trio.MemoryReceiveChannel[bytes] = attrs.field(init=False)
    _rng: random.Random = attrs.field(init=False)
    _counts: dict[str, int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._nudge_send, self._nudge_recv = trio.open_memory_channel[bytes](1024)
        self._rng = random.Random(self.node.identity.node_id)
        self._counts = dict.fromkeys(attrs.fields_dict(ReplicationStatistics), 0)
        node = self.node
        node.register_service("probe", self._serve_probe)
        node.register_service("fetch", self._serve_fetch)
        node.register_service("locate", self._serve_locate)
        node.register_service("heads", self._serve_heads)
        node.register_message_service("nudge", self._take_nudge)

    def statistics(self) -> ReplicationStatistics:
        return ReplicationStatistics(**self._counts)

    @property
    def rng(self) -> random.Random:
        return self._rng

    # -- replica sets ------------------------------------------------------

    @property
    def self_peer(self) -> Peer:
        return Peer(self.node.address, self.node.identity.public_key)

    def is_self(self, peer: Peer) -> bool:
        return peer.public_key == self.node.identity.public_key

    async def replicas(self, key: bytes) -> list[Peer]:
        """The ``r`` brokers of ``key`` as the overlay sees them now (this node if it has none)."""
        overlay = self.node.overlay
        if overlay is None:
            return [self.self_peer]
        now = trio.current_time()
        cached = self._replica_cache.get(key)
        if cached is not None and now - cached[0] < self.replica_ttl:
            return cached[1]
        peers = list(await overlay.closest(key, self.node.config.replication))
        if len(self._replica_cache) > 4096:
            self._replica_cache.clear()
        self._replica_cache[key] = (now, peers)
        return peers

    def others(self, replicas: Sequence[Peer]) -> list[Peer]:
        return [p for p in replicas if not self.is_self(p)]

    # -- commit marks ------------------------------------------------------

    def claim_commit(self, criterion: bytes, mark: Pair) -> None:
        """Note that ``mark`` was reported acknowledged by a majority.

        Costs no store access: the claim is checked against the chain only
        when it is used (:meth:`commit_mark`).
        """
        known = self._claims.get(criterion)
        if known is None or known[0] < mark[0]:
            verified = self._commits.get(criterion)
            if verified is None or verified[0] < mark[0]:
                self._claims[criterion] = mark

    async def commit_mark(self, criterion: bytes) -> Pair | None:
        """The highest commit mark known to be on our chain of ``criterion``."""
        claim = self._claims.get(criterion)
        if claim is not None:
            held = await self._hash_at(criterion, claim[0])
            if held is not None:
                if self._claims.get(criterion) == claim:
                    del self._claims[criterion]
                verified = self._commits.get(criterion)
                if held == claim[1] and (verified is None or verified[0] < claim[0]):
                    self._commits[criterion] = claim
        return self._commits.get(criterion)

    # -- serving -----------------------------------------------------------

    async def _hash_at(self, criterion: bytes, seq: int) -> bytes | None:
        found = await self.node.store.range(criterion, seq, seq + 1)
        return found[0].hash if found else None

    async def _serve_probe(self, peer: Peer, body: Any) -> Any:
        criterion = criterion_of(body, "probe")
        anchor = decode_pair(body.get("a"), where="probe")
        store = self.node.store
        head = await store.head(criterion)
        on = True
        following: bytes | None = None
        if anchor is None:
            following = await self._hash_at(criterion, 0)
        else:
            found = await store.range(criterion, anchor[0], anchor[0] + 2)
            on = bool(found) and found[0].hash == anchor[1]
            if on and len(found) > 1:
                following = found[1].hash
        return {
            "h": encode_pair(head),
            "k": encode_pair(await self.commit_mark(criterion)),
            "on": on,
            "n": following,
        }

    async def _serve_fetch(self, peer: Peer, body: Any) -> Any:
        criterion = criterion_of(body, "fetch")
        anchor = decode_pair(body.get("a"), where="fetch")
        budget = min(field(body, "m", int, where="fetch"), self.node.config.sync_batch_bytes)
        store = self.node.store
        start = 0
        if anchor is not None:
            if await self._hash_at(criterion, anchor[0]) != anchor[1]:
                return {"on": False, "e": [], "more": False}
            start = anchor[0] + 1
        out, more = await read_batch(store, criterion, start, budget)
        return {"on": True, "e": out, "more": more}

    async def _serve_locate(self, peer: Peer, body: Any) -> Any:
        criterion = criterion_of(body, "locate")
        entries = field(body, "l", list, where="locate")
        if len(entries) > _MAX_LOCATOR:
            raise DecodeError(f"a locator may hold at most {_MAX_LOCATOR} entries", where="locate")
        best: int | None = None
        for raw in entries:
            entry = decode_pair(raw, where="locate")
            if entry is None:
                raise DecodeError("locator entries must not be null", where="locate")
            if (best is None or entry[0] > best) and await self._hash_at(
                criterion, entry[0]
            ) == entry[1]:
                best = entry[0]
        return {"m": best}

    async def _serve_heads(self, peer: Peer, body: Any) -> Any:
        keys = field(body, "cs", list, where="heads")
        if len(keys) > _MAX_HEADS:
            raise DecodeError(f"at most {_MAX_HEADS} criteria per request", where="heads")
        out: list[Any] = []
        for key in keys:
            if type(key) is not bytes or len(key) != 32:
                raise DecodeError("criteria must be 32-byte keys", where="heads")
            out.append(encode_pair(await self.node.store.head(key)))
        return {"h": out}

    async def _take_nudge(self, peer: Peer, body: Any) -> None:
        criterion = criterion_of(body, "nudge")
        if criterion in self._nudged:
            return
        try:
            self._nudge_send.send_nowait(criterion)
        except trio.WouldBlock:
            return
        self._nudged[criterion] = None

    # -- asking peers ------------------------------------------------------

    async def _ask(self, peer: Peer, service: str, body: Any, timeout: float) -> Any:
        """The peer's reply, or ``None`` if it did not answer usefully."""
        try:
            # Sync requests are reads: repeating one that got lost is safe.
            return await self.node.call(peer.address, service, body, timeout=timeout,
                                        retransmit=True)
        except KettenError:
            self._counts["peer_failures"] += 1
            return None

    async def probe(self, peer: Peer, criterion: bytes, anchor: Pair | None,
                    timeout: float) -> Probe | None:
        reply = await self._ask(peer, "probe", {"c": criterion, "a": encode_pair(anchor)}, timeout)
        if reply is None:
            return None
        try:
            nxt = field(reply, "n", (bytes, type(None)), where="probe reply")
            if nxt is not None and len(nxt) != 32:
                raise DecodeError("n must be a 32-byte hash", where="probe reply")
            return Probe(
                head=decode_pair(reply.get("h"), where="probe reply"),
                commit=decode_pair(reply.get("k"), where="probe reply"),
                on=field(reply, "on", bool, where="probe reply"),
                next=nxt,
            )
        except DecodeError:
            self._counts["peer_failures"] += 1
            return None

    async def _probe_all(self, criterion: bytes, peers: Sequence[Peer], anchor: Pair | None,
                         timeout: float) -> list[tuple[Peer, Probe]]:
        results: list[Probe | None] = [None] * len(peers)

        async def one(i: int, peer: Peer) -> None:
            results[i] = await self.probe(peer, criterion, anchor, timeout)

        async with trio.open_nursery() as nursery:
            for i, peer in enumerate(peers):
                nursery.start_soon(one, i, peer)
        return [(p, r) for p, r in zip(peers, results, strict=True) if r is not None]

    # -- sync --------------------------------------------------------------

    async def sync(self, criterion: bytes, *, quorum: bool) -> Event | None:
        """Bring the local chain of ``criterion`` in line with its replica set.

        Returns the local head afterwards. With ``quorum``, raises
        :class:`~ketten.errors.QuorumUnavailable` unless a majority of the
        ``r`` brokers (this node included, if it is one) took part.
        """
        replicas = await self.replicas(criterion)
        peers = self.others(replicas)
        # The lock also holds off this node's answers to publishes of the
        # criterion, so a peer that does not answer must not keep it long:
        # a quarter of the request timeout per round, with retransmissions.
        async with self.node._lock(criterion):
            answered = await self.sync_locked(
                criterion, peers, timeout=self.node.config.request_timeout / 4
            )
        reached = answered + (len(replicas) - len(peers))
        need = majority(self.node.config.replication)
        if quorum and reached < need:
            raise QuorumUnavailable(
                f"only {reached} of the {self.node.config.replication} brokers of criterion "
                f"{criterion.hex()[:16]} answered; a majority ({need}) is needed"
            )
        return await self.node.store.head(criterion)

    async def sync_locked(self, criterion: bytes, peers: Sequence[Peer], *,
                          timeout: float) -> int:
        """Sync with ``peers`` while holding the criterion's lock; return how many answered."""
        self._counts["syncs"] += 1
        kept: dict[bytes, None] = {}
        answered = 0
        self.node.forget_head(criterion)
        for _ in range(_MAX_ROUNDS):
            head = await self.node.store.head(criterion)
            anchor = (head.seq, head.hash) if head is not None else None
            probes = await self._probe_all(criterion, peers, anchor, timeout)
            answered = max(answered, len(probes))
            for _peer, probe in probes:
                if probe.commit is not None:
                    self.claim_commit(criterion, probe.commit)
            diverged = [(p, pr) for p, pr in probes if not pr.on and p.node_id not in kept]
            if diverged and head is not None:
                peer = diverged[0][0]
                if not await self._resolve_fork(criterion, head, peer, peers, timeout):
                    kept[peer.node_id] = None
                continue
            ahead = [(p, pr) for p, pr in probes if pr.on and pr.next is not None]
            if not ahead or not await self._extend(criterion, head, probes, timeout):
                break
            if not diverged:
                # Done if every peer that answered is now level with us or behind.
                top = await self.node.store.head(criterion)
                if top is not None and all(
                    pr.head is None or pr.head[0] < top.seq or pr.head[1] == top.hash
                    for _p, pr in probes
                ):
                    break
        return answered

    async def _extend(self, criterion: bytes, head: Event | None,
                      probes: list[tuple[Peer, Probe]], timeout: float) -> bool:
        """We hold nothing after our head; peers do. Join the best branch."""
        position = 0 if head is None else head.seq + 1
        votes, heights, holders, committed = _tally(probes, position, {})
        winner = choose_at(votes, own=None, replication=self.node.config.replication,
                           heights=heights, committed=committed)
        if winner is None or winner not in holders:
            return False
        anchor = (head.seq, head.hash) if head is not None else None
        return await self._fetch_into(criterion, holders[winner], anchor, head,
                                      replace=False, expect=winner, timeout=timeout) > 0

    async def _resolve_fork(self, criterion: bytes, head: Event, peer: Peer,
                            peers: Sequence[Peer], timeout: float) -> bool:
        """``peer``'s chain split from ours: find where, count votes, maybe switch."""
        common = await self._common_ancestor(criterion, head, peer, timeout)
        if common is False:
            return False
        store = self.node.store
        if common is None:
            position, anchor, base = 0, None, None
        else:
            found = await store.range(criterion, common, common + 1)
            if not found:
                return False
            base = found[0]
            position, anchor = common + 1, (base.seq, base.hash)
        own = await self._hash_at(criterion, position)
        if own is None:
            return False
        # Giving up events is decided twice, on two independent rounds of votes,
        # so that one stale or reordered answer cannot make us drop a branch.
        first = await self._vote(criterion, peers, anchor, position, own, head, timeout)
        if first is None:
            return False
        second = await self._vote(criterion, peers, anchor, position, own, head, timeout)
        if second is None or second[0] != first[0]:
            return False
        winner, holder = second
        return await self._fetch_into(criterion, holder, anchor, base, replace=True,
                                      expect=winner, timeout=timeout) > 0

    async def _vote(self, criterion: bytes, peers: Sequence[Peer], anchor: Pair | None,
                    position: int, own: bytes, head: Event,
                    timeout: float) -> tuple[bytes, Peer] | None:
        """Ask every peer what it holds at ``position``; the event to switch to, if any."""
        probes = await self._probe_all(criterion, peers, anchor, timeout)
        votes, heights, holders, committed = _tally(probes, position, {own: head.seq})
        mark = await self.commit_mark(criterion)
        own_committed = mark is not None and mark[0] >= position
        winner = choose_at(votes, own=own, replication=self.node.config.replication,
                           heights=heights, committed=committed, own_committed=own_committed)
        if winner is None or winner not in holders:
            return None
        return winner, holders[winner]

    async def _common_ancestor(self, criterion: bytes, head: Event, peer: Peer,
                               timeout: float) -> int | bool | None:
        """The seq of the last event we share with ``peer``; ``None`` if not even the
        genesis; ``False`` if the search failed."""
        known: dict[int, bytes] = {}
        missing: list[int] = []

        def hash_at(seq: int) -> bytes:
            value = known.get(seq)
            if value is None:
                missing.append(seq)
                return b""
            return value

        search = AncestorSearch(hash_at=hash_at, height=head.seq + 1)
        while not search.done:
            missing.clear()
            search.next_locator()
            for seq in list(missing):
                value = await self._hash_at(criterion, seq)
                if value is None:
                    return False
                known[seq] = value
            locator = search.next_locator()
            reply = await self._ask(peer, "locate", {
                "c": criterion, "l": [encode_pair(e) for e in locator]}, timeout)
            if reply is None:
                return False
            try:
                match = field(reply, "m", (int, type(None)), where="locate reply")
                search.feed(match)
            except DecodeError:
                self._counts["peer_failures"] += 1
                return False
        return search.result

    async def _fetch_into(self, criterion: bytes, holder: Peer, anchor: Pair | None,
                          base: Event | None, *, replace: bool, expect: bytes,
                          timeout: float) -> int:
        """Pull ``holder``'s events after ``anchor``, verify them, store them.

        The first event must be ``expect`` (what the votes were about: the
        holder may have switched branches since). With ``replace``, the first
        batch replaces our events after the anchor (they become orphans).
        Returns how many events were stored.
        """
        node = self.node
        store = node.store
        position = 0 if anchor is None else anchor[0] + 1
        policy: WriterPolicy | None = None
        if position > 0:
            policy = await node.policy(criterion)
        prev = base
        stored = 0
        first = True
        while True:
            reply = await self._ask(holder, "fetch", {
                "c": criterion, "a": encode_pair(anchor), "m": node.config.sync_batch_bytes,
            }, timeout)
            if reply is None:
                break
            try:
                events, more = self._decode_batch(reply, criterion, prev, policy)
            except (DecodeError, InvalidEvent, ProtocolError):
                self._counts["peer_failures"] += 1
                node._counts["invalid_events"] += 1
                break
            if not events or (first and events[0].hash != expect):
                break
            if events[0].seq == 0:
                policy = WriterPolicy.of(events[0])
            try:
                with trio.CancelScope(shield=True):
                    if first and replace:
                        orphaned = await store.replace_from(criterion, position, events)
                        node._policies.pop(criterion, None)
                        self._counts["forks_resolved"] += 1
                        self._counts["events_orphaned"] += len(orphaned)
                        node.plugins.hook.ketten_fork_resolved(
                            node=node, criterion=criterion, orphaned=orphaned, head=events[-1])
                    else:
                        await store.append(events)
                    node.appended(events)
            except StoreError:
                break
            self._counts["events_synced"] += len(events)
            stored += len(events)
            first = False
            prev = events[-1]
            anchor = (prev.seq, prev.hash)
            if not more:
                break
        return stored

    def _decode_batch(self, reply: Any, criterion: bytes, prev: Event | None,
                      policy: WriterPolicy | None) -> tuple[list[Event], bool]:
        node = self.node
        if not field(reply, "on", bool, where="fetch reply"):
            return [], False
        raw_events = field(reply, "e", list, where="fetch reply")
        more = field(reply, "more", bool, where="fetch reply")
        events: list[Event] = []
        for raw in raw_events:
            if type(raw) is not bytes:
                raise DecodeError("events must be byte strings", where="fetch reply")
            event = Event.from_bytes(raw, max_size=node.config.max_event_size)
            if event.criterion != criterion:
                raise ProtocolError("a fetch reply held an event of another criterion")
            check_successor(prev, event, policy=policy, verify=Verify.FULL)
            if event.seq == 0:
                policy = WriterPolicy.of(event)
            events.append(event)
            prev = event
        node._counts["events_received"] += len(events)
        clock = node.clock
        if clock is not None:
            for event in events:
                node.observe_clock(event)
        return events, more

    # -- anti-entropy ------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve nudges and run anti-entropy every ``interval`` seconds (jittered)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._nudge_worker)
            task_status.started()
            while True:
                await trio.sleep(self.interval * (0.5 + self._rng.random()))
                with trio.move_on_after(self.interval * 10):
                    await self.anti_entropy_round()

    async def _nudge_worker(self) -> None:
        async for criterion in self._nudge_recv:
            self._nudged.pop(criterion, None)
            try:
                await self.sync(criterion, quorum=False)
            except KettenError:
                self._counts["peer_failures"] += 1

    async def anti_entropy_round(self) -> None:
        """Compare heads with every replica peer; pull what we lack, nudge who lacks ours."""
        self._counts["anti_entropy_rounds"] += 1
        node = self.node
        heads = await node.store.heads()
        per_peer: dict[str, tuple[Peer, list[bytes]]] = {}
        brokered: dict[bytes, bool] = {}
        for criterion in sorted(heads):
            replicas = await self.replicas(criterion)
            brokered[criterion] = any(self.is_self(p) for p in replicas)
            for peer in self.others(replicas):
                per_peer.setdefault(peer.address, (peer, []))[1].append(criterion)
        timeout = node.config.request_timeout
        to_sync: dict[bytes, None] = {}

        async def compare(peer: Peer, criteria: list[bytes]) -> None:
            for start in range(0, len(criteria), _MAX_HEADS):
                chunk = criteria[start:start + _MAX_HEADS]
                reply = await self._ask(peer, "heads", {"cs": chunk}, timeout)
                if reply is None:
                    return
                try:
                    theirs = field(reply, "h", list, where="heads reply")
                    if len(theirs) != len(chunk):
                        raise DecodeError("one head per criterion expected", where="heads reply")
                    pairs = [decode_pair(v, where="heads reply") for v in theirs]
                except DecodeError:
                    self._counts["peer_failures"] += 1
                    return
                for criterion, their in zip(chunk, pairs, strict=True):
                    ours = heads[criterion]
                    if their == ours:
                        continue
                    behind = their is None or (
                        their[0] < ours[0]
                        and await self._hash_at(criterion, their[0]) == their[1]
                    )
                    if behind:
                        self._counts["nudges_sent"] += 1
                        try:
                            await node.notify(peer.address, "nudge", {"c": criterion})
                        except KettenError:
                            self._counts["peer_failures"] += 1
                    elif brokered[criterion]:
                        to_sync[criterion] = None

        async with trio.open_nursery() as nursery:
            for address in sorted(per_peer):
                peer, criteria = per_peer[address]
                nursery.start_soon(compare, peer, criteria)
        for criterion in sorted(to_sync):
            try:
                await self.sync(criterion, quorum=False)
            except KettenError:
                self._counts["peer_failures"] += 1
