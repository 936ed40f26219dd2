"""The deterministic fault simulation and its Jepsen-style checker."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ketten import ChainConfig, Event, Identity, Member, criterion_key
from ketten._core.membership import ChainState
from ketten.testing import FAMILIES, SimConfig, run_simulation
from ketten.testing._jepsen import History, Op, Read, Snapshot, check
from ketten.testing.jepsen import main, parse_seeds

# -- the checker can fail ---------------------------------------------------------

AUTHOR = Identity.from_seed(b"\3" * 32)
KEY = criterion_key("checked")
NODES = [Identity.from_seed(bytes([i + 10]) * 32) for i in range(4)]
VOTERS = ChainConfig(1, [Member(n.public_key, f"n:{i}") for i, n in enumerate(NODES[:3])])
INDEX = {n.public_key: i for i, n in enumerate(NODES)}


def events(*payloads: bytes, commands: list[int] | None = None) -> list[Event]:
    out: list[Event] = []
    for i, payload in enumerate(payloads):
        out.append(Event.create(AUTHOR, criterion=KEY, seq=i,
                                prev=out[-1].hash if out else None, payload=payload, time=i,
                                command=commands[i] if commands else i + 1))
    return out


def history_of(chain: list[Event], acked: int | None = None) -> History:
    h = History()
    for i, event in enumerate(chain):
        invoke = Op(0, "invoke", float(i), KEY, event.command or 0, event.payload)
        h.add(invoke)
        if acked is None or i < acked:
            h.add(Op(0, "ok", i + 0.5, KEY, invoke.command, event.payload,
                     event=event.hash, seq=event.seq))
        else:
            h.add(Op(0, "info", i + 0.5, KEY, invoke.command, event.payload, error="Timeout"))
    return h


def verdict(h: History, chains: dict[int, list[Event]], *, converged: float | None = 1.0,
            config: ChainConfig = VOTERS) -> tuple[str, ...]:
    snapshot = Snapshot(
        chains={n: {KEY: [e.to_bytes() for e in c]} for n, c in chains.items()},
        states={n: {KEY: ChainState(configs=(config,))} for n in chains},
        converged_after=converged)
    return check(h, snapshot, keys=INDEX, authors={0: AUTHOR.public_key}, settle=10.0).problems


def test_a_correct_history_passes() -> None:
    chain = events(b"a", b"b", b"c")
    assert verdict(history_of(chain), {0: chain, 1: chain, 2: chain}) == ()


def test_a_lost_acknowledged_event_is_found() -> None:
    chain = events(b"a", b"b", b"c")
    problems = verdict(history_of(chain), {0: chain, 1: chain[:2], 2: chain[:2]})
    assert any("seq 2" in p and "held by only [0]" in p for p in problems)


def test_an_event_on_a_minority_is_enough_only_if_unacknowledged() -> None:
    chain = events(b"a", b"b", b"c")
    minority = {0: chain, 1: chain[:2], 2: chain[:2]}
    assert not any("held by only" in p for p in verdict(history_of(chain, acked=2), minority))


def test_a_command_applied_twice_is_found() -> None:
    chain = events(b"a", b"a", commands=[1, 1])
    problems = verdict(history_of(chain[:1]), {0: chain, 1: chain, 2: chain})
    assert any("applied twice" in p for p in problems)


def test_a_publish_without_a_command_id_applied_twice_is_found() -> None:
    first = Event.create(AUTHOR, criterion=KEY, seq=0, prev=None, payload=b"once", time=0)
    again = Event.create(AUTHOR, criterion=KEY, seq=1, prev=first.hash, payload=b"once", time=1)
    h = History()
    h.add(Op(0, "invoke", 0.0, KEY, 1, b"once"))
    h.add(Op(0, "ok", 0.5, KEY, 1, b"once", event=first.hash, seq=0))
    problems = verdict(h, {0: [first, again], 1: [first, again], 2: [first, again]})
    assert any("without a command id was applied twice" in p for p in problems)
    assert verdict(h, {0: [first], 1: [first], 2: [first]}) == ()


def test_a_command_nobody_invoked_is_found() -> None:
    chain = events(b"a", b"ghost")
    problems = verdict(history_of(chain[:1]), {0: chain, 1: chain, 2: chain})
    assert any("nobody invoked" in p for p in problems)


def test_diverging_acknowledgements_are_found() -> None:
    chain = events(b"a", b"b")
    other = chain[:1] + [Event.create(AUTHOR, criterion=KEY, seq=1, prev=chain[0].hash,
                                      payload=b"x", time=9, command=9)]
    h = history_of(chain)
    h.add(Op(1, "invoke", 5.0, KEY, 9, b"x"))
    h.add(Op(1, "ok", 5.5, KEY, 9, b"x", event=other[1].hash, seq=1))
    problems = check(h, Snapshot(
        chains={n: {KEY: [e.to_bytes() for e in chain]} for n in range(3)},
        states={n: {KEY: ChainState(configs=(VOTERS,))} for n in range(3)},
        converged_after=1.0), keys=INDEX,
        authors={0: AUTHOR.public_key, 1: AUTHOR.public_key}, settle=10.0).problems
    assert any("diverging histories" in p for p in problems)


def test_divergent_voters_and_no_convergence_are_found() -> None:
    chain = events(b"a", b"b")
    other = chain[:1] + [Event.create(AUTHOR, criterion=KEY, seq=1, prev=chain[0].hash,
                                      payload=b"x", time=9, command=9)]
    problems = verdict(history_of(chain[:1]), {0: chain, 1: chain, 2: other})
    assert any("hold different chains" in p for p in problems)
    assert any("did not converge" in p
               for p in verdict(history_of(chain), {0: chain, 1: chain, 2: chain},
                                converged=None))


def test_the_final_configuration_decides_who_must_hold_an_event() -> None:
    chain = events(b"a", b"b")
    moved = ChainConfig(3, [Member(n.public_key, f"n:{i}") for i, n in
                            enumerate(NODES[1:], start=1)])
    # The old voter 0 lost the events; the new voters 1, 2 and 3 hold them.
    holders = {0: [], 1: chain, 2: chain, 3: chain}
    assert verdict(history_of(chain), holders, config=moved) == ()
    joint = ChainConfig(2, moved.voters, VOTERS.voters)
    assert any("joint" in p for p in verdict(history_of(chain), holders, config=joint))


def test_a_read_that_misses_an_acknowledged_event_is_found() -> None:
    chain = events(b"a", b"b", b"c")
    h = history_of(chain)
    h.read(Read(7, 2.6, 3.0, KEY, tuple(e.hash for e in chain)))  # began after seq 2's ack
    assert verdict(h, {0: chain, 1: chain, 2: chain}) == ()
    h.read(Read(7, 2.7, 3.0, KEY, tuple(e.hash for e in chain[:2])))
    problems = verdict(h, {0: chain, 1: chain, 2: chain})
    assert any("misses seq 2" in p for p in problems)


# -- the simulation -----------------------------------------------------------------


def small(seed: int, family: str = "joins", overlay: str = "static") -> SimConfig:
    return SimConfig(seed=seed, family=family, overlay=overlay, publishes=80)


def test_a_seed_replays_exactly(plugins) -> None:
    first = run_simulation(small(11), plugins=plugins)
    second = run_simulation(small(11), plugins=plugins)
    assert first.ok, first.check.problems
    assert first.history.ops == second.history.ops
    assert first.history.reads == second.history.reads
    assert first.history.faults == second.history.faults
    assert first.snapshot == second.snapshot
    other = run_simulation(small(12), plugins=plugins)
    assert other.history.ops != first.history.ops


def digest(seed: int) -> str:
    result = run_simulation(small(seed))
    return hashlib.sha256(repr((result.history.ops, result.history.faults,
                                result.snapshot)).encode()).hexdigest()


def test_a_seed_replays_exactly_in_another_process() -> None:
    # Other processes have other hash seeds and other object addresses.
    code = "import sys; sys.path.insert(0, sys.argv[1]); import test_sim; print(test_sim.digest(4))"
    outputs = {
        subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)],
                       capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": hashseed}).stdout.strip()
        for hashseed in ("1", "12345")
    }
    assert outputs == {digest(4)}


def test_the_command_line_runs_seeds(capsys) -> None:
    assert parse_seeds("0-2,7, 9-9") == [0, 1, 2, 7, 9]
    assert main(["--seeds", "5", "--family", "joins", "--overlay", "static",
                 "--publishes", "60"]) == 0
    out = capsys.readouterr().out
    assert "joins" in out and "seed 5: ok" in out and "all 1 runs passed" in out


@pytest.mark.sim
@pytest.mark.parametrize("seed", [94])
@pytest.mark.parametrize("overlay", ["static", "kademlia"])
@pytest.mark.parametrize("family", FAMILIES)
def test_fault_simulation_without_command_ids(seed: int, family: str, overlay: str,
                                              plugins) -> None:
    """Half the publishers give no command ids; a call must still be applied at most once."""
    result = run_simulation(SimConfig(seed=seed, family=family, overlay=overlay,
                                      implicit_commands=True), plugins=plugins)
    assert result.check.acknowledged > 0
    assert result.ok, (
        f"{family}/{overlay} seed {seed} failed; replay: python -m ketten.testing.jepsen "
        f"--seeds {seed} --family {family} --overlay {overlay} --implicit-commands --verbose\n"
        + "\n".join(result.check.problems[:20]))


@pytest.mark.sim
@pytest.mark.parametrize(("overlay", "seed"), [
    # 20 seeds of every family: 0-9 on static, 10-19 on kademlia.
    *(("static", seed) for seed in range(10)),
    *(("kademlia", seed) for seed in range(10, 20)),
    *((overlay, seed) for overlay in ("gosskip", "ipfs") for seed in range(3)),
])
@pytest.mark.parametrize("family", FAMILIES)
def test_fault_simulation(seed: int, family: str, overlay: str, plugins) -> None:
    result = run_simulation(SimConfig(seed=seed, family=family, overlay=overlay),
                            plugins=plugins)
    c = result.check
    assert result.history.faults, "the run injected no faults"
    assert c.acknowledged > 0 and c.reads > 0
    assert result.ok, (
        f"{family}/{overlay} seed {seed} failed; replay: python -m ketten.testing.jepsen "
        f"--seeds {seed} --family {family} --overlay {overlay} --verbose\n"
        + "\n".join(c.problems[:20]))


@pytest.mark.sim
@pytest.mark.parametrize(("family", "overlay", "seed"), [
    ("partitions", "gosskip", 552), ("churn", "ipfs", 553), ("partitions", "ipfs", 554)])
def test_a_retired_broker_never_votes_for_a_replaced_configuration(
        family: str, overlay: str, seed: int, plugins) -> None:
    """Seeds that lost acknowledged events while a retired broker, which had given up
    its replication state, still voted: a stale leader of a replaced configuration
    won its vote and cut the committed chain back."""
    result = run_simulation(SimConfig(seed=seed, family=family, overlay=overlay),
                            plugins=plugins)
    assert result.retirements > 0
    assert result.ok, "\n".join(result.check.problems[:20])


@pytest.mark.sim
def test_the_run_waits_for_a_move_that_starts_while_convergence_is_checked(plugins) -> None:
    """A seed whose last move (learners, then the joint configuration) began while the
    harness was checking convergence: the check saw the old configuration, the
    snapshot the joint one. The last look at the replicas now awaits nothing, and a
    leader with learners is not settled."""
    result = run_simulation(SimConfig(seed=592, family="partitions", overlay="ipfs"),
                            plugins=plugins)
    assert result.ok, "\n".join(result.check.problems[:20])
