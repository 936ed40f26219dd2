"""A node on a trio thread of its own, for programs that do not run trio.

:class:`NodeThread` starts a thread that runs ``trio.run``, opens the node
there and keeps it open until :meth:`NodeThread.close`. Other threads (a
plain script, a notebook, an asyncio loop) hand it coroutine functions with
:meth:`NodeThread.submit` and get a :class:`concurrent.futures.Future` back:
each call runs as its own task in the node's nursery, so any number can be
in flight. :mod:`ketten.blocking` and :mod:`ketten.aio` wrap it.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import pluggy
import trio

from ._core.identity import Identity
from ._node.config import NodeConfig
from ._node.node import Node, open_node
from .errors import NodeClosed

__all__ = ["NodeClosed", "NodeFacade", "NodeThread", "StreamHandle"]

T = TypeVar("T")


class NodeThread:
    """One node and the trio thread it runs on (see the module docstring)."""

    def __init__(self, config: NodeConfig, plugins: pluggy.PluginManager | None = None) -> None:
        self._config = config
        self._plugins = plugins
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self.node: Node | None = None
        self._thread = threading.Thread(target=self._run, name="ketten-node", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported to the thread that started us
            if not self._ready.is_set():
                self._failure = exc
        finally:
            self._nursery = None
            self._ready.set()

    async def _main(self) -> None:
        async with open_node(self._config, plugins=self._plugins) as node, \
                trio.open_nursery() as nursery:
            self.node = node
            self._token = trio.lowlevel.current_trio_token()
            self._nursery = nursery
            self._stop = trio.Event()
            self._ready.set()
            await self._stop.wait()
            self._nursery = None
            nursery.cancel_scope.cancel()

    @property
    def running(self) -> bool:
        return self._nursery is not None

    def submit(self, fn: Callable[..., Awaitable[T]], *args: Any) -> concurrent.futures.Future[T]:
        """Run ``await fn(*args)`` on the node's thread; its outcome in a future."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def spawn() -> None:
            if self._nursery is None:
                future.set_exception(NodeClosed("the node is closed"))
            else:
                self._nursery.start_soon(self._call, future, fn, args)

        self._soon(spawn, future)
        return future

    def _soon(self, callback: Callable[[], None], future: concurrent.futures.Future[Any]) -> None:
        token = self._token
        try:
            if token is None or not self.running:
                raise trio.RunFinishedError
            token.run_sync_soon(callback)
        except trio.RunFinishedError:
            future.set_exception(NodeClosed("the node is closed"))

    @staticmethod
    async def _call(future: concurrent.futures.Future[T], fn: Callable[..., Awaitable[T]],
                    args: tuple[Any, ...]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = await fn(*args)
        except trio.Cancelled:
            future.set_exception(NodeClosed("the node closed while the call ran"))
            raise
        except BaseException as exc:  # the caller's to handle, on its own thread
            future.set_exception(exc)
        else:
            future.set_result(result)

    def open_stream(self, opener: Callable[[Node], AbstractAsyncContextManager[Any]],
                    step: Callable[[Any], Awaitable[Any]]) -> StreamHandle:
        """Enter ``opener(node)`` in a task of its own and keep it entered; each
        :meth:`StreamHandle.next` runs ``step(entered)`` in that task."""
        handle = StreamHandle(self)
        opened: concurrent.futures.Future[None] = concurrent.futures.Future()

        def spawn() -> None:
            if self._nursery is None or self.node is None:
                opened.set_exception(NodeClosed("the node is closed"))
                return
            send, receive = trio.open_memory_channel[concurrent.futures.Future[Any] | None](
                float("inf"))
            handle.send = send
            self._nursery.start_soon(self._stream, self.node, opener, step, receive, opened)

        self._soon(spawn, opened)
        opened.result()
        return handle

    @staticmethod
    async def _stream(node: Node, opener: Callable[[Node], AbstractAsyncContextManager[Any]],
                      step: Callable[[Any], Awaitable[Any]],
                      receive: trio.MemoryReceiveChannel[concurrent.futures.Future[Any] | None],
                      opened: concurrent.futures.Future[None]) -> None:
        try:
            async with opener(node) as entered:
                opened.set_result(None)
                async for future in receive:
                    if future is None:
                        break
                    await NodeThread._call(future, step, (entered,))
        except trio.Cancelled:
            if not opened.done():
                opened.set_exception(NodeClosed("the node closed"))
            raise
        except BaseException as exc:
            if not opened.done():
                opened.set_exception(exc)
            else:
                raise
        finally:
            while True:  # calls made before it ended
                try:
                    future = receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                if future is not None and future.set_running_or_notify_cancel():
                    future.set_exception(NodeClosed("the stream is closed"))
            receive.close()  # and after: _put answers them with NodeClosed

    def close(self) -> None:
        """Close the node (in-flight calls end with :class:`NodeClosed`) and join its
        thread. Safe to call twice."""
        token, stop = self._token, self._stop
        if token is not None and stop is not None and self.running:
            try:
                token.run_sync_soon(stop.set)
            except trio.RunFinishedError:
                pass
        if threading.current_thread() is not self._thread:
            self._thread.join()


class NodeFacade:
    """What the blocking and asyncio facades share: the node on its thread."""

    def __init__(self, thread: NodeThread) -> None:
        self._thread = thread
        assert thread.node is not None
        self._node: Node = thread.node

    @property
    def address(self) -> str:
        return self._node.address

    @property
    def identity(self) -> Identity:
        return self._node.identity


class StreamHandle:
    """One entered context (a subscription) on the node's thread."""

    def __init__(self, owner: NodeThread) -> None:
        self._owner = owner
        self.send: trio.MemorySendChannel[concurrent.futures.Future[Any] | None] | None = None
        self._closed = False

    def next(self) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        send = self.send
        if self._closed or send is None:
            future.set_exception(NodeClosed("the stream is closed"))
            return future
        self._owner._soon(lambda: _put(send, future), future)
        return future

    def close(self) -> None:
        if self._closed or self.send is None:
            return
        self._closed = True
        send = self.send
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def finish() -> None:
            _put(send, None)
            send.close()
            done.set_result(None)

        self._owner._soon(finish, done)
        try:
            done.result()
        except NodeClosed:
            pass


def _put(send: trio.MemorySendChannel[Any], item: Any) -> None:
    try:
        send.send_nowait(item)
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        if isinstance(item, concurrent.futures.Future) and item.set_running_or_notify_cancel():
            item.set_exception(NodeClosed("the stream is closed"))

