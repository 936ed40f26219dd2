"""ketten-counting-store: the ``counting`` store, a ketten store plugin.

The store keeps its chains in memory, in a ``MemoryBacking`` of ketten's own
``memory`` store, and counts what it is asked to keep: the events appended
(``appended``) and the appends that stored them (``batches``). Select it with
``NodeConfig(store="counting")``.

Options (``NodeConfig.options["store"]``):

``backing``
    A :class:`ketten.plugins.memory_store.MemoryBacking` holding the chains.
    Pass the same one again and a node opened later finds its chains; without
    it every store starts empty.
``report_every``
    Log a line (logger ``ketten_counting_store``, level INFO) each time
    another ``report_every`` events have been appended; 0, the default,
    never logs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ketten import Event, Option, PluginSpec, hookimpl
from ketten.errors import ConfigError
from ketten.interfaces import NodeContext
from ketten.plugins.memory_store import MemoryBacking, MemoryStore

__all__ = ["CountingStore"]

_log = logging.getLogger("ketten_counting_store")


class CountingStore:
    """A :class:`ketten.interfaces.Store` in memory that counts the events appended to it.

    ``appended`` counts the events stored by :meth:`append` and
    :meth:`replace_from`, ``batches`` the calls that stored them.
    """

    def __init__(self, *, backing: MemoryBacking | None = None, report_every: int = 0) -> None:
        self._inner = MemoryStore(backing=backing if backing is not None else MemoryBacking())
        self.report_every = report_every
        self.appended = 0
        self.batches = 0

    async def open(self) -> None:
        await self._inner.open()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def append(self, events: Sequence[Event]) -> None:
        # All or none: count only once the inner store has taken the batch.
        await self._inner.append(events)
        before = self.appended
        self.appended += len(events)
        self.batches += 1
        every = self.report_every
        if every and self.appended // every > before // every:
            _log.info("%d events appended", self.appended)

    async def get(self, event_hash: bytes) -> Event | None:
        return await self._inner.get(event_hash)

    async def head(self, criterion: bytes) -> Event | None:
        return await self._inner.head(criterion)

    async def heads(self) -> Mapping[bytes, tuple[int, bytes]]:
        return await self._inner.heads()

    async def range(self, criterion: bytes, start: int = 0, stop: int | None = None) -> list[Event]:
        return await self._inner.range(criterion, start, stop)

    async def by_command(self, criterion: bytes, author: bytes, command: int) -> Event | None:
        return await self._inner.by_command(criterion, author, command)

    async def replace_from(self, criterion: bytes, seq: int, events: Sequence[Event]) -> list[Event]:
        orphaned = await self._inner.replace_from(criterion, seq, events)
        self.appended += len(events)
        self.batches += 1
        return orphaned

    async def orphans(self, criterion: bytes) -> list[Event]:
        return await self._inner.orphans(criterion)

    async def drop(self, criterion: bytes) -> int:
        return await self._inner.drop(criterion)

    async def get_cursor(self, name: str) -> bytes | None:
        return await self._inner.get_cursor(name)

    async def put_cursor(self, name: str, value: bytes) -> None:
        await self._inner.put_cursor(name, value)

    async def cursors(self, prefix: str) -> Mapping[str, bytes]:
        return await self._inner.cursors(prefix)


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"store": ["counting"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("store", "counting"):
        return None
    return PluginSpec({
        "backing": Option("the MemoryBacking that keeps the chains across opens", MemoryBacking),
        "report_every": Option("log a line each time this many more events were appended", int),
    })


@hookimpl
def ketten_make_store(name: str, options: Mapping[str, Any],
                      node: NodeContext) -> CountingStore | None:
    if name != "counting":
        return None
    # The node has checked the names and types against ketten_plugin_spec;
    # what is left to check is the range.
    report_every = options.get("report_every", 0)
    if report_every < 0:
        raise ConfigError(f"store option 'report_every' of the store plugin 'counting' must "
                          f"be 0 or more, got {report_every}")
    return CountingStore(backing=options.get("backing"), report_every=report_every)
