"""The ``vector`` clock: a vector clock over author keys (seed 001, section 2.2).

The clock of a node is a sparse map ``author public key -> counter``; missing
authors count as 0, so vectors of different sizes compare and merge as if
padded with zeros. ``stamp()`` ticks the node's own entry and returns the
canonical encoding of the whole vector, which travels in ``Event.clock``;
``observe()`` merges a received stamp by entry-wise maximum; ``compare()``
orders two stamps exactly: ``BEFORE`` iff the first event happened before the
second.

Stamps are canonical CBOR maps (see :mod:`ketten.plugins._clock_vector`);
anything else is a :class:`~ketten.errors.DecodeError`. The factory option
``max_authors`` (default 4096) bounds the size of a stamp this clock accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ketten import Option, PluginSpec, hookimpl
from ketten.errors import ConfigError, UsageError
from ketten.interfaces import ClockOrder
from ketten.wire import MAX_UINT

from ._clock_vector import (
    AUTHOR_SIZE,
    DEFAULT_MAX_AUTHORS,
    VectorDecoder,
    compare_vectors,
    decode_vector,
    encode_vector,
    merge_into,
)

if TYPE_CHECKING:
    from ketten import Node

__all__ = ["VectorClock", "decode_vector", "encode_vector"]

_REMEMBERED = 1024
_REMEMBERED_SIZE = 2048
"""Merged stamps remembered, and the largest remembered (at most 2 MiB in all)."""


def _check_owner(_: object, __: attrs.Attribute[bytes], value: bytes) -> None:
    if type(value) is not bytes or len(value) != AUTHOR_SIZE:
        raise UsageError("a vector clock's owner must be a 32-byte public key")


@attrs.define(eq=False)
class VectorClock:
    """A :class:`~ketten.interfaces.Clock` owned by the author ``owner``."""

    _owner: bytes = attrs.field(alias="owner", validator=_check_owner)
    _max_authors: int = attrs.field(default=DEFAULT_MAX_AUTHORS, alias="max_authors", kw_only=True)
    _vector: dict[bytes, int] = attrs.field(factory=dict, init=False)
    _decode: VectorDecoder = attrs.field(init=False)
    _merged: set[bytes] = attrs.field(factory=set, init=False)
    """Stamps merged lately: a node observes each event when it stores it and again
    when it delivers it, and merging a stamp twice changes nothing."""

    def __attrs_post_init__(self) -> None:
        self._decode = VectorDecoder(max_authors=self._max_authors)

    @property
    def owner(self) -> bytes:
        return self._owner

    def vector(self) -> dict[bytes, int]:
        """A copy of the current vector (authors with counter 0 left out)."""
        return dict(self._vector)

    def stamp(self) -> bytes:
        """Tick the owner's entry and return the encoded vector."""
        counter = self._vector.get(self._owner, 0) + 1
        if counter > MAX_UINT:
            raise UsageError("the vector clock's own counter is exhausted")
        self._vector[self._owner] = counter
        return encode_vector(self._vector)

    def observe(self, stamp: bytes) -> None:
        """Merge a received stamp (entry-wise maximum).

        Raises :class:`~ketten.errors.DecodeError` for a malformed stamp; the
        clock is then unchanged.
        """
        known = type(stamp) is bytes
        if known and stamp in self._merged:
            return
        merge_into(self._vector, self._decode(stamp))
        if known and len(stamp) <= _REMEMBERED_SIZE:
            if len(self._merged) >= _REMEMBERED:
                self._merged.clear()
            self._merged.add(stamp)

    def compare(self, a: bytes, b: bytes) -> ClockOrder:
        """How the event stamped ``a`` relates to the one stamped ``b``.

        Raises :class:`~ketten.errors.DecodeError` if either is malformed.
        """
        return compare_vectors(self._decode(a), self._decode(b))


def make_vector_clock(options: Mapping[str, Any], owner: bytes) -> VectorClock:
    """Build a vector clock from factory options. Raises :class:`~ketten.errors.ConfigError`."""
    unknown = set(options) - {"max_authors"}
    if unknown:
        raise ConfigError(f"unknown vector clock options: {', '.join(sorted(unknown))}")
    max_authors = options.get("max_authors", DEFAULT_MAX_AUTHORS)
    if type(max_authors) is not int or max_authors < 1:
        raise ConfigError(f"clock option 'max_authors' must be a positive int, got {max_authors!r}")
    return VectorClock(owner, max_authors=max_authors)


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"clock": ["vector"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("clock", "vector"):
        return None
    return PluginSpec({"max_authors": Option("authors one stamp may name", int)})


@hookimpl
def ketten_make_clock(name: str, options: Mapping[str, Any], node: Node) -> VectorClock | None:
    if name != "vector":
        return None
    return make_vector_clock(options, node.identity.public_key)
