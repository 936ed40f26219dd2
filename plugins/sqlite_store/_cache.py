"""What the ``sqlite`` store knows of its chains in memory (sans-IO, no SQLite, no trio).

The cache is changed only by what committed: :meth:`ChainCache.committed`
after an append is durable, :meth:`ChainCache.reset` after a fork
resolution or a quarantine rewrote a chain. Entries filled from reads carry
the generation of their chain at the time the read began and are dropped
if a commit touched the chain meanwhile, so a slow read never installs a
state older than the one committed.

Per chain: the head position (always, loaded at open), the last few events
of the main chain ending at the head, and optionally the whole command
index of the main chain (loaded on the first ``by_command`` that needs it),
which answers misses for new commands without a query.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import attrs

from ketten import Event

__all__ = ["RECENT", "ChainCache", "Commands"]

RECENT = 32
_MAX_COMMAND_ENTRIES = 1_000_000

Commands = dict[tuple[bytes, int], int]
"""``{(author, command): seq}`` of one chain's main-chain events that carry a command."""


@attrs.define(eq=False)
class ChainCache:
    """Heads, recent events and command indexes of the chains of one store."""

    _heads: dict[bytes, tuple[int, bytes]] = attrs.field(factory=dict)
    _recent: dict[bytes, deque[Event]] = attrs.field(factory=dict, init=False)
    _commands: dict[bytes, Commands] = attrs.field(factory=dict, init=False)
    _command_entries: int = attrs.field(default=0, init=False)
    _generation: dict[bytes, int] = attrs.field(factory=dict, init=False)

    # -- reading -------------------------------------------------------------

    def heads(self) -> dict[bytes, tuple[int, bytes]]:
        """A copy of ``{criterion: (head seq, head hash)}``."""
        return dict(self._heads)

    def head_position(self, criterion: bytes) -> tuple[int, bytes] | None:
        return self._heads.get(criterion)

    def head_event(self, criterion: bytes) -> Event | None:
        """The head event if it is in memory (``None``: unknown here, or no chain)."""
        recent = self._recent.get(criterion)
        return recent[-1] if recent else None

    def generation(self, criterion: bytes) -> int:
        return self._generation.get(criterion, 0)

    def range(self, criterion: bytes, start: int, stop: int | None) -> list[Event] | None:
        """Main-chain events in ``[start, stop)`` if memory can answer exactly, else ``None``."""
        position = self._heads.get(criterion)
        start = max(start, 0)
        height = position[0] + 1 if position is not None else 0
        stop = height if stop is None else min(stop, height)
        if stop <= start:
            return []
        recent = self._recent.get(criterion)
        if not recent or recent[0].seq > start:
            return None
        first = recent[0].seq
        return [recent[i] for i in range(start - first, stop - first)]

    def by_command(self, criterion: bytes, author: bytes, command: int) -> Event | int | None:
        """The event with this command id (or its seq, to read from disk), ``None`` if there
        is none, or ``-1`` when memory cannot tell."""
        if criterion not in self._heads:
            return None
        recent = self._recent.get(criterion)
        if recent:
            for event in reversed(recent):
                if event.command == command and event.author == author:
                    return event
        index = self._commands.get(criterion)
        if index is None:
            return -1
        return index.get((author, command))

    # -- changing --------------------------------------------------------------

    def committed(self, events: Sequence[Event]) -> None:
        """``events`` (each extending its chain's head, in order) are durable."""
        groups: dict[bytes, list[Event]] = {}
        for event in events:
            group = groups.get(event.criterion)
            if group is None:
                groups[event.criterion] = [event]
            else:
                group.append(event)
        for criterion, group in groups.items():
            self._bump(criterion)
            last = group[-1]
            self._heads[criterion] = (last.seq, last.hash)
            recent = self._recent.get(criterion)
            if not recent or recent[-1].seq != group[0].seq - 1:
                recent = self._recent[criterion] = deque(maxlen=RECENT)
            recent.extend(group[-RECENT:])
            index = self._commands.get(criterion)
            if index is not None:
                for event in group:
                    if event.command is not None:
                        index[(event.author, event.command)] = event.seq
                        self._command_entries += 1

    def reset(self, criterion: bytes, head: tuple[int, bytes] | None,
              events: Iterable[Event] = ()) -> None:
        """The chain was rewritten: its head is now ``head``; ``events`` end at it."""
        self._bump(criterion)
        self._recent.pop(criterion, None)
        self._drop_commands(criterion)
        if head is None:
            self._heads.pop(criterion, None)
            return
        self._heads[criterion] = head
        tail = deque(events, maxlen=RECENT)
        if tail and (tail[-1].seq, tail[-1].hash) == head:
            self._recent[criterion] = tail

    def read_head(self, criterion: bytes, generation: int, event: Event | None) -> None:
        """A head read from disk when the chain had ``generation``; kept if still current."""
        if event is None or self.generation(criterion) != generation:
            return
        if self._heads.get(criterion) == (event.seq, event.hash) and criterion not in self._recent:
            self._recent[criterion] = deque((event,), maxlen=RECENT)

    def read_commands(self, criterion: bytes, generation: int, index: Commands) -> None:
        """A chain's command index read from disk at ``generation``; kept if still current."""
        if self.generation(criterion) != generation or criterion in self._commands:
            return
        if self._command_entries + len(index) > _MAX_COMMAND_ENTRIES:
            self._commands.clear()
            self._command_entries = 0
            if len(index) > _MAX_COMMAND_ENTRIES // 2:
                return
        self._commands[criterion] = index
        self._command_entries += len(index)

    def clear(self, heads: Mapping[bytes, tuple[int, bytes]] | None = None) -> None:
        """Forget everything (closed) or start from ``heads`` (opened)."""
        self._heads = dict(heads or {})
        self._recent.clear()
        self._commands.clear()
        self._command_entries = 0
        for criterion in self._generation:
            self._generation[criterion] += 1

    def _bump(self, criterion: bytes) -> None:
        self._generation[criterion] = self._generation.get(criterion, 0) + 1

    def _drop_commands(self, criterion: bytes) -> None:
        index = self._commands.pop(criterion, None)
        if index is not None:
            self._command_entries -= len(index)
