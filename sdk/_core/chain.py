"""Chain rules, sans-IO: no trio, no clock reads, no I/O.

Everything here works on events already in memory. The node and the stores
call these functions; tests call them directly.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import attrs

from ..errors import BrokenLink, DecodeError, InvalidSignature, UsageError, WriterNotAllowed
from .event import DEFAULT_MAX_EVENT_SIZE, Event, decode_fields, signed_part
from .identity import verify_signature

__all__ = [
    "AncestorSearch",
    "Chain",
    "Fork",
    "Placement",
    "Verify",
    "WriterPolicy",
    "check_run",
    "check_successor",
    "choose_branch",
    "classify",
    "genesis_wins",
    "make_locator",
    "scan_encoded_chain",
]


class Verify(enum.Enum):
    """How much of an event to check."""

    NONE = "none"
    """Structure only (what decoding checks)."""
    LINKS = "links"
    """Structure, hash links, heights and criterion."""
    FULL = "full"
    """Everything in ``LINKS``, plus signatures and the writer policy."""

    @classmethod
    def parse(cls, value: str | Verify) -> Verify:
        """``Verify`` from its name. Raises :class:`~ketten.errors.UsageError`."""
        if isinstance(value, Verify):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise UsageError(
                f"verify must be one of none, links, full; got {value!r}"
            ) from None


@attrs.frozen
class WriterPolicy:
    """Who may append to a chain, as declared by its genesis."""

    writers: frozenset[bytes] | None = None
    """Allowed author keys, or ``None`` for an open chain."""

    @classmethod
    def of(cls, genesis: Event) -> WriterPolicy:
        return cls(frozenset(genesis.writers) if genesis.writers is not None else None)

    def allows(self, author: bytes) -> bool:
        return self.writers is None or author in self.writers


OPEN = WriterPolicy()


def check_successor(
    prev: Event | None,
    event: Event,
    *,
    policy: WriterPolicy | None = None,
    verify: Verify = Verify.FULL,
) -> None:
    """Check that ``event`` may follow ``prev`` (``None``: that it is a genesis).

    ``policy`` is the chain's writer policy (taken from ``event`` itself for a
    genesis). Raises :class:`~ketten.errors.BrokenLink`,
    :class:`~ketten.errors.WriterNotAllowed` or
    :class:`~ketten.errors.InvalidSignature`.
    """
    if verify is Verify.NONE:
        return
    if prev is None:
        if event.seq != 0:
            raise BrokenLink(f"seq {event.seq} offered as the first event of a chain")
        policy = WriterPolicy.of(event)
    else:
        if event.criterion != prev.criterion:
            raise BrokenLink(f"seq {event.seq} belongs to another criterion")
        if event.seq != prev.seq + 1:
            raise BrokenLink(f"seq {event.seq} cannot follow seq {prev.seq}")
        if event.prev != prev.hash:
            raise BrokenLink(f"seq {event.seq} does not link to the hash of seq {prev.seq}")
    if verify is Verify.FULL:
        if policy is not None and not policy.allows(event.author):
            raise WriterNotAllowed(
                f"seq {event.seq}: author {event.author.hex()[:16]} may not write to this chain"
            )
        event.verify()


def check_run(
    criterion: bytes,
    prev: tuple[int, bytes] | Event | None,
    events: Sequence[Event],
    *,
    policy: WriterPolicy | None,
    verify: Verify = Verify.FULL,
) -> None:
    """Check that ``events`` of ``criterion`` follow ``prev`` (a position, an event,
    or ``None``: the run starts with the genesis) and each other, and, with
    :attr:`Verify.FULL`, are signed by writers ``policy`` allows (a genesis in the
    run sets the policy for what follows it).

    Raises :class:`~ketten.errors.BrokenLink`,
    :class:`~ketten.errors.WriterNotAllowed` or
    :class:`~ketten.errors.InvalidSignature`, naming the seq.
    """
    link: bytes | None
    if prev is None:
        link, expected = None, 0
    elif isinstance(prev, Event):
        link, expected = prev.hash, prev.seq + 1
    else:
        link, expected = prev[1], prev[0] + 1
    for event in events:
        if event.criterion != criterion:
            raise BrokenLink(f"seq {event.seq} belongs to another criterion")
        if event.seq != expected or (event.seq > 0 and event.prev != link):
            raise BrokenLink(f"seq {event.seq} does not follow seq {expected - 1}")
        if event.seq == 0:
            check_successor(None, event, verify=verify)
            policy = WriterPolicy.of(event)
        elif verify is Verify.FULL:
            if policy is not None and not policy.allows(event.author):
                raise WriterNotAllowed(f"seq {event.seq}: author "
                                       f"{event.author.hex()[:16]} may not write here")
            event.verify()
        link, expected = event.hash, event.seq + 1


class Placement(enum.Enum):
    """Where an offered event stands relative to a chain."""

    APPEND = "append"  # extends the head
    PRESENT = "present"  # the same event is already in the chain
    FORK = "fork"  # another event holds its position
    GAP = "gap"  # its predecessor is missing (seq beyond head + 1)
    FOREIGN = "foreign"  # links to a hash that is not at seq - 1 of this chain


@attrs.frozen
class Fork:
    """Two different events claim the same position of a chain."""

    criterion: bytes
    seq: int
    ours: Event
    theirs: Event


def classify(chain: Chain, event: Event) -> Placement:
    """Where ``event`` would go in ``chain`` (no signature checks)."""
    head = chain.head
    if head is None:
        return Placement.APPEND if event.seq == 0 else Placement.GAP
    if event.seq > head.seq + 1:
        return Placement.GAP
    if event.seq == head.seq + 1:
        return Placement.APPEND if event.prev == head.hash else Placement.FOREIGN
    existing = chain.at(event.seq)
    if existing.hash == event.hash:
        return Placement.PRESENT
    return Placement.FORK


@attrs.define(eq=False)
class Chain:
    """An in-memory chain with the append rules, fork detection and views.

    ``Chain(criterion)`` is empty; :meth:`append` validates every event.
    """

    criterion: bytes
    verify: Verify = Verify.FULL
    _events: list[Event] = attrs.field(factory=list, alias="events")
    _seq_of: dict[bytes, int] = attrs.field(factory=dict, init=False)
    _policy: WriterPolicy | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        given, self._events = self._events, []
        for event in given:
            self.append(event)

    @property
    def head(self) -> Event | None:
        return self._events[-1] if self._events else None

    @property
    def height(self) -> int:
        """Number of events (the next seq)."""
        return len(self._events)

    @property
    def policy(self) -> WriterPolicy | None:
        return self._policy

    def __len__(self) -> int:
        return len(self._events)

    def at(self, seq: int) -> Event:
        """The event at ``seq``. Raises :class:`IndexError`."""
        if not 0 <= seq < len(self._events):
            raise IndexError(f"seq {seq} is not in a chain of height {len(self._events)}")
        return self._events[seq]

    def seq_of(self, event_hash: bytes) -> int | None:
        """The seq of the event with this hash, or ``None``."""
        return self._seq_of.get(event_hash)

    def append(self, event: Event) -> None:
        """Validate and append ``event`` after the head.

        Raises :class:`~ketten.errors.InvalidEvent` (or a subclass).
        """
        if event.criterion != self.criterion:
            raise BrokenLink(f"seq {event.seq} belongs to another criterion")
        check_successor(self.head, event, policy=self._policy, verify=self.verify)
        if event.seq == 0:
            self._policy = WriterPolicy.of(event)
        self._events.append(event)
        self._seq_of[event.hash] = event.seq

    def fork_with(self, event: Event) -> Fork | None:
        """A :class:`Fork` if another event holds ``event``'s position here."""
        if event.seq < len(self._events):
            ours = self._events[event.seq]
            if ours.hash != event.hash:
                return Fork(self.criterion, event.seq, ours, event)
        return None

    def truncate(self, height: int) -> list[Event]:
        """Cut the chain back to ``height`` events; return what was removed."""
        removed = self._events[height:]
        del self._events[height:]
        for event in removed:
            del self._seq_of[event.hash]
        return removed

    def replay(self, from_seq: int = 0) -> Iterator[Event]:
        """The events from ``from_seq`` to the head, in order."""
        return iter(self._events[max(from_seq, 0) :])

    def view(self, at: bytes) -> Chain:
        """The chain as it was when the event with hash ``at`` was its head.

        Raises :class:`KeyError` if ``at`` is not in this chain.
        """
        seq = self._seq_of.get(at)
        if seq is None:
            raise KeyError(at.hex())
        view = Chain(self.criterion, verify=Verify.NONE)
        view._events = self._events[: seq + 1]
        view._seq_of = {e.hash: e.seq for e in view._events}
        view._policy = self._policy
        return view

    def locator(self, *, low: int = 0, high: int | None = None) -> list[tuple[int, bytes]]:
        """A locator over ``[low, high]`` (default: the whole chain)."""
        top = len(self._events) - 1 if high is None else high
        return make_locator(lambda seq: self._events[seq].hash, low=low, high=top)


