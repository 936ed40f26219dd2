"""The fault model of the simulated network, sans-IO.

It decides, with its own seeded random generator, what happens to each
message: lost, cut off by a partition, delivered once or twice, and after
which delay. It never sleeps and never reads a clock; the trio driver in
:mod:`ketten.adapters.memory` does.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import attrs

from ketten.errors import ConfigError

__all__ = ["Faults", "NetworkModel", "NetworkStatistics"]


def _probability(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{attribute.name} must be a probability in [0, 1], got {value}")


def _non_negative(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if value < 0:
        raise ConfigError(f"{attribute.name} must not be negative, got {value}")


@attrs.frozen
class Faults:
    """How links behave. Times are seconds of (virtual) time."""

    latency: float = attrs.field(default=0.005, validator=_non_negative)
    """Base one-way delay of every message."""
    jitter: float = attrs.field(default=0.0, validator=_non_negative)
    """Extra delay drawn uniformly from ``[0, jitter)``. Links stay FIFO: jitter
    delays a message but never lets it overtake an earlier one on its link."""
    loss: float = attrs.field(default=0.0, validator=_probability)
    """Probability that a message is lost."""
    duplicate: float = attrs.field(default=0.0, validator=_probability)
    """Probability that a delivered message arrives twice."""
    reorder: float = attrs.field(default=0.0, validator=_probability)
    """Probability that a message is held back by up to ``reorder_window``,
    so that later messages on the same link overtake it."""
    reorder_window: float = attrs.field(default=0.05, validator=_non_negative)


@attrs.frozen
class NetworkStatistics:
    """Counters of the fault model since it was made."""

    sent: int
    delivered: int
    lost: int
    cut: int
    duplicated: int
    reordered: int


@attrs.define(eq=False)
class NetworkModel:
    """Decides the fate of every message. Same seed, same calls: same fates."""

    faults: Faults = attrs.field(factory=Faults)
    seed: int = 0
    _rng: random.Random = attrs.field(init=False)
    _cuts: list[tuple[frozenset[str], frozenset[str] | None]] = attrs.field(
        factory=list, init=False
    )
    _sent: int = attrs.field(default=0, init=False)
    _delivered: int = attrs.field(default=0, init=False)
    _lost: int = attrs.field(default=0, init=False)
    _cut: int = attrs.field(default=0, init=False)
    _duplicated: int = attrs.field(default=0, init=False)
    _reordered: int = attrs.field(default=0, init=False)
    _link_clock: dict[tuple[str, str], float] = attrs.field(factory=dict, init=False)
    _prune_at: int = attrs.field(default=1024, init=False)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def cut(self, group: Iterable[str], other: Iterable[str] | None = None) -> None:
        """Stop all traffic between ``group`` and ``other`` (default: everyone else)."""
        self._cuts.append((frozenset(group), frozenset(other) if other is not None else None))

    def heal(self, group: Iterable[str] | None = None) -> None:
        """Undo the cuts made for ``group`` (default: every cut)."""
        if group is None:
            self._cuts.clear()
            return
        members = frozenset(group)
        self._cuts = [c for c in self._cuts if c[0] != members]

    def is_cut(self, src: str, dst: str) -> bool:
        for group, other in self._cuts:
            if src in group:
                if dst not in group and (other is None or dst in other):
                    return True
            elif dst in group and (other is None or src in other):
                return True
        return False

    def route(self, src: str, dst: str, now: float) -> list[float]:
        """The times at which copies of a message sent at ``now`` reach ``dst``.

        An empty list means the message is lost or cut off. Messages on one
        link arrive in the order they were sent unless picked for reordering.
        """
        self._sent += 1
        if self.is_cut(src, dst):
            self._cut += 1
            return []
        faults = self.faults
        rng = self._rng
        if faults.loss and rng.random() < faults.loss:
            self._lost += 1
            return []
        copies = 1
        if faults.duplicate and rng.random() < faults.duplicate:
            copies = 2
            self._duplicated += 1
        link = (src, dst)
        arrivals = []
        for _ in range(copies):
            arrival = now + faults.latency
            if faults.jitter:
                arrival += rng.random() * faults.jitter
            if faults.reorder and rng.random() < faults.reorder:
                arrival += rng.random() * faults.reorder_window
                self._reordered += 1
            else:
                # Strictly after the previous message on this link: FIFO.
                arrival = max(arrival, self._link_clock.get(link, 0.0) + 1e-9)
                self._link_clock[link] = arrival
            arrivals.append(arrival)
        self._delivered += copies
        if len(self._link_clock) > self._prune_at:
            self._link_clock = {k: t for k, t in self._link_clock.items() if t > now}
            self._prune_at = max(1024, 2 * len(self._link_clock))
        return arrivals

    def statistics(self) -> NetworkStatistics:
        return NetworkStatistics(
            sent=self._sent,
            delivered=self._delivered,
            lost=self._lost,
            cut=self._cut,
            duplicated=self._duplicated,
            reordered=self._reordered,
        )
