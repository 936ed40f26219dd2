"""The ``memory`` store: everything in dictionaries.

Nothing reaches a disk. A :class:`MemoryBacking` passed as the ``backing``
option outlives the store object, so a simulated node can "restart" and find
its data again; without one every store starts empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ketten import Event, Option, PluginSpec, hookimpl
from ketten.errors import ConfigError, StoreConflict, StoreError

if TYPE_CHECKING:
    from ketten import Node

__all__ = ["MemoryBacking", "MemoryStore"]


@attrs.define(eq=False)
class _ChainData:
    events: list[Event] = attrs.field(factory=list)
    commands: dict[tuple[bytes, int], int] = attrs.field(factory=dict)
    orphans: list[Event] = attrs.field(factory=list)


@attrs.define(eq=False)
class MemoryBacking:
    """The data of a memory store; keep it to reopen the same store later."""

    chains: dict[bytes, _ChainData] = attrs.field(factory=dict)
    by_hash: dict[bytes, Event] = attrs.field(factory=dict)
    cursors: dict[str, bytes] = attrs.field(factory=dict)


@attrs.define(eq=False)
class MemoryStore:
    """A :class:`~ketten.interfaces.Store` held in memory."""

    _backing: MemoryBacking = attrs.field(factory=MemoryBacking, alias="backing")
    _open: bool = attrs.field(default=False, init=False)

    async def open(self) -> None:
        self._open = True

    async def aclose(self) -> None:
        self._open = False

    def _check_open(self) -> None:
        if not self._open:
            raise StoreError("the memory store is not open")

    async def append(self, events: Sequence[Event]) -> None:
        self._check_open()
        # Validate the whole batch against a scratch view first: all or none.
        pending_heads: dict[bytes, tuple[int, bytes | None]] = {}
        pending_cmds: set[tuple[bytes, bytes, int]] = set()
        for event in events:
            chain = self._backing.chains.get(event.criterion)
            if event.criterion in pending_heads:
                next_seq, head_hash = pending_heads[event.criterion]
            elif chain and chain.events:
                next_seq, head_hash = len(chain.events), chain.events[-1].hash
            else:
                next_seq, head_hash = 0, None
            if event.seq != next_seq or event.prev != head_hash:
                raise StoreConflict(
                    f"criterion {event.criterion.hex()[:16]}: seq {event.seq} does not extend "
                    f"the head (next seq {next_seq})"
                )
            if event.command is not None:
                key = (event.criterion, event.author, event.command)
                taken = chain is not None and (event.author, event.command) in chain.commands
                if taken or key in pending_cmds:
                    raise StoreConflict(
                        f"criterion {event.criterion.hex()[:16]}: command {event.command} of "
                        f"author {event.author.hex()[:16]} is already in the chain"
                    )
                pending_cmds.add(key)
            pending_heads[event.criterion] = (event.seq + 1, event.hash)
        for event in events:
            chain = self._backing.chains.setdefault(event.criterion, _ChainData())
            chain.events.append(event)
            if event.command is not None:
                chain.commands[(event.author, event.command)] = event.seq
            self._backing.by_hash[event.hash] = event
        await trio.lowlevel.checkpoint()

    async def get(self, event_hash: bytes) -> Event | None:
        self._check_open()
        await trio.lowlevel.checkpoint()
        return self._backing.by_hash.get(event_hash)

    async def head(self, criterion: bytes) -> Event | None:
        self._check_open()
        await trio.lowlevel.checkpoint()
        chain = self._backing.chains.get(criterion)
        return chain.events[-1] if chain and chain.events else None

    async def heads(self) -> Mapping[bytes, tuple[int, bytes]]:
        self._check_open()
        await trio.lowlevel.checkpoint()
        return {
            key: (chain.events[-1].seq, chain.events[-1].hash)
            for key, chain in self._backing.chains.items()
            if chain.events
        }

    async def range(self, criterion: bytes, start: int = 0, stop: int | None = None) -> list[Event]:
        self._check_open()
        await trio.lowlevel.checkpoint()
        chain = self._backing.chains.get(criterion)
        if chain is None:
            return []
        return chain.events[max(start, 0) : stop]

    async def by_command(self, criterion: bytes, author: bytes, command: int) -> Event | None:
        self._check_open()
        await trio.lowlevel.checkpoint()
        chain = self._backing.chains.get(criterion)
        if chain is None:
            return None
        seq = chain.commands.get((author, command))
        return chain.events[seq] if seq is not None else None

    async def replace_from(self, criterion: bytes, seq: int, events: Sequence[Event]) -> list[Event]:
        self._check_open()
        chain = self._backing.chains.setdefault(criterion, _ChainData())
        if not 0 <= seq <= len(chain.events):
            raise StoreConflict(f"cannot replace from seq {seq} of a chain of height {len(chain.events)}")
        removed = chain.events[seq:]
        kept_commands = {k: v for k, v in chain.commands.items() if v < seq}
        expected_prev = chain.events[seq - 1].hash if seq > 0 else None
        commands = dict(kept_commands)
        for offset, event in enumerate(events):
            if event.criterion != criterion or event.seq != seq + offset or event.prev != expected_prev:
                raise StoreConflict(f"replacement event seq {event.seq} does not extend seq {seq + offset - 1}")
            if event.command is not None:
                if (event.author, event.command) in commands:
                    raise StoreConflict(f"replacement reuses command {event.command}")
                commands[(event.author, event.command)] = event.seq
            expected_prev = event.hash
        del chain.events[seq:]
        chain.events.extend(events)
        chain.commands = commands
        chain.orphans.extend(removed)
        for event in events:
            self._backing.by_hash[event.hash] = event
        await trio.lowlevel.checkpoint()
        return removed

    async def orphans(self, criterion: bytes) -> list[Event]:
        self._check_open()
        await trio.lowlevel.checkpoint()
        chain = self._backing.chains.get(criterion)
        return list(chain.orphans) if chain else []

    async def drop(self, criterion: bytes) -> int:
        self._check_open()
        chain = self._backing.chains.pop(criterion, None)
        removed = 0
        if chain is not None:
            for event in (*chain.events, *chain.orphans):
                self._backing.by_hash.pop(event.hash, None)
            removed = len(chain.events) + len(chain.orphans)
        await trio.lowlevel.checkpoint()
        return removed

    async def get_cursor(self, name: str) -> bytes | None:
        self._check_open()
        await trio.lowlevel.checkpoint()
        return self._backing.cursors.get(name)

    async def put_cursor(self, name: str, value: bytes) -> None:
        self._check_open()
        self._backing.cursors[name] = bytes(value)
        await trio.lowlevel.checkpoint()

    async def cursors(self, prefix: str) -> dict[str, bytes]:
        self._check_open()
        await trio.lowlevel.checkpoint()
        return {k: v for k, v in sorted(self._backing.cursors.items()) if k.startswith(prefix)}


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"store": ["memory"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("store", "memory"):
        return None
    return PluginSpec({"backing": Option("the MemoryBacking that keeps the chains across "
                                         "opens of the node", MemoryBacking)})


@hookimpl
def ketten_make_store(name: str, options: Mapping[str, Any], node: Node) -> MemoryStore | None:
    if name != "memory":
        return None
    backing = options.get("backing")
    if backing is None:
        return MemoryStore()
    if not isinstance(backing, MemoryBacking):
        raise ConfigError(f"store option 'backing' must be a MemoryBacking, got {type(backing).__name__}")
    return MemoryStore(backing=backing)
