"""The examples run as a user runs them: as programs, to a clean exit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# (60, 1) is the run the README and CI make; there the partition cuts off a leader.
@pytest.mark.parametrize(("events", "seed"), [(60, 1), (30, 1), (30, 2)])
def test_the_demo_ends_with_identical_replicas(events: int, seed: int) -> None:
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "demo.py"), "--events", str(events),
         "--seed", str(seed)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every replica set holds byte-identical chains" in done.stdout
    assert "applied once: True" in done.stdout
