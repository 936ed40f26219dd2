"""The broker side of publish: the ``offers`` service, a thin trio driver.

``offers`` ``{o: [offer, ...]}`` carries up to 256 offers of one publisher
(:mod:`ketten._offers` batches what it offers a broker at once), each
``{e: event bytes, r: replication, k: commit pair}``, and is answered
``{a: [answer, ...]}`` in the same order, each

* ``{s: "ack"}`` - appended, or already present;
* ``{s: "ack", e: bytes}`` - the same command is already applied as event ``e``;
* ``{s: "stale", e: head bytes|null}`` - another event holds the position;
* ``{s: "invalid", r: reason, m: message}`` - bad signature, writer or link;
* ``{s: "reused", e: bytes}`` - the command id names other content (``e`` proves it);
* ``{s: "behind"}`` - the broker could not catch up in time and abstains;
* ``{s: "error", m: message}`` - the broker failed on this offer (an abstention too).

A malformed offer refuses the whole request before any offer is decided.
The decision is :func:`~ketten._replication.judge_offer`; a broker that lacks
the predecessor waits a moment for it (it may be on its way), then syncs
from the other brokers before it answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._core.chain import Verify, check_successor
from ._core.event import Event
from ._offers import MAX_BATCH_OFFERS
from ._replication import Verdict, judge_offer
from ._sync import Replicator, decode_pair
from ._wire import field
from .errors import (
    DecodeError,
    InvalidEvent,
    KettenError,
    ProtocolError,
    StoreConflict,
    StoreError,
    WriterNotAllowed,
)
from .interfaces import Peer, Store

if TYPE_CHECKING:
    from ._node import Node

__all__ = ["Broker", "GroupCommit"]

_PREDECESSOR_WAIT = 0.05
"""Seconds an offer that finds a gap waits for its predecessor (at most 1/8 of the
request timeout) before the broker syncs."""
_GAP = object()


@attrs.define(eq=False)
class _Slot:
    done: trio.Event = attrs.field(factory=trio.Event)
    error: BaseException | None = None
    lead: bool = False


@attrs.define(eq=False)
class GroupCommit:
    """Appends that arrive while the store is writing share its next transaction.

    A durable store pays one sync per transaction; with many chains
    published at once, one transaction per event would cap throughput at
    the disk's sync rate. Callers hold their criterion's lock, so a batch
    never holds two events of one chain; if the batch is refused anyway,
    its events are retried one by one so that each caller gets its own
    answer. ``committed`` is called with the events each transaction
    wrote, whether or not their callers are still waiting.

    A caller cancelled while its event waits in the queue takes it out
    (nothing is written); once a transaction holds the event, it is written
    and reported to ``committed`` either way.
    """

    store: Store
    committed: Callable[[list[Event]], None] = lambda events: None
    _queue: list[tuple[Event, _Slot]] = attrs.field(factory=list, init=False)
    _busy: bool = attrs.field(default=False, init=False)

    async def append(self, event: Event) -> None:
        """Append ``event`` durably. Raises what :meth:`Store.append` raises."""
        slot = _Slot()
        entry = (event, slot)
        self._queue.append(entry)
        if self._busy:
            try:
                await slot.done.wait()
            except trio.Cancelled:
                if entry in self._queue:
                    self._queue.remove(entry)
                    if slot.lead:
                        self._hand_over()
                raise
            if not slot.lead:
                if slot.error is not None:
                    raise slot.error
                return
        # Lead one transaction: everything queued so far. Whoever queued
        # after it leads the next one, so no caller waits on others' writes.
        self._busy = True
        try:
            batch, self._queue = self._queue, []
            with trio.CancelScope(shield=True):
                await self._write(batch)
        finally:
            self._hand_over()
        if slot.error is not None:
            raise slot.error

    def _hand_over(self) -> None:
        if self._queue:
            successor = self._queue[0][1]
            successor.lead = True
            successor.done.set()
        else:
            self._busy = False

    async def _write(self, batch: list[tuple[Event, _Slot]]) -> None:
        for _, slot in batch:
            slot.lead = False
        try:
            try:
                await self.store.append([event for event, _ in batch])
            except StoreError as exc:
                if len(batch) == 1:
                    batch[0][1].error = exc
                else:
                    for event, slot in batch:
                        try:
                            await self.store.append([event])
                        except StoreError as single:
                            slot.error = single
            self.committed([event for event, slot in batch if slot.error is None])
        except BaseException as exc:
            for _, slot in batch:
                if slot.error is None:
                    slot.error = exc
            raise
        finally:
            for _, slot in batch:
                slot.done.set()


@attrs.define(eq=False)
class Broker:
    """Answers publish requests for the chains this node brokers."""

    node: Node
    replicator: Replicator
    _commits: GroupCommit | None = attrs.field(default=None, init=False)
    _appended: dict[bytes, trio.Event] = attrs.field(factory=dict, init=False)
    """Signals for offers waiting on a gap, by criterion: set when the chain grows."""
    _deciding: dict[bytes, set[int]] = attrs.field(factory=dict, init=False)
    """Seqs of the offers being decided, by criterion."""

    def __attrs_post_init__(self) -> None:
        self.node.register_service("offers", self.serve)

    async def serve(self, peer: Peer, body: Any) -> Any:
        """Answer an ``offers`` request (see the module doc). The offers are decided
        concurrently, so they share the store's next transaction."""
        offers = field(body, "o", list, where="offers")
        if not 0 < len(offers) <= MAX_BATCH_OFFERS:
            raise ProtocolError(f"offers: {len(offers)} offers in one request "
                                f"(1 to {MAX_BATCH_OFFERS} are accepted)")
        parsed = [self._parse_offer(offer, where=f"offers[{i}]")
                  for i, offer in enumerate(offers)]
        behind = {"s": "behind"}
        answers: list[Any] = [behind] * len(parsed)

        async def decide(index: int, event: Event, mark: tuple[int, bytes] | None) -> None:
            try:
                answers[index] = await self._serve(event, mark, signed_here=False)
            except KettenError as exc:
                answers[index] = {"s": "error", "m": f"{type(exc).__name__}: {exc}"[:500]}

        # One deadline for the whole request: what is not decided by then abstains.
        with trio.move_on_after(self.node.config.request_timeout):
            if len(parsed) == 1:
                await decide(0, *parsed[0])
            else:
                async with trio.open_nursery() as nursery:
                    for index, (event, mark) in enumerate(parsed):
                        nursery.start_soon(decide, index, event, mark)
        return {"a": answers}

    async def serve_local(self, event: Event, mark: tuple[int, bytes] | None) -> Any:
        """Answer an offer of this node's own publisher: ``event`` was signed in
        this process, so its signature is not checked again. The caller bounds
        the time it may take."""
        return await self._serve(event, mark, signed_here=True)

    def _parse_offer(self, body: Any, *, where: str) -> tuple[Event, tuple[int, bytes] | None]:
        node = self.node
        raw = field(body, "e", bytes, where=where)
        replication = field(body, "r", int, where=where)
        if replication != node.config.replication:
            raise ProtocolError(
                f"{where}: replication factor {replication} offered, this network uses "
                f"{node.config.replication}"
            )
        try:
            event = Event.from_bytes(raw, max_size=node.config.max_event_size)
        except DecodeError as exc:
            raise DecodeError(str(exc), where=where) from None
        return event, decode_pair(body.get("k"), where=where)

    async def _serve(self, event: Event, mark: tuple[int, bytes] | None, *,
                     signed_here: bool) -> Any:
        node = self.node
        node._counts["events_received"] += 1
        replicator = self.replicator
        if not any(replicator.is_self(p) for p in await replicator.replicas(event.criterion)):
            # Not one of the brokers as far as this node can see: a publisher with
            # a stale view of the membership must not gather votes from outsiders.
            return {"s": "behind"}
        limit = node.config.request_timeout
        criterion = event.criterion
        lock = node._lock(criterion)
        # Offers of one chain may be decided out of order (the requests that
        # carry them are answered concurrently, and a busy broker falls behind
        # its faster peers): an offer that finds a gap waits for its
        # predecessor while this broker is deciding on it, else a moment,
        # before syncing from the other brokers.
        deciding = self._deciding.setdefault(criterion, set())
        deciding.add(event.seq)
        try:
            now = trio.current_time()
            patience = now + min(_PREDECESSOR_WAIT, limit / 8)
            longest = now + limit / 2
            while True:
                now = trio.current_time()
                until = longest if event.seq - 1 in deciding else patience
                try:
                    lock.acquire_nowait()  # the usual case: no scheduler round trip
                except trio.WouldBlock:
                    await lock.acquire()
                try:
                    answer = await self._decide(event, mark, limit, signed_here,
                                                may_wait=now < until)
                finally:
                    lock.release()
                if answer is not _GAP:
                    return answer
                await self._wait_for_append(criterion, until)
        finally:
            deciding.discard(event.seq)
            if not deciding and self._deciding.get(criterion) is deciding:
                del self._deciding[criterion]

    async def _wait_for_append(self, criterion: bytes, until: float) -> None:
        appended = self._appended.get(criterion)
        if appended is None:
            appended = self._appended[criterion] = trio.Event()
        with trio.move_on_at(until):
            await appended.wait()
        if self._appended.get(criterion) is appended and not appended.statistics().tasks_waiting:
            del self._appended[criterion]

    def _committed(self, events: list[Event]) -> None:
        node = self.node
        node.appended(events)
        for event in events:
            node.observe_clock(event)
            appended = self._appended.pop(event.criterion, None)
            if appended is not None:
                appended.set()

    async def _judge(self, event: Event, *, synced: bool) -> tuple[Verdict, Event | None,
                                                                   Event | None]:
        store = self.node.store
        criterion = event.criterion
        head = await self.node.head(criterion)
        at_seq = None
        if head is not None and event.seq <= head.seq:
            found = await store.range(criterion, event.seq, event.seq + 1)
            at_seq = found[0] if found else None
        by_command = None
        if event.command is not None:
            by_command = await store.by_command(criterion, event.author, event.command)
        verdict, ref = judge_offer(event, head=head, at_seq=at_seq, by_command=by_command,
                                   synced=synced)
        return verdict, ref, head

    async def _decide(self, event: Event, mark: tuple[int, bytes] | None,
                      limit: float, signed_here: bool, *, may_wait: bool = False) -> Any:
        node = self.node
        replicator = self.replicator
        criterion = event.criterion
        if mark is not None:
            replicator.claim_commit(criterion, mark)
        verdict, ref, head = await self._judge(event, synced=False)
        if verdict is Verdict.SYNC and may_wait and (head is None or event.seq > head.seq + 1):
            return _GAP
        if verdict is Verdict.SYNC:
            peers = replicator.others(await replicator.replicas(criterion))
            await replicator.sync_locked(criterion, peers, timeout=limit / 4)
            verdict, ref, head = await self._judge(event, synced=True)
        if verdict is Verdict.APPEND:
            try:
                policy = await node.policy(criterion) if event.seq > 0 else None
                if signed_here:
                    check_successor(head, event, verify=Verify.LINKS)
                    if policy is not None and not policy.allows(event.author):
                        raise WriterNotAllowed(
                            f"seq {event.seq}: author {event.author.hex()[:16]} may not write "
                            "to this chain")
                else:
                    check_successor(head, event, policy=policy, verify=Verify.FULL)
            except InvalidEvent as exc:
                node._counts["invalid_events"] += 1
                return {"s": "invalid", "r": exc.reason, "m": str(exc)}
            try:
                if self._commits is None:
                    self._commits = GroupCommit(node.store, self._committed)
                await self._commits.append(event)
            except StoreConflict:
                node.forget_head(criterion)
                return {"s": "stale", "e": head.to_bytes() if head is not None else None}
            return {"s": "ack"}
        if verdict is Verdict.PRESENT:
            assert ref is not None
            if ref.hash == event.hash:
                return {"s": "ack"}
            return {"s": "ack", "e": ref.to_bytes()}
        if verdict is Verdict.REUSED:
            assert ref is not None
            return {"s": "reused", "e": ref.to_bytes()}
        if verdict is Verdict.STALE:
            return {"s": "stale", "e": head.to_bytes() if head is not None else None}
        return {"s": "behind"}
