"""Replication decisions, sans-IO: broker verdicts, publish tallies, fork choice.

Nothing here imports trio, reads a clock or touches the network or a store.
The drivers (:mod:`._broker`, :mod:`._publisher`, :mod:`._sync`) fetch what a
decision needs, call these functions and carry out the result.

The rules, for a replica set of ``r`` brokers and ``majority = r // 2 + 1``:

* A broker appends an offered event only if it extends its head; it answers
  *ack* (appended or already present), *stale* (another event holds the
  position), *invalid* (bad signature or writer) or *reused* (the author's
  command id names other content). A broker that lacks the predecessor first
  syncs, then decides again.
* A publish succeeds when a majority of ``r`` brokers acknowledged one event.
* A broker gives up an event at position ``s`` only for an event that a
  majority of ``r`` brokers hold at ``s``, or that a publisher reported as
  acknowledged (a *commit mark*), or, when all ``r`` brokers agree below
  ``s`` and each holds a different event at ``s``, for the lowest hash. None of
  these can remove an event a majority holds, so an acknowledged event
  survives while a majority of its replica set does.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import attrs

from ._core.chain import choose_branch
from ._core.event import Event

__all__ = [
    "Outcome",
    "PublishTally",
    "Verdict",
    "backoff_delay",
    "choose_at",
    "judge_offer",
    "majority",
    "pick_base",
]


def majority(replication: int) -> int:
    """How many of ``replication`` brokers make a majority."""
    return replication // 2 + 1


class Verdict(enum.Enum):
    """A broker's decision on an offered event."""

    APPEND = "append"
    """It extends the head: verify it, append it, acknowledge."""
    PRESENT = "present"
    """The same event (or the same command with the same content) is in the chain: acknowledge."""
    STALE = "stale"
    """Another event holds its position: answer with the head."""
    SYNC = "sync"
    """Its predecessor is unknown here: catch up from the other brokers, then decide again."""
    BEHIND = "behind"
    """Its predecessor is still unknown after catching up: abstain."""
    REUSED = "reused"
    """Its command id already names other content in this chain."""


def judge_offer(
    event: Event,
    *,
    head: Event | None,
    at_seq: Event | None,
    by_command: Event | None,
    synced: bool = False,
) -> tuple[Verdict, Event | None]:
    """Decide on ``event`` offered for publication.

    ``head`` is the local head, ``at_seq`` the local event at ``event.seq``
    (``None`` if the chain is shorter), ``by_command`` the local event with
    the same ``(author, command)`` (``None`` if there is none or the event
    has no command). ``synced`` says the broker already tried to catch up.
    Returns the verdict and the event it refers to (the event acknowledged
    in its place, or the head for a stale verdict).
    """
    if by_command is not None:
        if by_command.hash == event.hash or by_command.payload == event.payload:
            return Verdict.PRESENT, by_command
        return Verdict.REUSED, by_command
    if at_seq is not None:
        if at_seq.hash == event.hash:
            return Verdict.PRESENT, at_seq
        return Verdict.STALE, head
    if head is None:
        if event.seq == 0:
            return Verdict.APPEND, None
        return (Verdict.BEHIND if synced else Verdict.SYNC), None
    if event.seq == head.seq + 1 and event.prev == head.hash:
        return Verdict.APPEND, None
    if event.seq == head.seq + 1:
        # It builds on another event at our head's position: a fork we may be
        # on the losing side of, so catch up before we vote.
        return (Verdict.STALE if synced else Verdict.SYNC), head
    return (Verdict.BEHIND if synced else Verdict.SYNC), head


class Outcome(enum.Enum):
    """What a publisher does after a round of broker answers."""

    DONE = "done"
    """A majority acknowledged one event."""
    REUSED = "reused"
    """A broker holds the command id with other content: the caller reused it."""
    INVALID = "invalid"
    """A majority refused the event as invalid."""
    STALE = "stale"
    """The chain moved on: sync, rebuild on the new head, retry."""
    RETRY = "retry"
    """Too few answers to decide: offer the same event again."""


