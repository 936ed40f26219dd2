"""The fairness metric of chapter 4.2 of the GosSkip pub/sub seed.

Work is *fair* when every topic forwards lookups and joins (searches for
entry points) in proportion to its churn (subscriptions and
unsubscriptions). For a topic ``k`` the *fairness quotient* is::

    (churn_k + 1) / (lookup_k + join_k + 1)

where ``lookup_k`` and ``join_k`` count the lookup and join messages that
nodes in topic ``k``'s area forwarded. A method is fair when the largest
difference between the topics' quotients goes to zero, and cheap when the
quotients go to one (one hop per subscription).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

__all__ = ["TopicLoad", "fairness_quotient", "max_difference", "shares"]


def fairness_quotient(churn: int, lookups: int, joins: int) -> float:
    """``(churn + 1) / (lookups + joins + 1)``; raises :class:`ValueError` on a negative count."""
    if churn < 0 or lookups < 0 or joins < 0:
        raise ValueError("counts must not be negative")
    return (churn + 1) / (lookups + joins + 1)


def max_difference(quotients: Iterable[float]) -> float:
    """The largest difference between two of the quotients (0 for fewer than two)."""
    values = list(quotients)
    return max(values) - min(values) if len(values) > 1 else 0.0


@attrs.frozen
class TopicLoad:
    """One topic's row: its nodes, churn and forwarded lookups and joins."""

    topic: str
    pubnodes: int
    nodes: int
    """Working- and churnnodes in the topic's area at the end."""
    churn: int
    lookups: int
    joins: int

    @property
    def work(self) -> int:
        return self.lookups + self.joins

    @property
    def quotient(self) -> float:
        return fairness_quotient(self.churn, self.lookups, self.joins)


def shares(loads: Sequence[TopicLoad]) -> list[tuple[float, float]]:
    """Each topic's ``(churn share, work share)`` of the totals (0 where a total is 0)."""
    churn = sum(load.churn for load in loads)
    work = sum(load.work for load in loads)
    return [(load.churn / churn if churn else 0.0, load.work / work if work else 0.0)
            for load in loads]
