"""ketten for asyncio programs: the node's methods as asyncio coroutines.

::

    import asyncio, ketten, ketten.aio

    async def main():
        async with ketten.aio.open_node(ketten.NodeConfig()) as node:
            await node.publish("orders", b"one")
            async with node.subscribe("orders") as sub:
                async for event in sub:
                    ...

    asyncio.run(main())

The node runs on a trio thread of its own (see :mod:`ketten.blocking`); each
call is handed to it and awaited through an asyncio future, so the event
loop never blocks and any number of calls can be in flight. Methods take the
arguments and raise the errors of :class:`ketten.Node`'s methods of the same
name, plus :class:`NodeClosed` once the node is closed. A call whose awaiting
task is cancelled still runs to its end on the node (bound it with the
method's ``deadline``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Any

import pluggy

from ._bridge import NodeClosed, NodeFacade, NodeThread, StreamHandle
from ._core.event import Event
from ._node.config import NodeConfig
from ._node.feeds import DurableSubscription, Subscription
from ._node.node import NodeStatistics

__all__ = ["AioDurableSubscription", "AioNode", "AioSubscription", "NodeClosed", "open_node"]


def open_node(config: NodeConfig | None = None, *,
              plugins: pluggy.PluginManager | None = None) -> _Opening:
    """``async with ketten.aio.open_node(config) as node:`` (or ``node = await ...``
    and ``await node.aclose()``). Raises what :func:`ketten.open_node` raises."""
    return _Opening(config if config is not None else NodeConfig(), plugins)


class _Opening:
    def __init__(self, config: NodeConfig, plugins: pluggy.PluginManager | None) -> None:
        self._config = config
        self._plugins = plugins
        self._node: AioNode | None = None

    def __await__(self) -> Any:
        return self._open().__await__()

    async def _open(self) -> AioNode:
        thread = await asyncio.to_thread(NodeThread, self._config, self._plugins)
        return AioNode(thread)

    async def __aenter__(self) -> AioNode:
        self._node = await self._open()
        return self._node

    async def __aexit__(self, *exc: object) -> None:
        if self._node is not None:
            await self._node.aclose()


class AioNode(NodeFacade):
    """A :class:`ketten.Node` whose methods are asyncio coroutines."""


    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.wrap_future(self._thread.submit(functools.partial(fn, *args,
                                                                               **kwargs)))

    async def publish(self, criterion: str | bytes, payload: bytes, **kwargs: Any) -> Event:
        """See :meth:`ketten.Node.publish`."""
        result: Event = await self._call(self._node.publish, criterion, payload, **kwargs)
        return result

    async def read(self, criterion: str | bytes, since: int = 0, *,
                   deadline: float = 10.0) -> list[Event]:
        """See :meth:`ketten.Node.read`."""
        result: list[Event] = await self._call(self._node.read, criterion, since,
                                               deadline=deadline)
        return result

    async def statistics(self) -> NodeStatistics:
        async def read() -> NodeStatistics:
            return self._node.statistics()

        result: NodeStatistics = await self._call(read)
        return result

    def subscribe(self, criteria: str | bytes | Sequence[str | bytes],
                  **kwargs: Any) -> AioSubscription:
        """``async with node.subscribe(c) as sub: async for event in sub:`` (see
        :meth:`ketten.Node.subscribe`)."""
        return AioSubscription(self._thread, criteria, kwargs)

    async def durable_subscription(self, name: str, criteria: str | bytes | Sequence[str | bytes],
                                   **kwargs: Any) -> AioDurableSubscription:
        """See :meth:`ketten.Node.durable_subscription` (``get``/``ack``/``aclose``)."""
        sub: DurableSubscription = await self._call(self._node.durable_subscription, name,
                                                    criteria, **kwargs)
        return AioDurableSubscription(sub, self._thread)

    async def aclose(self) -> None:
        """Close the node; calls still running end with :class:`NodeClosed`."""
        await asyncio.to_thread(self._thread.close)


async def _next_event(sub: Subscription) -> Event:
    return await sub.__anext__()


class AioSubscription:
    """A push subscription for asyncio: an async context manager and async iterator."""

    def __init__(self, thread: NodeThread, criteria: Any, kwargs: dict[str, Any]) -> None:
        self._thread = thread
        self._criteria = criteria
        self._kwargs = kwargs
        self._handle: StreamHandle | None = None

    async def __aenter__(self) -> AioSubscription:
        criteria, kwargs = self._criteria, self._kwargs
        self._handle = await asyncio.to_thread(
            self._thread.open_stream, lambda node: node.subscribe(criteria, **kwargs),
            _next_event)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._handle is not None:
            await asyncio.to_thread(self._handle.close)

    def __aiter__(self) -> AioSubscription:
        return self

    async def __anext__(self) -> Event:
        if self._handle is None:
            raise NodeClosed("use the subscription inside 'async with'")
        result: Event = await asyncio.wrap_future(self._handle.next())
        return result


class AioDurableSubscription:
    """A :class:`ketten.DurableSubscription` for asyncio."""

    def __init__(self, sub: DurableSubscription, thread: NodeThread) -> None:
        self._sub = sub
        self._thread = thread

    async def get(self) -> Event:
        """The next event; acknowledges the one the previous call returned."""
        result: Event = await asyncio.wrap_future(self._thread.submit(self._sub.get))
        return result

    async def ack(self) -> None:
        await asyncio.wrap_future(self._thread.submit(self._sub.ack))

    async def aclose(self) -> None:
        await asyncio.wrap_future(self._thread.submit(self._sub.aclose))
