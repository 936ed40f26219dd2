"""Requests to one peer made in the same scheduler pass travel as one.

A caller queues its item for a destination (a member: its address and the
key that must answer there); the first item of a pass starts a sender in the
node's nursery that waits one scheduler pass, then sends every item queued
for that destination meanwhile (in batches of at most ``max_batch``
items and, with ``size``, ``max_bytes`` bytes) and hands each caller its own
answer. A caller that stops waiting does not
cut the batch short for the others.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

import attrs
import trio

from ..errors import UsageError

__all__ = ["Coalescer"]

Dest = TypeVar("Dest", bound=Hashable)
Item = TypeVar("Item")
Answer = TypeVar("Answer")


@attrs.define(eq=False)
class _Slot(Generic[Item, Answer]):
    item: Item
    done: trio.Event = attrs.field(factory=trio.Event)
    answer: Answer | None = None


@attrs.define(eq=False, repr=False)
class Coalescer(Generic[Dest, Item, Answer]):
    """Batches items per destination; ``send(dest, items)`` returns one answer per item
    (``None``: none came) and must not raise."""

    send: Callable[[Dest, list[Item]], Awaitable[Sequence[Answer | None]]]
    nursery: Callable[[], trio.Nursery]
    max_batch: int
    size: Callable[[Item], int] | None = None
    """The bytes an item adds to a request (``None``: batches are bounded by count only)."""
    max_bytes: int = 0
    _queues: dict[Dest, list[_Slot[Item, Answer]]] = attrs.field(factory=dict, init=False)

    async def call(self, dest: Dest, item: Item) -> Answer | None:
        """``item``'s answer from ``dest`` (``None``: none came, also when the node is
        closing and sends nothing any more)."""
        slot: _Slot[Item, Answer] = _Slot(item)
        queue = self._queues.get(dest)
        if queue is None:
            try:
                self.nursery().start_soon(self._flush, dest)
            except (UsageError, RuntimeError):  # not open, or closed to new tasks
                await trio.lowlevel.checkpoint()
                return None
            queue = self._queues[dest] = []
        queue.append(slot)
        await slot.done.wait()
        return slot.answer

    async def _flush(self, dest: Dest) -> None:
        await trio.lowlevel.checkpoint()
        queue = self._queues.pop(dest)
        batches: list[list[_Slot[Item, Answer]]] = [[]]
        used = 0
        for slot in queue:
            cost = 0 if self.size is None else self.size(slot.item)
            if batches[-1] and (len(batches[-1]) >= self.max_batch
                                or (self.size is not None and used + cost > self.max_bytes)):
                batches.append([])
                used = 0
            batches[-1].append(slot)
            used += cost
        if len(batches) == 1:
            await self._send(dest, batches[0])
            return
        async with trio.open_nursery() as nursery:
            for batch in batches:
                nursery.start_soon(self._send, dest, batch)

    async def _send(self, dest: Dest, batch: list[_Slot[Item, Answer]]) -> None:
        answers: Sequence[Answer | None] = ()
        try:
            answers = await self.send(dest, [slot.item for slot in batch])
        finally:
            if len(answers) != len(batch):
                answers = [None] * len(batch)
            for slot, answer in zip(batch, answers, strict=True):
                slot.answer = answer
                slot.done.set()
