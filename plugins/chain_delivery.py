"""The ``chain`` delivery: each criterion's events in chain order, exactly once.

Event ``seq n+1`` of a criterion reaches the application only after ``seq n``
of the same criterion; criteria are independent of each other. Events that
arrive early wait in a holdback queue keyed by ``(criterion, seq)``, so the
arrival of the missing event releases the run behind it without scanning
anything else. Offers of a position already delivered or held are dropped.

Options (all optional): ``criteria`` restricts the queue to these criterion
keys (offering another is a :class:`~ketten.errors.UsageError`); ``start``
maps a criterion to the first seq to deliver (default 0, for a subscription
that resumes from a cursor); ``max_held`` bounds the holdback queue (default
65536): an event that would exceed it is refused with
:class:`~ketten.errors.HoldbackFull` and counted in
``statistics().refused``.

The subscription layer calls :meth:`ChainDelivery.offer` with every event it
receives for the subscription (duplicates and any order are fine) and hands
the returned events to the application in the returned order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ketten import Event, Option, PluginSpec, hookimpl
from ketten.errors import ConfigError, UsageError

from ._holdback import (
    DEFAULT_MAX_HELD,
    DeliveryStatistics,
    HoldbackFull,
    parse_criteria,
    parse_max_held,
    parse_positions,
)

if TYPE_CHECKING:
    from ketten import Node

__all__ = ["ChainDelivery", "DeliveryStatistics", "HoldbackFull"]


@attrs.define(eq=False, on_setattr=attrs.setters.NO_OP)
class ChainDelivery:
    """A :class:`~ketten.interfaces.Delivery` in per-criterion chain order.

    ``criteria=None`` accepts every criterion.
    """

    _criteria: frozenset[bytes] | None = attrs.field(default=None, alias="criteria")
    _start: Mapping[bytes, int | None] = attrs.field(factory=dict, alias="start")
    _max_held: int = attrs.field(default=DEFAULT_MAX_HELD, alias="max_held")
    _next: dict[bytes, int] = attrs.field(factory=dict, init=False)
    _held: dict[bytes, dict[int, Event]] = attrs.field(factory=dict, init=False)
    _held_count: int = attrs.field(default=0, init=False)
    _stats: dict[str, int] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self._stats = dict.fromkeys(attrs.fields_dict(DeliveryStatistics), 0)

    def offer(self, event: Event) -> list[Event]:
        """Take a received event; return the events deliverable now, in order.

        Raises :class:`~ketten.errors.UsageError` for an event of a criterion
        outside ``criteria`` and :class:`HoldbackFull` when the event would
        have to wait and the queue is at its bound (the event is not taken).
        """
        stats = self._stats
        criterion = event.criterion
        if self._criteria is not None and criterion not in self._criteria:
            raise UsageError(f"criterion {criterion.hex()[:16]} is not one this queue delivers")
        stats["offered"] += 1
        expected = self._next.get(criterion)
        if expected is None:
            expected = self._next[criterion] = self._start.get(criterion) or 0
        seq = event.seq
        if seq < expected:
            stats["duplicates"] += 1
            return []
        held = self._held.get(criterion)
        if seq > expected:
            if held is None:
                held = self._held[criterion] = {}
            other = held.get(seq)
            if other is not None:
                stats["duplicates"] += 1
                if other.hash != event.hash:
                    stats["conflicts"] += 1
                return []
            if self._held_count >= self._max_held:
                stats["refused"] += 1
                raise HoldbackFull(criterion, seq, self._max_held)
            held[seq] = event
            self._held_count += 1
            if self._held_count > stats["peak_held"]:
                stats["peak_held"] = self._held_count
            return []
        out = [event]
        seq = self._release(criterion, seq + 1, out)
        self._held_count -= len(out) - 1
        self._next[criterion] = seq
        stats["delivered"] += len(out)
        return out

    def _release(self, criterion: bytes, seq: int, out: list[Event]) -> int:
        """Move the held run of ``criterion`` from ``seq`` on to ``out``; the seq after it."""
        held = self._held.get(criterion)
        while held:
            following = held.pop(seq, None)
            if following is None:
                break
            out.append(following)
            seq += 1
        return seq

    def pending(self) -> int:
        """How many events are held back."""
        return self._held_count

    def skip(self, criterion: bytes, seq: int) -> list[Event]:
        """The application gives up the events of ``criterion`` before ``seq``.

        Held events before ``seq`` are dropped; delivery goes on at ``seq``.
        Returns the held run that now follows, in order (often none). A
        ``seq`` at or before the next one to deliver changes nothing.
        """
        if self._criteria is not None and criterion not in self._criteria:
            raise UsageError(f"criterion {criterion.hex()[:16]} is not one this queue delivers")
        if seq <= self.next_seq(criterion):
            return []
        held = self._held.get(criterion)
        if held:
            for old in [s for s in held if s < seq]:
                del held[old]
                self._held_count -= 1
        out: list[Event] = []
        seq = self._release(criterion, seq, out)
        self._held_count -= len(out)
        self._next[criterion] = seq
        self._stats["delivered"] += len(out)
        return out

    def next_seq(self, criterion: bytes) -> int:
        """The seq the application receives next from ``criterion``."""
        seq = self._next.get(criterion)
        return seq if seq is not None else self._start.get(criterion) or 0

    def statistics(self) -> DeliveryStatistics:
        """A frozen snapshot of the counters."""
        return DeliveryStatistics(**{**self._stats, "held": self._held_count})


def make_chain_delivery(options: Mapping[str, Any]) -> ChainDelivery:
    """Build a chain delivery from factory options. Raises :class:`~ketten.errors.ConfigError`."""
    unknown = set(options) - {"criteria", "start", "max_held"}
    if unknown:
        raise ConfigError(f"unknown chain delivery options: {', '.join(sorted(unknown))}")
    raw: Iterable[bytes] | None = options.get("criteria")
    criteria = frozenset(parse_criteria(raw)) if raw is not None else None
    start = parse_positions(options.get("start", {}), "start", allow_none=False)
    return ChainDelivery(criteria=criteria, start=start, max_held=parse_max_held(options))


@hookimpl
def ketten_plugin_names() -> Mapping[str, list[str]]:
    return {"delivery": ["chain"]}


@hookimpl
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    if (kind, name) != ("delivery", "chain"):
        return None
    return PluginSpec({
        "criteria": Option("the subscribed keys (set by the node)", object),
        "start": Option("first seq per key (set by the node)", object),
        "max_held": Option("events held back at most", int),
    })


@hookimpl
def ketten_make_delivery(name: str, options: Mapping[str, Any], node: Node) -> ChainDelivery | None:
    if name != "chain":
        return None
    return make_chain_delivery(options)