def make_locator(
    hash_at: Callable[[int], bytes], *, low: int, high: int, dense: int = 8
) -> list[tuple[int, bytes]]:
    """Exponentially spaced ``(seq, hash)`` pairs from ``high`` down to ``low``.

    The first ``dense`` entries step by one, then the step doubles; ``low`` is
    always the last entry. O(dense + log(high - low)) entries.
    """
    entries: list[tuple[int, bytes]] = []
    seq, step = high, 1
    while seq > low:
        entries.append((seq, hash_at(seq)))
        if len(entries) >= dense:
            step *= 2
        seq -= step
    if high >= low:
        entries.append((low, hash_at(low)))
    return entries


@attrs.define(eq=False)
class AncestorSearch:
    """Find the last common event of two chains in O(log n) round trips.

    The side that runs the search owns a chain of ``height`` events; each
    round it sends :meth:`next_locator` to the peer, the peer answers with the
    highest seq of the locator that is on its own chain (``None`` if none is),
    and :meth:`feed` narrows the range. When :attr:`done`, :attr:`result` is
    the seq of the last common event (``None``: not even the genesis matches).
    """

    _hash_at: Callable[[int], bytes] = attrs.field(alias="hash_at")
    height: int
    dense: int = 8
    _low: int = attrs.field(default=-1, init=False)
    _high: int = attrs.field(default=0, init=False)
    _sent: list[tuple[int, bytes]] = attrs.field(factory=list, init=False)
    rounds: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        # Invariant: seq ``_low`` is common (-1: nothing), seq ``_high`` is not
        # (``height``: past the head). The answer lies in [_low, _high).
        self._high = self.height

    @property
    def done(self) -> bool:
        return self._high - self._low <= 1

    @property
    def result(self) -> int | None:
        if not self.done:
            raise UsageError("the ancestor search has not finished")
        return self._low if self._low >= 0 else None

    def next_locator(self) -> list[tuple[int, bytes]]:
        """The locator to send for the next round."""
        self._sent = make_locator(
            self._hash_at, low=self._low + 1, high=self._high - 1, dense=self.dense
        )
        return list(self._sent)

    def feed(self, match: int | None) -> None:
        """Narrow the range with the peer's answer to the last locator.

        Raises :class:`~ketten.errors.DecodeError` if ``match`` was not offered.
        """
        offered = [seq for seq, _ in self._sent]
        if match is not None and match not in offered:
            raise DecodeError(f"peer matched seq {match}, which was not offered", where="locator")
        self.rounds += 1
        if match is None:
            self._high = offered[-1] if offered else self._high
            return
        above = [seq for seq in offered if seq > match]
        self._low = match
        self._high = min(above) if above else self._high


