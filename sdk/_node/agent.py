"""``ketten.Agent``: an author identity with a persisted command counter.

A command id is ``(author public key, counter)``. The author is
self-certifying and the counter only ever grows, and it is stored before it
is handed out, so every id an agent issues is globally unique without a
central issuer, across restarts. Publishing the same id again is idempotent:
the brokers answer with the event already applied, or refuse other content
under the same id with :class:`~ketten.errors.CommandIdReused`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import trio

from .._core.identity import Identity
from ..errors import DecodeError, StoreError, UsageError
from .publisher import PUBLISH_DEADLINE

if TYPE_CHECKING:
    from .._core.event import Event
    from .node import Node
    from .publisher import ConflictHandler

__all__ = ["Agent"]

_MAGIC = b"ketten-agent-counter-v1\n"


def _read_counter_file(path: Path) -> int:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    if not data.startswith(_MAGIC):
        raise DecodeError("not a ketten agent counter file", where=str(path))
    text = data[len(_MAGIC):].strip()
    if not text.isdigit():
        raise DecodeError("the counter is not a decimal number", where=str(path))
    return int(text)


def _write_counter_file(path: Path, value: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, _MAGIC + str(value).encode("ascii") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@attrs.define(eq=False, repr=False)
class Agent:
    """An author of commands: an identity plus a persisted, growing counter.

    Open one with :meth:`open`. The counter lives in the node's store (a
    cursor named after the agent's key) or, with ``path``, in a file
    written atomically. :meth:`next_command` persists the new value before it
    returns it, so no id is handed out twice even if the process dies.
    """

    node: Node
    identity: Identity
    _path: Path | None = attrs.field(alias="path")
    _last: int = attrs.field(alias="last")
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    @classmethod
    async def open(
        cls,
        node: Node,
        *,
        identity: Identity | None = None,
        path: str | os.PathLike[str] | None = None,
    ) -> Agent:
        """The agent of ``identity`` (default: the node's) publishing through ``node``.

        Raises :class:`~ketten.errors.DecodeError` if the stored counter is
        damaged and :class:`~ketten.errors.StoreError` if it cannot be read.
        """
        who = identity if identity is not None else node.identity
        if path is not None:
            target = Path(path)
            last = await trio.to_thread.run_sync(_read_counter_file, target)
            return cls(node, who, path=target, last=last)
        raw = await node.store.get_cursor(cls._cursor_name(who))
        last = 0
        if raw is not None:
            if len(raw) != 8:
                raise DecodeError("the stored command counter is not 8 bytes",
                                  where="agent counter")
            last = int.from_bytes(raw, "big")
        return cls(node, who, path=None, last=last)

    @staticmethod
    def _cursor_name(identity: Identity) -> str:
        return "agent/" + identity.public_key.hex()

    @property
    def author(self) -> bytes:
        """The author key every command of this agent carries."""
        return self.identity.public_key

    @property
    def last_command(self) -> int:
        """The last counter value handed out (0: none yet)."""
        return self._last

    async def next_command(self) -> int:
        """A new command counter, stored durably before it is returned.

        Raises :class:`~ketten.errors.StoreError` if it cannot be stored.
        """
        async with self._lock:
            value = self._last + 1
            with trio.CancelScope(shield=True):
                if self._path is not None:
                    try:
                        await trio.to_thread.run_sync(_write_counter_file, self._path, value)
                    except OSError as exc:
                        raise StoreError(f"{self._path}: cannot store the counter: {exc}") from None
                else:
                    await self.node.store.put_cursor(
                        self._cursor_name(self.identity), value.to_bytes(8, "big"))
            self._last = value
            return value

    async def publish(
        self,
        criterion: bytes | str,
        payload: bytes,
        *,
        command: int | None = None,
        on_conflict: ConflictHandler | None = None,
        deadline: float = PUBLISH_DEADLINE,
    ) -> Event:
        """Publish ``payload`` as a command of this agent; see :meth:`ketten.Node.publish`.

        ``command=None`` takes :meth:`next_command`. Re-publishing an id that
        was already applied with the same payload returns the event in the
        chain. Raises what :meth:`ketten.Node.publish` raises, in particular
        :class:`~ketten.errors.CommandIdReused` and
        :class:`~ketten.errors.QuorumUnavailable`.
        """
        if command is None:
            command = await self.next_command()
        elif type(command) is not int or command < 0:
            raise UsageError("command must be a non-negative integer")
        return await self.node.publish(
            criterion, payload, command=command, on_conflict=on_conflict, deadline=deadline,
            author=self.identity,
        )
