"""The broker side of publish: the ``publish`` service, a thin trio driver.

``publish`` ``{e: event bytes, r: replication, k: commit pair}`` is answered with

* ``{s: "ack"}`` - appended, or already present;
* ``{s: "ack", e: bytes}`` - the same command is already applied as event ``e``;
* ``{s: "stale", e: head bytes|null}`` - another event holds the position;
* ``{s: "invalid", r: reason, m: message}`` - bad signature, writer or link;
* ``{s: "reused", e: bytes}`` - the command id names other content (``e`` proves it);
* ``{s: "behind"}`` - the broker could not catch up in time and abstains.

The decision is :func:`~ketten._replication.judge_offer`; a broker that lacks
the predecessor syncs from the other brokers before it answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._chain import Verify, check_successor
from ._event import Event
from ._replication import Verdict, judge_offer
from ._sync import Replicator, decode_pair
from ._wire import field
from .errors import InvalidEvent, ProtocolError, StoreConflict, StoreError, WriterNotAllowed
from .interfaces import Peer, Store

if TYPE_CHECKING:
    from ._node import Node

__all__ = ["Broker", "GroupCommit"]


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
    answer.
    """

    store: Store
    _queue: list[tuple[Event, _Slot]] = attrs.field(factory=list, init=False)
    _busy: bool = attrs.field(default=False, init=False)

    async def append(self, event: Event) -> None:
        """Append ``event`` durably. Raises what :meth:`Store.append` raises."""
        slot = _Slot()
        self._queue.append((event, slot))
        if self._busy:
            await slot.done.wait()
            if not slot.lead:
                if slot.error is not None:
                    raise slot.error
                return
        # Lead one transaction: everything queued so far. Whoever queued
        # after it leads the next one, so no caller waits on others' writes.
        self._busy = True
        try:
            batch, self._queue = self._queue, []
            await self._write(batch)
        finally:
            if self._queue:
                successor = self._queue[0][1]
                successor.lead = True
                successor.done.set()
            else:
                self._busy = False
        if slot.error is not None:
            raise slot.error

    async def _write(self, batch: list[tuple[Event, _Slot]]) -> None:
        try:
            try:
                await self.store.append([event for event, _ in batch])
            except StoreError as exc:
                if len(batch) == 1:
                    batch[0][1].error = exc
                    return
                for event, slot in batch:
                    try:
                        await self.store.append([event])
                    except StoreError as single:
                        slot.error = single
        except BaseException as exc:
            for _, slot in batch:
                if slot.error is None:
                    slot.error = exc
            raise
        finally:
            for _, slot in batch:
                slot.lead = False
                slot.done.set()


@attrs.define(eq=False)
class Broker:
    """Answers publish requests for the chains this node brokers."""

    node: Node
    replicator: Replicator
    _commits: GroupCommit | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self.node.register_service("publish", self.serve)

    async def serve(self, peer: Peer, body: Any) -> Any:
        node = self.node
        raw = field(body, "e", bytes, where="publish")
        replication = field(body, "r", int, where="publish")
        if replication != node.config.replication:
            raise ProtocolError(
                f"replication factor {replication} offered, this network uses "
                f"{node.config.replication}"
            )
        event = Event.from_bytes(raw, max_size=node.config.max_event_size)
        mark = decode_pair(body.get("k"), where="publish")
        return await self._serve(event, mark, signed_here=False)

    async def serve_local(self, event: Event, mark: tuple[int, bytes] | None) -> Any:
        """Answer an offer of this node's own publisher: ``event`` was signed in
        this process, so its signature is not checked again."""
        return await self._serve(event, mark, signed_here=True)

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
        with trio.move_on_after(limit):
            async with node._lock(event.criterion):
                return await self._decide(event, mark, limit, signed_here)
        return {"s": "behind"}

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
                      limit: float, signed_here: bool) -> Any:
        node = self.node
        replicator = self.replicator
        criterion = event.criterion
        if mark is not None:
            replicator.claim_commit(criterion, mark)
        verdict, ref, head = await self._judge(event, synced=False)
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
                    self._commits = GroupCommit(node.store)
                with trio.CancelScope(shield=True):
                    await self._commits.append(event)
                    node.appended([event])
            except StoreConflict:
                node.forget_head(criterion)
                return {"s": "stale", "e": head.to_bytes() if head is not None else None}
            node.observe_clock(event)
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
