"""A fault-injecting transport for tests: ``tcp`` that loses a share of its frames.

Registered only by the tests that use it (``ketten.plugin_manager(extra=(this module,))``),
as the transport plugin ``lossy``. Every outgoing one-way message is dropped
with probability ``loss``; every outgoing request is lost with probability
``loss`` before it is sent (the peer never sees it) and its reply is lost
with probability ``loss`` after the peer answered (the peer did the work).
A lost request or reply is never answered, exactly like a frame lost on the
wire: the caller's timeout ends the wait. Options: ``loss`` (default 0.1),
``seed`` (for the drop decisions), ``tcp`` (options of the wrapped ``tcp``
transport).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from ketten import hookimpl
from ketten.adapters import tcp
from ketten.errors import ConfigError
from ketten.interfaces import Handler, Reply, Transport


@attrs.frozen
class LossStatistics:
    requests_lost: int
    replies_lost: int
    messages_lost: int
    inner: Any


@attrs.define(eq=False)
class LossyTransport:
    inner: Transport
    loss: float
    rng: random.Random
    _counts: dict[str, int] = attrs.field(
        factory=lambda: {"requests_lost": 0, "replies_lost": 0, "messages_lost": 0})

    @property
    def address(self) -> str:
        return self.inner.address

    async def serve(self, handler: Handler, *,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        await self.inner.serve(handler, task_status=task_status)

    async def request(self, address: str, data: bytes) -> Reply:
        if self.rng.random() < self.loss:
            self._counts["requests_lost"] += 1
            await trio.sleep_forever()
        reply = await self.inner.request(address, data)
        if self.rng.random() < self.loss:
            self._counts["replies_lost"] += 1
            await trio.sleep_forever()
        return reply

    async def send(self, address: str, data: bytes) -> None:
        if self.rng.random() < self.loss:
            self._counts["messages_lost"] += 1
            return
        await self.inner.send(address, data)

    def statistics(self) -> LossStatistics:
        return LossStatistics(inner=self.inner.statistics(), **self._counts)


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"transport": ["lossy"]}


@hookimpl
def ketten_make_transport(name: str, options: Mapping[str, Any], node: Any) -> Any:
    if name != "lossy":
        return None
    loss = options.get("loss", 0.1)
    if not isinstance(loss, float) or not 0.0 <= loss < 1.0:
        raise ConfigError("lossy option 'loss' must be a float in [0, 1)")
    inner = tcp.ketten_make_transport(name="tcp", options=options.get("tcp", {}), node=node)
    return LossyTransport(inner, loss, random.Random(options.get("seed", 0)))
