"""A Jepsen-style checker for replicated chains.

It knows nothing of how publishing works. It takes a *history* (every
invocation of a publish and how it ended, plus the timeline of injected
faults) and the *final chains* read from every node's store, and checks
afterwards:

* no acknowledged event is lost: each is on the final chain of every broker;
* no command id ``(author, command)`` is applied twice on any chain, and
  every applied command was invoked with exactly that payload;
* all acknowledgements of one command name the same event;
* the brokers of each criterion hold byte-identical, valid chains, and
  converged within the bound after the faults healed;
* no publish was acknowledged while a majority of its brokers was
  unreachable from the publisher for the whole time it was in flight.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from .._core.chain import Chain, Verify
from .._core.event import Event
from ..errors import KettenError

__all__ = ["CheckResult", "FaultRecord", "ForkRecord", "History", "Op", "Snapshot", "check"]


@attrs.frozen
class Op:
    """One entry of a history: an invocation or its completion.

    ``kind`` is ``invoke``, ``ok`` (acknowledged: ``event`` and ``seq`` say
    what), ``fail`` (the call raised: ``error`` names it; the command may or
    may not have been applied) or ``info`` (the publisher crashed while the
    call was in flight).
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
class FaultRecord:
    """A fault injected (``crash``, ``cut``) or undone (``restart``, ``heal``) at ``time``.

    ``nodes`` are node indices; a ``cut`` separates them from all others.
    """

    time: float
    kind: str
    nodes: tuple[int, ...]


@attrs.frozen
class ForkRecord:
    """A node gave up events in a fork resolution (kept for diagnosis)."""

    time: float
    node: int
    criterion: bytes
    orphaned: tuple[tuple[int, bytes], ...]
    head: tuple[int, bytes]


@attrs.define(eq=False)
class History:
    """What happened, in the order it happened."""

    ops: list[Op] = attrs.field(factory=list)
    faults: list[FaultRecord] = attrs.field(factory=list)
    forks: list[ForkRecord] = attrs.field(factory=list)

    def add(self, op: Op) -> None:
        self.ops.append(op)

    def fault(self, record: FaultRecord) -> None:
        self.faults.append(record)


@attrs.frozen
class Snapshot:
    """Final main chains: ``chains[node][criterion]`` is a list of encoded events."""

    chains: Mapping[int, Mapping[bytes, Sequence[bytes]]]
    converged_after: float | None
    """Virtual seconds from the heal until every replica set agreed (``None``: never)."""
    orphans: Mapping[int, Mapping[bytes, Sequence[bytes]]] = attrs.field(factory=dict)
    """Events each node gave up in fork resolutions (for diagnosis)."""


@attrs.frozen
class CheckResult:
    """The verdict: ``ok`` when ``problems`` is empty; counts for the report."""

    problems: tuple[str, ...]
    invoked: int
    acknowledged: int
    failed: int
    indeterminate: int
    events: int

    @property
    def ok(self) -> bool:
        return not self.problems


def _reachable_during(
    faults: Sequence[FaultRecord], src: int, dst: int, start: float, end: float
) -> bool:
    """Was ``dst`` up and not cut off from ``src`` at some instant of ``[start, end]``?"""
    if src == dst:
        return True
    down: set[int] = set()
    cuts: list[frozenset[int]] = []

    def connected() -> bool:
        if dst in down or src in down:
            return False
        return all((src in group) == (dst in group) for group in cuts)

    index = 0
    ordered = sorted(faults, key=lambda f: f.time)
    while index < len(ordered) and ordered[index].time <= start:
        _apply(ordered[index], down, cuts)
        index += 1
    if connected():
        return True
    while index < len(ordered) and ordered[index].time <= end:
        now = ordered[index].time
        while index < len(ordered) and ordered[index].time == now:
            _apply(ordered[index], down, cuts)
            index += 1
        if connected():
            return True
    return False


