"""The ``lamport`` clock: a Lamport counter with the author as tie-break.

``stamp()`` increments the counter; ``observe()`` sets it to the maximum of
itself and the received counter (the next stamp then exceeds both). A stamp is
the canonical CBOR array ``[counter, author key]`` and stamps are totally
ordered by ``(counter, author)``: if ``a`` happened before ``b`` then ``a``
compares ``BEFORE`` ``b``, but ``BEFORE`` does not prove causality (use the
``vector`` clock for that). ``compare()`` never answers ``CONCURRENT`` and
answers ``EQUAL`` only for identical stamps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ketten import PluginSpec, hookimpl
from ketten.errors import ConfigError, DecodeError, UsageError
from ketten.interfaces import ClockOrder
from ketten.wire import MAX_UINT, head_size, loads
from ketten.wire import dumps_canonical as dumps

if TYPE_CHECKING:
    from ketten import Node

__all__ = ["LamportClock", "decode_lamport", "encode_lamport"]

_AUTHOR_SIZE = 32
_MAX_SIZE = 1 + 9 + 2 + _AUTHOR_SIZE
_WHERE = "lamport stamp"


def encode_lamport(counter: int, author: bytes) -> bytes:
    """The canonical encoding of a Lamport stamp."""
    return dumps([counter, author])


def decode_lamport(data: bytes) -> tuple[int, bytes]:
    """``(counter, author)`` of a canonical Lamport stamp.

    Raises :class:`~ketten.errors.DecodeError` (and nothing else) for anything
    but a canonical array of a counter in ``1 .. 2**63-1`` and a 32-byte key.
    """
    value = loads(data, max_size=_MAX_SIZE, where=_WHERE)
    if type(value) is not list or len(value) != 2:
        raise DecodeError("expected an array [counter, author]", where=_WHERE)
    counter, author = value
    if type(counter) is not int or not 0 < counter <= MAX_UINT:
        raise DecodeError(f"counter must be in 1..2**63-1, got {counter!r:.40}", where=_WHERE)
    if type(author) is not bytes or len(author) != _AUTHOR_SIZE:
        raise DecodeError("author must be a 32-byte key", where=_WHERE)
    if len(data) != 1 + head_size(counter) + 2 + _AUTHOR_SIZE:
        raise DecodeError("not a canonical encoding", where=_WHERE)
    return counter, author


def _check_owner(_: object, __: attrs.Attribute[bytes], value: bytes) -> None:
    if type(value) is not bytes or len(value) != _AUTHOR_SIZE:
        raise UsageError("a Lamport clock's owner must be a 32-byte public key")


@attrs.define(eq=False)
class LamportClock:
    """A :class:`~ketten.interfaces.Clock` owned by the author ``owner``."""

    _owner: bytes = attrs.field(alias="owner", validator=_check_owner)
    _counter: int = attrs.field(default=0, init=False)

    @property
    def owner(self) -> bytes:
        return self._owner

    @property
    def counter(self) -> int:
        """The counter of the latest stamp issued or observed."""
        return self._counter

    def stamp(self) -> bytes:
        """Increment the counter and return the encoded stamp."""
        if self._counter >= MAX_UINT:
            raise UsageError("the Lamport counter is exhausted")
        self._counter += 1
        return encode_lamport(self._counter, self._owner)

    def observe(self, stamp: bytes) -> None:
        """Take the maximum with a received stamp.

        Raises :class:`~ketten.errors.DecodeError`; the clock is then unchanged.
        """
        counter, _ = decode_lamport(stamp)
        if counter > self._counter:
            self._counter = counter

    def compare(self, a: bytes, b: bytes) -> ClockOrder:
        """Order two stamps by ``(counter, author)``. Raises :class:`~ketten.errors.DecodeError`."""
        x = decode_lamport(a)
        y = decode_lamport(b)
        if x < y:
            return ClockOrder.BEFORE
        if x > y:
            return ClockOrder.AFTER
        return ClockOrder.EQUAL


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"clock": ["lamport"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    return PluginSpec() if (kind, name) == ("clock", "lamport") else None


@hookimpl
def ketten_make_clock(name: str, options: Mapping[str, Any], node: Node) -> LamportClock | None:
    if name != "lamport":
        return None
    if options:
        raise ConfigError(f"the lamport clock takes no options, got {', '.join(sorted(options))}")
    return LamportClock(node.identity.public_key)
