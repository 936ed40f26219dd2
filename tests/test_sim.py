"""The deterministic fault simulation and its Jepsen-style checker."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ketten import Event, Identity, criterion_key
from ketten.testing._jepsen import FaultRecord, History, Op, Snapshot, check
from ketten.testing._sim import SimConfig, run_simulation
from ketten.testing.jepsen import main, parse_seeds

# -- the checker can fail ---------------------------------------------------------

AUTHOR = Identity.from_seed(b"\3" * 32)
KEY = criterion_key("checked")


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
            h.add(Op(0, "fail", i + 0.5, KEY, invoke.command, event.payload, error="Timeout"))
    return h


def verdict(h: History, chains: dict[int, list[Event]], *, converged: float | None = 1.0
            ) -> tuple[str, ...]:
    snapshot = Snapshot(
        chains={n: {KEY: [e.to_bytes() for e in c]} for n, c in chains.items()},
        converged_after=converged)
    return check(h, snapshot, brokers={KEY: (0, 1, 2)}, replication=3,
                 authors={0: AUTHOR.public_key}, publisher_nodes={0: 3}, settle=10.0).problems


def test_a_correct_history_passes() -> None:
    chain = events(b"a", b"b", b"c")
    assert verdict(history_of(chain), {0: chain, 1: chain, 2: chain}) == ()


def test_a_lost_acknowledged_event_is_found() -> None:
    chain = events(b"a", b"b", b"c")
    problems = verdict(history_of(chain), {0: chain[:2], 1: chain[:2], 2: chain[:2]})
    assert any("seq 2" in p and "missing on broker 0" in p for p in problems)


def test_an_unacknowledged_event_may_be_missing() -> None:
    chain = events(b"a", b"b", b"c")
    assert verdict(history_of(chain, acked=2), {0: chain[:2], 1: chain[:2], 2: chain[:2]}) == ()


def test_a_command_applied_twice_is_found() -> None:
    chain = events(b"a", b"a", commands=[1, 1])
    problems = verdict(history_of(chain[:1]), {0: chain, 1: chain, 2: chain})
    assert any("applied twice" in p for p in problems)


def test_a_command_nobody_invoked_is_found() -> None:
    chain = events(b"a", b"ghost")
    problems = verdict(history_of(chain[:1]), {0: chain, 1: chain, 2: chain})
    assert any("nobody invoked" in p for p in problems)


def test_divergent_replicas_are_found() -> None:
    chain = events(b"a", b"b")
    other = chain[:1] + [Event.create(AUTHOR, criterion=KEY, seq=1, prev=chain[0].hash,
                                      payload=b"x", time=9, command=9)]
    problems = verdict(history_of(chain[:1]), {0: chain, 1: chain, 2: other})
    assert any("different chains" in p for p in problems)
    assert any("did not converge" in p
               for p in verdict(history_of(chain), {0: chain, 1: chain, 2: chain},
                                converged=None))


def test_an_ack_without_a_reachable_majority_is_found() -> None:
    chain = events(b"a")
    h = history_of(chain)
    h.fault(FaultRecord(-1.0, "cut", (0,)))
    assert verdict(h, {0: chain, 1: chain, 2: chain}) == ()
    h.fault(FaultRecord(-0.5, "crash", (1,)))
    problems = verdict(h, {0: chain, 1: chain, 2: chain})
    assert any("while only brokers [2] were reachable" in p for p in problems)
    h.fault(FaultRecord(0.2, "restart", (1,)))
    assert verdict(h, {0: chain, 1: chain, 2: chain}) == ()


# -- the simulation -----------------------------------------------------------------


def test_a_seed_replays_exactly(plugins) -> None:
    small = SimConfig(seed=11, publishes=150)
    first = run_simulation(small, plugins=plugins)
    second = run_simulation(small, plugins=plugins)
    assert first.ok, first.check.problems
    assert first.history.ops == second.history.ops
    assert first.history.faults == second.history.faults
    assert first.snapshot == second.snapshot
    other = run_simulation(SimConfig(seed=12, publishes=150), plugins=plugins)
    assert other.history.ops != first.history.ops


def digest(seed: int) -> str:
    result = run_simulation(SimConfig(seed=seed, publishes=120))
    return hashlib.sha256(repr((result.history.ops, result.history.faults,
                                result.snapshot)).encode()).hexdigest()


def test_a_seed_replays_exactly_in_another_process() -> None:
    # Another process has other hash seeds and other object addresses.
    code = "import sys; sys.path.insert(0, sys.argv[1]); import test_sim; print(test_sim.digest(4))"
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert out.stdout.strip() == digest(4)


def test_the_command_line_runs_seeds(capsys) -> None:
    assert parse_seeds("0-2,7, 9-9") == [0, 1, 2, 7, 9]
    assert main(["--seeds", "5", "--publishes", "60"]) == 0
    out = capsys.readouterr().out
    assert "seed 5: ok" in out and "all 1 seeds passed" in out


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(50))
def test_fault_simulation(seed: int, plugins) -> None:
    result = run_simulation(SimConfig(seed=seed), plugins=plugins)
    c = result.check
    assert c.invoked >= 2000
    assert result.history.faults, "the run injected no faults"
    assert c.acknowledged > c.invoked * 0.8
    assert result.ok, (f"seed {seed} failed; replay: python -m ketten.testing.jepsen "
                       f"--seeds {seed} --verbose\n" + "\n".join(c.problems[:20]))
