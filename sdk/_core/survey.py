"""What the nodes near a key said about its chain, and what follows from it, sans-IO.

A node that knows no route to a chain asks the nodes near its key: those the
overlay names and those it heard from lately (the overlay may have lost
them to a partition). :func:`tally` weighs their answers — the best route
any of them knows, whether any holds a copy, who may vouch that the chain is
absent — and :func:`conclude` decides: the route, a creation on the nearest
nodes, or a refusal naming why absence cannot be told.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from ..errors import QuorumUnavailable
from .membership import Member, majority
from .messages import Route

__all__ = ["Creation", "Located", "Survey", "Tally", "conclude", "doubt", "preference", "tally"]


@attrs.frozen
class Located:
    """One node's answer about one chain."""

    route: Route | None
    """The best route it knows."""
    held: bool
    """Whether it holds a copy or a route of the chain."""
    settled: bool
    """Whether it has had the hand-over of the chains near it (its "none" counts)."""


@attrs.frozen
class Survey:
    """What the nodes near a key said about its chain."""

    route: Route | None
    """The best route any of them (or this node) knows."""
    held: bool
    """Whether any of them holds a copy or a route of the chain."""
    answered: int
    """How many of the nodes the overlay named answered (this node counts)."""
    asked: int
    """How many nodes the overlay named."""
    nearest: int
    """How many make up the ``r`` nearest of all asked (overlay and remembered)."""
    nearest_answered: int
    """How many of those answered."""
    nearby: tuple[Member, ...] = ()
    """The nodes the overlay named nearest to the key, nearest first."""


@attrs.frozen
class Creation:
    """Nobody holds the chain: create it on ``members`` (nearest first)."""

    members: tuple[Member, ...]


@attrs.frozen
class Tally:
    """A survey's outcome, and the nodes that know another chain of the criterion."""

    survey: Survey
    rivals: tuple[tuple[Member, Route], ...]
    """Nodes whose route names another first event than this node's copy."""


_NEVER = 1 << 64


def preference(route: Route) -> tuple[bool, int, bytes, int, int, int]:
    """Sort key of routes, best first: the chain that stays should a criterion have
    been started twice (the older genesis, then the lower hash: the rule of
    :func:`~ketten._core.chain.genesis_wins`), then the one that knows the longest
    committed chain (a configuration that was abandoned before it committed can have
    a higher epoch than the one in force, never a longer committed chain), then the
    newest configuration and term."""
    return (route.genesis is None, route.genesis_time if route.genesis_time is not None
            else _NEVER, route.genesis or b"", 1 if route.commit is None
            else -route.commit[0], -route.config.epoch, -route.term)


def tally(*, goal: int, own: bytes, own_settled: bool, local: Route | None,
          nearby: Sequence[Member], asked: Sequence[Member],
          answers: Sequence[tuple[Member, Located | None]], replication: int,
          distance: Callable[[int, int], int]) -> Tally:
    """Weigh the answers of ``asked`` (the overlay's ``nearby`` first, then the nodes
    remembered near key ``goal``; ``None``: no answer) and this node's own view
    (``local``; ``own_settled``: it has had its hand-over).

    Only a node that has had its hand-over can vouch that a chain is absent; one
    that answered without it holds no copy (it would say so), so it is left out of
    the key's nearest: the nodes behind it must answer instead.
    """
    best = local
    held = False
    answering: set[bytes] = set()
    unsettled: set[bytes] = set()
    if any(m.key == own for m in asked):
        (answering if own_settled else unsettled).add(own)
    rivals: list[tuple[Member, Route]] = []
    for member, result in answers:
        if result is None:
            continue
        (answering if result.settled else unsettled).add(member.key)
        found = result.route
        held = held or result.held or found is not None
        if found is None:
            continue
        if best is None or preference(found) < preference(best):
            best = found
        if (local is not None and found.genesis is not None and local.genesis is not None
                and found.genesis != local.genesis):
            rivals.append((member, found))
    nearest = sorted((m for m in asked if m.key not in unsettled),
                     key=lambda m: distance(int.from_bytes(m.node_id, "big"), goal)
                     )[:replication]
    survey = Survey(route=best, held=held,
                    answered=sum(1 for m in nearby if m.key in answering),
                    asked=len(nearby) or 1,
                    nearest=len(nearest),
                    nearest_answered=sum(1 for m in nearest if m.key in answering),
                    nearby=tuple(nearby))
    return Tally(survey, tuple(rivals))


def doubt(criterion: bytes, found: Survey, replication: int, memory: float) -> str | None:
    """Why ``found`` cannot tell that the chain does not exist (``None``: it can):
    a majority of the nodes the overlay named, and of the ``replication`` nearest
    of all asked (remembered for ``memory`` seconds), must have answered."""
    if found.answered < majority(min(found.asked, replication) or 1):
        return (f"only {found.answered} of the {found.asked} nodes nearest to criterion "
                f"{criterion.hex()[:16]} answered; whether the chain exists cannot be told")
    if found.nearest_answered < majority(found.nearest):
        return (f"only {found.nearest_answered} of the {found.nearest} nodes nearest to "
                f"criterion {criterion.hex()[:16]} that this node heard from within the "
                f"last {memory:g} s answered (the overlay may have lost them to a "
                "partition); whether the chain exists cannot be told")
    return None


def conclude(criterion: bytes, found: Survey, *, known: Route | None, exists: bool,
             replication: int, overlay: bool, memory: float) -> Route | Creation:
    """The route to the chain, or where to create it, after ``found``.

    ``known``: a route learned earlier (the chain exists, its brokers silent now);
    ``exists``: this node has seen the chain exist; ``overlay``: nodes are found
    through an overlay (without one, this node alone makes up a new chain's set).

    Raises :class:`~ketten.errors.QuorumUnavailable` when the chain exists but
    none of its brokers answered, too few nodes are known for a new chain, or too
    few answered to tell that the chain does not exist.
    """
    if found.route is not None:
        return found.route
    if known is not None:
        return known  # known to exist, its brokers silent: never start a second chain
    if found.held or exists:
        raise QuorumUnavailable(
            f"criterion {criterion.hex()[:16]} exists, but none of its brokers could be "
            "found or reached")
    members = found.nearby[:replication]
    if overlay and len(members) < replication:
        raise QuorumUnavailable(
            f"only {len(members)} node(s) are known near criterion {criterion.hex()[:16]}; "
            f"a new chain needs r = {replication} brokers (NodeConfig.replication must "
            "not exceed the number of nodes in the network)")
    why = doubt(criterion, found, replication, memory)
    if why is not None:
        raise QuorumUnavailable(why)
    return Creation(tuple(members))