def _apply(record: FaultRecord, down: set[int], cuts: list[frozenset[int]]) -> None:
    group = frozenset(record.nodes)
    if record.kind == "crash":
        down.update(group)
    elif record.kind == "restart":
        down.difference_update(group)
    elif record.kind == "cut":
        cuts.append(group)
    elif record.kind == "heal":
        if group in cuts:
            cuts.remove(group)
        if not record.nodes:
            cuts.clear()


def check(
    history: History,
    snapshot: Snapshot,
    *,
    brokers: Mapping[bytes, Sequence[int]],
    replication: int,
    authors: Mapping[int, bytes],
    publisher_nodes: Mapping[int, int],
    settle: float,
) -> CheckResult:
    """Check ``history`` against the final ``snapshot``.

    ``brokers[criterion]`` are the node indices of its replica set,
    ``authors[process]`` the author key each publisher signs with,
    ``publisher_nodes[process]`` the node it publishes through, ``settle``
    the bound on convergence after the heal.
    """
    problems: list[str] = []
    need = replication // 2 + 1
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

    # Decode and validate every final chain.
    decoded: dict[int, dict[bytes, list[Event]]] = {}
    for node, chains in snapshot.chains.items():
        decoded[node] = {}
        for criterion, encoded in chains.items():
            try:
                events = [Event.from_bytes(raw) for raw in encoded]
                if events:
                    Chain(criterion, verify=Verify.FULL, events=events)
            except KettenError as exc:
                problems.append(f"node {node}: chain {criterion.hex()[:12]} is invalid: {exc}")
                events = []
            decoded[node][criterion] = events
            seen: dict[tuple[bytes, int], int] = {}
            for event in events:
                if event.command is None:
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

    # Convergence.
    if snapshot.converged_after is None or snapshot.converged_after > settle:
        problems.append(f"replica sets did not converge within {settle} s after the heal "
                        f"(converged after {snapshot.converged_after})")
    for criterion, members in brokers.items():
        reference = list(snapshot.chains.get(members[0], {}).get(criterion, []))
        for node in members[1:]:
            if list(snapshot.chains.get(node, {}).get(criterion, [])) != reference:
                problems.append(f"brokers {members[0]} and {node} of {criterion.hex()[:12]} "
                                "hold different chains")

    # Acknowledged events: never lost, consistent, only with a reachable majority.
    answer: dict[tuple[int, int], bytes] = {}
    for start, done in acked:
        call = (done.process, done.command)
        if done.event is None or done.seq is None:
            problems.append(f"process {done.process}: an acknowledgement without an event")
            continue
        previous = answer.setdefault(call, done.event)
        if previous != done.event:
            problems.append(f"command {done.command} of process {done.process} was "
                            "acknowledged as two different events")
        for node in brokers.get(done.criterion, ()):
            chain = decoded.get(node, {}).get(done.criterion, [])
            if len(chain) <= done.seq or chain[done.seq].hash != done.event:
                orphaned_at = [
                    f"node {f.node} at {f.time:.3f} for head seq {f.head[0]}"
                    for f in history.forks
                    if f.criterion == done.criterion and any(h == done.event
                                                             for _, h in f.orphaned)]
                problems.append(
                    f"acknowledged event seq {done.seq} of {done.criterion.hex()[:12]} "
                    f"(process {done.process}, command {done.command}, acked at "
                    f"{done.time:.3f}) is missing on broker {node} (orphaned by "
                    f"{', '.join(orphaned_at) or 'no fork resolution'})")
        src = publisher_nodes[done.process]
        reachable = [b for b in brokers.get(done.criterion, ())
                     if _reachable_during(history.faults, src, b, start.time, done.time)]
        if len(reachable) < need:
            problems.append(
                f"process {done.process} got command {done.command} acknowledged between "
                f"{start.time:.3f} and {done.time:.3f} while only brokers {reachable} were "
                "reachable")
    stored = sum(len(decoded.get(members[0], {}).get(criterion, []))
                 for criterion, members in brokers.items())
    return CheckResult(
        problems=tuple(problems),
        invoked=counts["invoke"],
        acknowledged=counts["ok"],
        failed=counts["fail"],
        indeterminate=counts["info"],
        events=stored,
    )
