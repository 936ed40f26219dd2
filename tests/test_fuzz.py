"""The fuzz targets of ``tests/fuzz``: the checked-in corpus replays cleanly in the
default run; CI fuzzes every target coverage-guided for a bounded time."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))

import targets

FUZZ = Path(__file__).parent / "fuzz"


@pytest.mark.parametrize("name", sorted(targets.TARGETS))
def test_the_corpus_replays_with_only_documented_errors(name: str) -> None:
    inputs = sorted((FUZZ / "corpus" / name).iterdir())
    assert inputs, f"no corpus for {name}"
    for path in inputs:
        targets.run(name, path.read_bytes())


def test_a_target_lets_undocumented_errors_through() -> None:
    def broken(data: bytes) -> None:
        raise IndexError("a bug")

    targets.TARGETS["broken"], targets.ALLOWED["broken"] = broken, ()
    try:
        with pytest.raises(IndexError):
            targets.run("broken", b"")
    finally:
        del targets.TARGETS["broken"], targets.ALLOWED["broken"]


@pytest.mark.slow
def test_fuzzing_finds_no_crash_in_any_target(tmp_path: Path) -> None:
    pytest.importorskip("atheris", reason="atheris is part of the dev extras on Linux")
    result = subprocess.run(
        [sys.executable, str(FUZZ / "fuzz.py"), "--each", str(tmp_path), "-max_total_time=12",
         "-timeout=10", "-rss_limit_mb=2048"],
        capture_output=True, text=True, timeout=900)
    verdicts = dict(re.findall(r"^(\w+): (ok|FAILED .*)$", result.stdout, re.MULTILINE))
    assert sorted(verdicts) == sorted(targets.TARGETS), result.stdout + result.stderr[-4000:]
    failed = {name: (tmp_path / f"{name}.log").read_text()[-4000:]
              for name, verdict in verdicts.items() if verdict != "ok"}
    assert not failed, failed
    assert result.returncode == 0, result.stderr[-4000:]
