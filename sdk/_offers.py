"""Offers to one broker that are made in the same scheduler pass travel in one request.

With many chains published at once, a node offers many events to each
broker at nearly the same moment. Sending each in its own request costs a
frame, a request task and a reply per event on both sides; the ``offers``
service takes them together and answers each. Nothing waits for a batch
to fill: offers queued for a broker are sent by a task that runs in the
next scheduler pass, so a lone offer is sent as soon as it would have been.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._wire import field
from .errors import DecodeError, KettenError

if TYPE_CHECKING:
    from ._node import Node

__all__ = ["MAX_BATCH_BYTES", "MAX_BATCH_OFFERS", "Answered", "OfferBatcher"]

MAX_BATCH_OFFERS = 256
"""Most offers in one ``offers`` request (brokers refuse more)."""
MAX_BATCH_BYTES = 1 << 20
"""Event bytes after which a batch is closed (a larger event travels alone)."""


Answered = Callable[[Any], None]
"""Called once with a broker's answer to an offer, or ``None`` when none came."""


@attrs.define(eq=False)
class _Pending:
    body: dict[str, Any]
    size: int
    timeout: float
    answered: Answered


@attrs.define(eq=False)
class OfferBatcher:
    """Sends the publish offers of this node to other brokers, batched per broker."""

    node: Node
    _queues: dict[str, list[_Pending]] = attrs.field(factory=dict, init=False)

    def submit(self, address: str, body: dict[str, Any], *, size: int, timeout: float,
               answered: Answered) -> None:
        """Offer one event (``body``: one offer of an ``offers`` request) to the broker at
        ``address``. ``answered`` is called with its answer, or with ``None`` if none came
        within ``timeout`` (unreachable broker, refused request, malformed reply); it
        runs in a task of the node's nursery and must not raise."""
        queue = self._queues.get(address)
        if queue is None:
            self.node.nursery.start_soon(self._send_queued, address)  # raises if closing
            queue = self._queues[address] = []
        queue.append(_Pending(body, size, timeout, answered))

    async def _send_queued(self, address: str) -> None:
        # Runs one scheduler pass after the first offer was queued: every
        # offer made meanwhile is in the queue now. Later ones start a new one.
        queue = self._queues.pop(address)
        batches: list[list[_Pending]] = [[]]
        size = 0
        for pending in queue:
            batch = batches[-1]
            if batch and (len(batch) >= MAX_BATCH_OFFERS or size + pending.size > MAX_BATCH_BYTES):
                batches.append([])
                size = 0
            batches[-1].append(pending)
            size += pending.size
        if len(batches) == 1:
            await self._send(address, batches[0])
            return
        async with trio.open_nursery() as nursery:
            for batch in batches:
                nursery.start_soon(self._send, address, batch)

    async def _send(self, address: str, batch: list[_Pending]) -> None:
        answers: list[Any] = [None] * len(batch)
        try:
            timeout = max(p.timeout for p in batch)
            reply = await self.node.call(
                address, "offers", {"o": [p.body for p in batch]}, timeout=timeout,
                retransmit=True)  # offers are idempotent: a broker answers a repeat from its chain
            answers = field(reply, "a", list, where="offers reply")
            if len(answers) != len(batch):
                raise DecodeError(f"{len(answers)} answers to {len(batch)} offers",
                                  where="offers reply")
        except KettenError:
            answers = [None] * len(batch)
        finally:
            for pending, answer in zip(batch, answers, strict=True):
                pending.answered(answer)
