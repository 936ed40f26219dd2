"""Where a transport parks a request until its reply (or failure) arrives."""

from __future__ import annotations

import attrs
import trio

from ketten.errors import KettenError
from ketten.interfaces import Reply

__all__ = ["ReplySlot"]


@attrs.define(eq=False)
class ReplySlot:
    """The first outcome settled wins; later ones (duplicates, late replies) are ignored."""

    done: trio.Event = attrs.field(factory=trio.Event)
    outcome: Reply | KettenError | None = None

    @property
    def settled(self) -> bool:
        return self.done.is_set()

    def settle(self, outcome: Reply | KettenError) -> None:
        if not self.done.is_set():
            self.outcome = outcome
            self.done.set()

    async def result(self) -> Reply:
        """Wait for the outcome: the reply, or the error it settled with (raised)."""
        await self.done.wait()
        outcome = self.outcome
        if isinstance(outcome, KettenError):
            raise outcome
        assert outcome is not None
        return outcome