def highest_match(
    locator: Iterable[tuple[int, bytes]], seq_of: Callable[[bytes], int | None]
) -> int | None:
    """The peer's side of :class:`AncestorSearch`: the highest offered seq we share."""
    best: int | None = None
    for seq, event_hash in locator:
        if seq_of(event_hash) == seq and (best is None or seq > best):
            best = seq
    return best


def genesis_wins(ours: Event, theirs: Event) -> bool:
    """Of two chains of one criterion (it was started twice, on two sides of a
    partition), does the one with genesis ``ours`` stay?

    The older chain stays: the lower genesis time as its author stamped it,
    then the lower hash. Both values are fixed in the genesis, so every node
    decides alike; and a chain created before a partition is not undone by a
    copy a cut-off side started later.
    """
    return (ours.time, ours.hash) <= (theirs.time, theirs.hash)


def choose_branch(votes: Mapping[bytes, int], heights: Mapping[bytes, int]) -> bytes:
    """The winning branch head among competing heads.

    Most votes (brokers holding it) wins; ties go to the longer branch, then
    to the lowest head hash, so every replica decides the same way.
    """
    if not votes:
        raise UsageError("choose_branch needs at least one branch")
    return min(votes, key=lambda h: (-votes[h], -heights.get(h, 0), h))


