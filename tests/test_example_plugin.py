"""The example plugin distribution (examples/plugin_dist) passes its own tests,
the store conformance kit among them, as its author would run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DIST = Path(__file__).parent.parent / "examples" / "plugin_dist"


def test_the_example_plugin_distribution_passes_its_own_tests() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(DIST), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "tests"],
        cwd=DIST, env=env, capture_output=True, text=True, timeout=600)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    # The distribution's own configuration was used, and the kit really ran.
    assert f"rootdir: {DIST}" in report
    assert "test_conformance.py::test_the_counting_store_conforms PASSED" in report
    passed = re.search(r"(\d+) passed", report)
    assert passed is not None and int(passed.group(1)) >= 4, report
    assert "failed" not in report.splitlines()[-1]
