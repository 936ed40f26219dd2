"""A Jepsen-style checker for replicated chains.

It knows nothing of how publishing works. It takes a *history* (every
invocation of a publish and how it ended, every read and what it returned,
and the timeline of injected faults) and the *final state* read from every
node's store after the faults healed, and checks:

* every acknowledged event is held, at its position, by a majority of the
  chain's final configuration;
* no two acknowledged events lie on diverging histories of one chain;
* all acknowledgements of one command name the same event, and no command id
  ``(author, command)`` is applied twice on any chain; every applied command
  was invoked with exactly that payload; a publish without a command id (its
  payload unique to the call) is applied at most once;
* every read contains every event acknowledged before the read began;
* the voters of each chain's final configuration hold byte-identical, valid
  chains, and converged within the bound after the faults healed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from .._core.chain import Chain, Verify
from .._core.event import Event
from .._core.membership import ChainConfig, ChainState, majority
from ..errors import KettenError

__all__ = [
    "CheckResult",
    "FaultRecord",
    "ForkRecord",
    "History",
    "Op",
    "Read",
    "Snapshot",
    "check",
    "final_config",
]


@attrs.frozen
class Op:
    """One entry of a history: an invocation or its completion.

    ``kind`` is ``invoke``, ``ok`` (acknowledged: ``event`` and ``seq`` say
    what), ``fail`` (the call raised an error saying nothing was stored),
    or ``info`` (the outcome is unknown: the call said so, or the publisher
    crashed while it was in flight).
    """

    process: int
    kind: str
    time: float
    criterion: bytes
    command: int
    payload: bytes
    event: bytes | None = None
    seq: int | None = None
    error: str = ""


@attrs.frozen
class Read:
    """A completed read: what ``process`` got for ``criterion`` between two times."""

    process: int
    start: float
    end: float
    criterion: bytes
    hashes: tuple[bytes, ...]


@attrs.frozen
class FaultRecord:
    """A fault injected or undone at ``time``: ``crash``, ``restart``, ``join``,
    ``cut``, ``heal``, ``loss`` (with ``nodes`` the node indices involved)."""

    time: float
    kind: str
    nodes: tuple[int, ...]


@attrs.frozen
class ForkRecord:
    """A node cut back its copy of a chain (kept for diagnosis)."""

    time: float
    node: int
    criterion: bytes
    orphaned: tuple[tuple[int, bytes], ...]
    head: tuple[int, bytes] | None


@attrs.define(eq=False)
class History:
    """What happened, in the order it happened."""

    ops: list[Op] = attrs.field(factory=list)
    reads: list[Read] = attrs.field(factory=list)
    faults: list[FaultRecord] = attrs.field(factory=list)
    forks: list[ForkRecord] = attrs.field(factory=list)

    def add(self, op: Op) -> None:
        self.ops.append(op)

    def read(self, read: Read) -> None:
        self.reads.append(read)

    def fault(self, record: FaultRecord) -> None:
        self.faults.append(record)


@attrs.frozen
class Snapshot:
    """The final state of every node.

    ``chains[node][criterion]`` are the encoded events of its main chain,
    ``states[node][criterion]`` its replication state (absent: none),
    ``orphans`` the events it gave up (for diagnosis).
    """

    chains: Mapping[int, Mapping[bytes, Sequence[bytes]]]
    states: Mapping[int, Mapping[bytes, ChainState]]
    converged_after: float | None
    """Virtual seconds from the heal until every chain converged (``None``: never)."""
    orphans: Mapping[int, Mapping[bytes, Sequence[bytes]]] = attrs.field(factory=dict)


@attrs.frozen
class CheckResult:
    """The verdict: ``ok`` when ``problems`` is empty; counts for the report."""

    problems: tuple[str, ...]
    invoked: int
    acknowledged: int
    failed: int
    indeterminate: int
    reads: int
    events: int

    @property
    def ok(self) -> bool:
        return not self.problems


def final_config(snapshot: Snapshot, criterion: bytes) -> ChainConfig | None:
    """The newest configuration of ``criterion`` any node holds."""
    best: ChainConfig | None = None
    for states in snapshot.states.values():
        state = states.get(criterion)
        config = None if state is None else state.config
        if config is not None and (best is None or config.epoch > best.epoch):
            best = config
    return best


def check(
    history: History,
    snapshot: Snapshot,
    *,
    keys: Mapping[bytes, int],
    authors: Mapping[int, bytes],
    settle: float,
) -> CheckResult:
    """Check ``history`` against the final ``snapshot``.

    ``keys`` maps each node's public key to its index, ``authors[process]``
    is the author key each publisher signs with, ``settle`` the bound on
    convergence after the heal.
    """
    problems: list[str] = []
    invocations: dict[tuple[bytes, int], bytes] = {}
    open_calls: dict[int, Op] = {}
    acked: list[tuple[Op, Op]] = []
    counts = {"invoke": 0, "ok": 0, "fail": 0, "info": 0}
    for op in history.ops:
        counts[op.kind] = counts.get(op.kind, 0) + 1
        author = authors[op.process]
        if op.kind == "invoke":
            known = invocations.setdefault((author, op.command), op.payload)
            if known != op.payload:
                problems.append(f"process {op.process} invoked command {op.command} with two "
                                "payloads (a bug of the workload)")
            open_calls[op.process] = op
            continue
        start = open_calls.pop(op.process, None)
        if start is None:
            problems.append(f"process {op.process}: {op.kind} without an invocation")
            continue
        if op.kind == "ok":
            acked.append((start, op))

    criteria = sorted({op.criterion for op in history.ops} | {r.criterion for r in history.reads})
    sent = {(authors[op.process], op.payload) for op in history.ops if op.kind == "invoke"}

    # Decode and validate every final chain; commands applied once, as invoked.
    decoded: dict[int, dict[bytes, list[Event]]] = {}
    for node in sorted(snapshot.chains):
        decoded[node] = {}
        for criterion, encoded in snapshot.chains[node].items():
            try:
                events = [Event.from_bytes(raw) for raw in encoded]
                if events:
                    Chain(criterion, verify=Verify.FULL, events=events)
            except KettenError as exc:
                problems.append(f"node {node}: chain {criterion.hex()[:12]} is invalid: {exc}")
                events = []
            decoded[node][criterion] = events
            seen: dict[tuple[bytes, int], int] = {}
            once: dict[tuple[bytes, bytes], int] = {}
            for event in events:
                if event.command is None:
                    implicit = (event.author, event.payload)
                    if implicit in sent and implicit in once:
                        problems.append(
                            f"node {node}: the publish of {event.payload!r} without a command "
                            f"id was applied twice on chain {criterion.hex()[:12]} (seq "
                            f"{once[implicit]} and {event.seq})")
                    once[implicit] = event.seq
                    continue
                key = (event.author, event.command)
                if key in seen:
                    problems.append(
                        f"node {node}: command {event.command} of author "
                        f"{event.author.hex()[:12]} applied twice on chain "
                        f"{criterion.hex()[:12]} (seq {seen[key]} and {event.seq})")
                seen[key] = event.seq
                payload = invocations.get(key)
                if payload is None:
                    problems.append(f"node {node}: seq {event.seq} of {criterion.hex()[:12]} "
                                    "holds a command nobody invoked")
                elif payload != event.payload:
                    problems.append(f"node {node}: seq {event.seq} of {criterion.hex()[:12]} "
                                    "holds a command with a payload that was never sent")

    # Convergence of each chain's final configuration.
    if snapshot.converged_after is None or snapshot.converged_after > settle:
        problems.append(f"chains did not converge within {settle} s after the heal "
                        f"(converged after {snapshot.converged_after})")
    reference: dict[bytes, list[Event]] = {}
    voters_of: dict[bytes, list[int]] = {}
    for criterion in criteria:
        config = final_config(snapshot, criterion)
        if config is None:
            continue
        if config.joint:
            problems.append(f"chain {criterion.hex()[:12]} ended in a joint configuration "
                            f"(epoch {config.epoch})")
        voters = sorted(keys[m.key] for m in config.voters if m.key in keys)
        voters_of[criterion] = voters
        chains = {v: decoded.get(v, {}).get(criterion, []) for v in voters}
        first = voters[0] if voters else None
        if first is not None:
            reference[criterion] = chains[first]
        for v in voters[1:]:
            if [e.hash for e in chains[v]] != [e.hash for e in chains[first]]:  # type: ignore[index]
                problems.append(f"voters {first} and {v} of {criterion.hex()[:12]} hold "
                                f"different chains (epoch {config.epoch})")

    # Acknowledged events: kept by a majority of the final configuration, on one history.
    answer: dict[tuple[int, int], bytes] = {}
    by_position: dict[tuple[bytes, int], bytes] = {}
    acked_at: list[tuple[float, bytes, int, bytes]] = []
    for _start, done in acked:
        call = (done.process, done.command)
        if done.event is None or done.seq is None:
            problems.append(f"process {done.process}: an acknowledgement without an event")
            continue
        acked_at.append((done.time, done.criterion, done.seq, done.event))
        previous = answer.setdefault(call, done.event)
        if previous != done.event:
            problems.append(f"command {done.command} of process {done.process} was "
                            "acknowledged as two different events")
        other = by_position.setdefault((done.criterion, done.seq), done.event)
        if other != done.event:
            problems.append(f"two different events were acknowledged at seq {done.seq} of "
                            f"{done.criterion.hex()[:12]}: diverging histories")
        voters = voters_of.get(done.criterion, [])
        holders = [v for v in voters
                   if len(decoded.get(v, {}).get(done.criterion, [])) > done.seq
                   and decoded[v][done.criterion][done.seq].hash == done.event]
        if not voters or len(holders) < majority(len(voters)):
            where = [f"node {f.node} at {f.time:.3f}" for f in history.forks
                     if f.criterion == done.criterion and any(h == done.event
                                                              for _, h in f.orphaned)]
            problems.append(
                f"acknowledged event seq {done.seq} of {done.criterion.hex()[:12]} (process "
                f"{done.process}, command {done.command}, acked at {done.time:.3f}) is held by "
                f"only {holders} of the final voters {voters} (orphaned by "
                f"{', '.join(where) or 'no cut'})")

    # Reads: every event acknowledged before a read began is in it.
    acked_at.sort(key=lambda item: item[0])
    for read in history.reads:
        for when, criterion, seq, acked_hash in acked_at:
            if when >= read.start:
                break
            if criterion != read.criterion:
                continue
            if len(read.hashes) <= seq or read.hashes[seq] != acked_hash:
                problems.append(
                    f"a read of {criterion.hex()[:12]} by process {read.process} at "
                    f"{read.start:.3f} misses seq {seq}, acknowledged at {when:.3f}")
                break

    stored = sum(len(chain) for chain in reference.values())
    return CheckResult(
        problems=tuple(problems),
        invoked=counts["invoke"],
        acknowledged=counts["ok"],
        failed=counts["fail"],
        indeterminate=counts["info"],
        reads=len(history.reads),
        events=stored,
    )
