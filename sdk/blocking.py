"""ketten for programs that do not run trio: every method blocks until it is done.

::

    import ketten.blocking

    with ketten.blocking.open_node(ketten.NodeConfig()) as node:
        event = node.publish("orders", b"one")
        print(node.read("orders"))
        with node.subscribe("orders") as sub:
            for event in sub:
                ...

The node runs on a trio thread of its own; each call is handed to it and
waited for, so a script, a notebook cell or a thread pool can call from any
thread, any number of calls at once. Methods take the arguments and raise
the errors of :class:`ketten.Node`'s methods of the same name, plus
:class:`NodeClosed` once the node is closed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pluggy

from ._bridge import NodeClosed, NodeFacade, NodeThread, StreamHandle
from ._core.event import Event
from ._node.config import NodeConfig
from ._node.feeds import DurableSubscription, Subscription
from ._node.node import NodeStatistics

__all__ = ["BlockingDurableSubscription", "BlockingNode", "BlockingSubscription", "NodeClosed",
           "open_node"]


def open_node(config: NodeConfig | None = None, *,
              plugins: pluggy.PluginManager | None = None) -> BlockingNode:
    """Start a node on a thread of its own; use it ``with`` it, or :meth:`~BlockingNode.close`.

    Raises what :func:`ketten.open_node` raises when the node cannot start.
    """
    return BlockingNode(NodeThread(config if config is not None else NodeConfig(), plugins))


class BlockingNode(NodeFacade):
    """A :class:`ketten.Node` whose methods block (see the module docstring)."""


    def __enter__(self) -> BlockingNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self._thread.submit(functools.partial(fn, *args, **kwargs)).result()

    def publish(self, criterion: str | bytes, payload: bytes, **kwargs: Any) -> Event:
        """See :meth:`ketten.Node.publish`."""
        result: Event = self._call(self._node.publish, criterion, payload, **kwargs)
        return result

    def read(self, criterion: str | bytes, since: int = 0, *, deadline: float = 10.0) -> list[Event]:
        """See :meth:`ketten.Node.read`."""
        result: list[Event] = self._call(self._node.read, criterion, since, deadline=deadline)
        return result

    def replay(self, criterion: str | bytes, from_seq: int = 0) -> list[Event]:
        """The local copy of ``criterion`` from ``from_seq`` (see :meth:`ketten.Node.replay`)."""

        async def collect() -> list[Event]:
            return [event async for event in self._node.replay(criterion, from_seq)]

        result: list[Event] = self._call(collect)
        return result

    def statistics(self) -> NodeStatistics:
        async def read() -> NodeStatistics:
            return self._node.statistics()

        result: NodeStatistics = self._call(read)
        return result

    def subscribe(self, criteria: str | bytes | Sequence[str | bytes], **kwargs: Any
                  ) -> BlockingSubscription:
        """A push subscription to iterate (see :meth:`ketten.Node.subscribe`); close it,
        or use it ``with`` it."""
        handle = self._thread.open_stream(
            lambda node: node.subscribe(criteria, **kwargs), _next_event)
        return BlockingSubscription(handle, self._thread)

    def durable_subscription(self, name: str, criteria: str | bytes | Sequence[str | bytes],
                             **kwargs: Any) -> BlockingDurableSubscription:
        """See :meth:`ketten.Node.durable_subscription` (``get``/``ack``/``close``)."""
        sub: DurableSubscription = self._call(self._node.durable_subscription, name, criteria,
                                              **kwargs)
        return BlockingDurableSubscription(sub, self._thread)

    def close(self) -> None:
        """Close the node and wait for its thread. Calls still running end with
        :class:`NodeClosed`."""
        self._thread.close()


async def _next_event(sub: Subscription) -> Event:
    return await sub.__anext__()


class BlockingSubscription:
    """Iterate for events; each ``next`` blocks until one is committed."""

    def __init__(self, handle: StreamHandle, thread: NodeThread) -> None:
        self._handle = handle
        self._thread = thread

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        result: Event = self._handle.next().result()
        return result

    def __enter__(self) -> BlockingSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._handle.close()


class BlockingDurableSubscription:
    """A :class:`ketten.DurableSubscription` whose methods block."""

    def __init__(self, sub: DurableSubscription, thread: NodeThread) -> None:
        self._sub = sub
        self._thread = thread

    @property
    def position(self) -> Mapping[bytes, int]:
        return self._sub.position

    def get(self) -> Event:
        """The next event; acknowledges the one the previous call returned."""
        result: Event = self._thread.submit(self._sub.get).result()
        return result

    def ack(self) -> None:
        self._thread.submit(self._sub.ack).result()

    def close(self) -> None:
        self._thread.submit(self._sub.aclose).result()

