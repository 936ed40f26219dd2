"""Calls in flight on something that closes: a node, a subscription.

A call made from a task of the application's own (not the node's nursery)
would otherwise outlive what it calls: a publish would run out its whole
deadline against a transport that is gone, a subscriber would wait for
events that can no longer come. Each such call runs inside :meth:`Closing.call`;
:meth:`Closing.close` cancels them all at once, and they raise the closing
error instead; calls made afterwards raise it at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import trio

from ..errors import KettenError, NodeClosed

__all__ = ["Closing"]


@attrs.define(eq=False)
class Closing:
    """The calls running on one closable thing; once it is closed they raise
    :class:`~ketten.errors.NodeClosed`."""

    what: str
    """How errors name the closed thing ("the node", "durable subscription 'x'")."""
    _closed: bool = attrs.field(default=False, init=False)
    _calls: set[trio.CancelScope] = attrs.field(factory=set, init=False)

    @property
    def closed(self) -> bool:
        return self._closed

    def check(self) -> None:
        """Raise :class:`~ketten.errors.NodeClosed` if closed."""
        if self._closed:
            raise NodeClosed(f"{self.what} is closed")

    @contextmanager
    def call(self) -> Iterator[None]:
        """Run the block as a call that :meth:`close` ends with
        :class:`~ketten.errors.NodeClosed`.

        Any other :class:`~ketten.errors.KettenError` the block raises once
        closed (a store closed under it, say) becomes ``NodeClosed`` too: the
        cause is the closing, not the store."""
        self.check()
        scope = trio.CancelScope()
        self._calls.add(scope)
        try:
            with scope:
                yield
        except KettenError as exc:
            if self._closed and not isinstance(exc, NodeClosed):
                raise NodeClosed(f"{self.what} closed while the call ran") from exc
            raise
        finally:
            self._calls.discard(scope)
        if scope.cancelled_caught:
            raise NodeClosed(f"{self.what} closed while the call ran")

    def close(self) -> None:
        """End every call in flight; later calls fail at once."""
        self._closed = True
        for scope in self._calls:
            scope.cancel()