@attrs.define(eq=False)
class PublishTally:
    """Votes of the brokers on one built event, accumulated across retries.

    Brokers are named by opaque ids (node ids). An acknowledgement counts
    for the event the broker holds: the offered one, or the event already
    applied under the same command id.
    """

    brokers: tuple[bytes, ...]
    replication: int
    _acks: dict[bytes, dict[bytes, None]] = attrs.field(factory=dict, init=False)
    _acked_events: dict[bytes, Event | None] = attrs.field(factory=dict, init=False)
    _stale: dict[bytes, Event | None] = attrs.field(factory=dict, init=False)
    _invalid: dict[bytes, tuple[str, str]] = attrs.field(factory=dict, init=False)
    _reused: Event | None = attrs.field(default=None, init=False)
    _answered: dict[bytes, None] = attrs.field(factory=dict, init=False)
    _round_answered: dict[bytes, None] = attrs.field(factory=dict, init=False)

    @property
    def needed(self) -> int:
        return majority(self.replication)

    def start_round(self) -> list[bytes]:
        """Begin a round; return the brokers to (re)send the event to."""
        self._round_answered = {}
        acked = {b for votes in self._acks.values() for b in votes}
        return [b for b in self.brokers if b not in acked]

    def ack(self, broker: bytes, held: bytes, event: Event | None = None) -> None:
        """``broker`` acknowledged, holding the event with hash ``held``."""
        for votes in self._acks.values():
            votes.pop(broker, None)
        self._acks.setdefault(held, {})[broker] = None
        if event is not None or held not in self._acked_events:
            self._acked_events[held] = event
        self._stale.pop(broker, None)
        self._seen(broker)

    def stale(self, broker: bytes, head: Event | None) -> None:
        self._stale[broker] = head
        self._seen(broker)

    def invalid(self, broker: bytes, reason: str, message: str) -> None:
        self._invalid[broker] = (reason, message)
        self._seen(broker)

    def reused(self, broker: bytes, existing: Event) -> None:
        self._reused = existing
        self._seen(broker)

    def abstain(self, broker: bytes) -> None:
        """``broker`` answered but could not vote (it could not catch up)."""
        self._seen(broker)

    def _seen(self, broker: bytes) -> None:
        self._answered[broker] = None
        self._round_answered[broker] = None

    @property
    def answered_this_round(self) -> int:
        """Brokers that answered in the last round or hold an acknowledgement from before."""
        acked = {b for votes in self._acks.values() for b in votes}
        return len(acked | set(self._round_answered))

    @property
    def reachable(self) -> int:
        """Brokers that answered at least once."""
        return len(self._answered)

    def winner(self) -> tuple[bytes, Event | None] | None:
        """The hash (and event, if not the offered one) a majority acknowledged."""
        for held, votes in self._acks.items():
            if len(votes) >= self.needed:
                return held, self._acked_events.get(held)
        return None

    @property
    def reused_event(self) -> Event | None:
        return self._reused

    @property
    def invalid_reason(self) -> tuple[str, str] | None:
        if len(self._invalid) >= self.needed:
            return next(iter(self._invalid.values()))
        return None

    @property
    def stale_heads(self) -> list[Event | None]:
        return list(self._stale.values())

    def decided(self) -> bool:
        """True once waiting for the other brokers of this round cannot change the outcome."""
        if self.winner() is not None or self._reused is not None:
            return True
        if self.invalid_reason is not None:
            return True
        return len(self._stale) > self.replication - self.needed

    def outcome(self) -> Outcome:
        """The decision after a round ended (every broker answered or timed out)."""
        if self.winner() is not None:
            return Outcome.DONE
        if self._reused is not None:
            return Outcome.REUSED
        if self.invalid_reason is not None:
            return Outcome.INVALID
        if self._stale:
            return Outcome.STALE
        return Outcome.RETRY


def pick_base(heads: Sequence[Event | None]) -> Event | None:
    """The head to rebuild on after a stale round.

    The head reported by most brokers, then the highest, then the lowest
    hash: deterministic, and the likeliest to gather a majority.
    """
    present = [h for h in heads if h is not None]
    if not present:
        return None
    counts: dict[bytes, int] = {}
    by_hash: dict[bytes, Event] = {}
    for h in present:
        counts[h.hash] = counts.get(h.hash, 0) + 1
        by_hash[h.hash] = h
    best = min(by_hash, key=lambda k: (-counts[k], -by_hash[k].seq, k))
    return by_hash[best]


class OtherBranch(bytes):
    """The vote of a broker whose chain differs below the position voted on (its
    node id). A type of its own, so that no event hash can be taken for one."""


def choose_at(
    votes: Mapping[bytes, bytes | None],
    *,
    own: bytes | None,
    replication: int,
    heights: Mapping[bytes, int],
    committed: bytes | None = None,
    own_committed: bool = False,
) -> bytes | None:
    """The event a broker should hold at a contested position, or ``None`` to keep its own.

    ``votes`` maps each *other* broker that answered to the hash it holds at
    the position (``None``: it holds nothing there; an :class:`OtherBranch`:
    it holds an event on a branch that split off earlier).
    ``own`` is what this broker holds there (``None``: nothing, it is
    behind). ``heights`` gives the branch height of each candidate hash;
    ``committed`` is a hash known to be acknowledged by a majority;
    ``own_committed`` says our own event there is.
    """
    if own_committed and own is not None:
        return None
    if committed is not None:
        return committed if committed != own else None
    counts: dict[bytes, int] = {}
    if own is not None:
        counts[own] = 1
    for held in votes.values():
        if held is not None and not isinstance(held, OtherBranch):
            counts[held] = counts.get(held, 0) + 1
    need = majority(replication)
    for held, n in sorted(counts.items()):
        if n >= need:
            return held if held != own else None
    if own is None:
        # Behind: nothing of ours is at stake; joining a branch is a vote for it.
        if not counts:
            return None
        return choose_branch(counts, heights)
    holders = 1 + sum(1 for held in votes.values() if held is not None and
                      not isinstance(held, OtherBranch))
    if holders >= replication and counts:
        # Every broker shares the chain below this position and holds a
        # different event here, so none of them was acknowledged and none can
        # be unless one of us moves. The lowest hash wins: unlike branch
        # heights it does not change while brokers look at each other. A
        # broker on another branch below could still join ours, so then we wait.
        winner = min(counts)
        return winner if winner != own else None
    return None


def backoff_delay(attempt: int, draw: float, *, base: float = 0.01, cap: float = 1.0) -> float:
    """Full-jitter exponential backoff: ``draw`` in ``[0, 1)`` times the capped bound."""
    bound: float = min(cap, base * 2.0 ** min(attempt, 30))
    return draw * bound