ScannedEvent = tuple[int, bytes, list[object]]
"""What a chain scan yields: ``(seq, hash, fields)``, without building an :class:`Event`."""


def scan_encoded_chain(
    encoded: Iterable[bytes],
    *,
    verify: Verify = Verify.LINKS,
    criterion: bytes | None = None,
    prev_hash: bytes | None = None,
    first_seq: int = 0,
    policy: WriterPolicy | None = None,
    max_size: int = DEFAULT_MAX_EVENT_SIZE,
) -> Iterator[ScannedEvent]:
    """Decode and check a run of encoded events of one chain, in seq order.

    ``prev_hash`` and ``first_seq`` say where the run starts (a genesis run
    needs neither). Raises :class:`~ketten.errors.DecodeError` or
    :class:`~ketten.errors.InvalidEvent` naming the seq that failed.
    """
    expected_seq = first_seq
    link = prev_hash
    check_links = verify is not Verify.NONE
    check_sigs = verify is Verify.FULL
    for data in encoded:
        if len(data) > max_size:
            raise DecodeError(f"{len(data)} bytes exceeds the limit of {max_size}",
                              where=f"event seq {expected_seq}")
        fields, digest = decode_fields(data)
        seq: int = fields[2]
        if check_links:
            if criterion is None:
                criterion = fields[1]
            if fields[1] != criterion:
                raise BrokenLink(f"seq {seq} belongs to another criterion")
            if seq != expected_seq:
                raise BrokenLink(f"expected seq {expected_seq}, found seq {seq}")
            if seq and fields[3] != link:
                raise BrokenLink(f"seq {seq} does not link to the hash of seq {seq - 1}")
            if check_sigs:
                writers = fields[9]
                if seq == 0:
                    policy = WriterPolicy(frozenset(writers) if writers is not None else None)
                if policy is not None and not policy.allows(fields[4]):
                    raise WriterNotAllowed(f"seq {seq}: author may not write to this chain")
                if not verify_signature(fields[4], fields[10], signed_part(data)):
                    raise InvalidSignature(f"seq {seq}: signature does not verify")
        yield seq, digest, fields
        link = digest
        expected_seq = seq + 1


def validate_events(events: Sequence[Event], *, verify: Verify = Verify.FULL) -> Chain:
    """A :class:`Chain` of ``events`` (starting at the genesis), validated."""
    if not events:
        raise UsageError("validate_events needs at least the genesis")
    return Chain(events[0].criterion, verify=verify, events=list(events))
