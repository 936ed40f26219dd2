"""Shared fixtures for the ketten test suite: the ones ketten ships for plugin authors,
and a list of every trio task of a test that runs far longer than any should."""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pluggy
import pytest
import trio

import ketten

pytest_plugins = ["ketten.testing.fixtures"]

HANG_REPORT_AFTER = os.environ.get("KETTEN_TEST_HANG_REPORT")
"""Real seconds after which a running test's trio tasks are listed on stderr; by
default two thirds of the test's pytest-timeout (900 s, or its ``timeout`` mark),
which then ends it with its thread stacks. The list says where each task waits,
which a thread's stack cannot."""


def _declared_timeout(item: pytest.Item) -> float:
    """The test's own ``timeout`` mark (0: it declares none)."""
    mark = item.get_closest_marker("timeout")
    return float(mark.args[0]) if mark is not None and mark.args else 0.0


def _report_after(item: pytest.Item) -> float:
    if HANG_REPORT_AFTER is not None:
        return float(HANG_REPORT_AFTER)
    limit = _declared_timeout(item) or item.config.getoption("timeout")
    return 2 / 3 * float(limit or 900)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that declare a timeout of their own (they run far longer than the others)
    go first: on two workers, one that started last would keep a core busy long after
    the other had run out of tests. The order is otherwise kept."""
    items.sort(key=lambda item: -_declared_timeout(item))


def pytest_collection_finish(session: pytest.Session) -> None:
    """The tests run their nodes in this process: it gets the collector settings that
    ``ketten serve`` gives a node process (:func:`ketten.tune_gc`). With Python's own
    settings, full collections over a thousand nodes' objects took a quarter of the
    largest tests' time."""
    ketten.tune_gc()


@pytest.fixture(scope="session")
def plugins(ketten_plugins: pluggy.PluginManager) -> pluggy.PluginManager:
    """One plugin manager (entry-point discovery is slow) shared by every test."""
    return ketten_plugins


def task_tree(task: trio.lowlevel.Task, depth: int = 0) -> list[str]:
    """One line per task under ``task``: its name and the frames it waits in,
    innermost first."""
    frames = " <- ".join(
        f"{frame.f_code.co_qualname} ({frame.f_code.co_filename.rsplit('/', 1)[-1]}:{lineno})"
        for frame, lineno in reversed(list(task.iter_await_frames())))
    lines = [f"{'  ' * depth}{task.name}: {frames}"]
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            lines.extend(task_tree(child, depth + 1))
    return lines


REPORT_LINES = 400


def summarized(lines: list[str]) -> list[str]:
    """``lines`` as they are if they are few; else each distinct task line once, with how
    many tasks wait there, most common first (a run of 1,000 nodes has 1,000 of each)."""
    if len(lines) <= REPORT_LINES:
        return lines
    counts = Counter(line.strip() for line in lines)
    out = [f"{n:6d} x {line}" for line, n in counts.most_common(REPORT_LINES)]
    if len(counts) > REPORT_LINES:
        out.append(f"... and {len(counts) - REPORT_LINES} more distinct task lines")
    return out


def _runner_of(frame: FrameType | None) -> Any:
    """The trio run a thread is in, from its stack (``trio.run``'s local ``runner``)."""
    while frame is not None:
        if frame.f_code.co_name == "run" and "trio" in frame.f_code.co_filename:
            runner = frame.f_locals.get("runner")
            if runner is not None:
                return runner
        frame = frame.f_back
    return None


def _terminal_fd(config: pytest.Config) -> int:
    """The stderr the run started with: output capture (and an xdist worker's capture,
    which pytest-timeout's dump does not get past when it ends the worker) is bypassed."""
    capman = config.pluginmanager.getplugin("capturemanager")
    capturing = getattr(capman, "_global_capturing", None)
    saved = getattr(getattr(capturing, "err", None), "targetfd_save", None)
    return saved if isinstance(saved, int) else 2


@pytest.fixture(autouse=True)
def _hang_report(request: pytest.FixtureRequest) -> Iterator[None]:
    main = threading.get_ident()
    finished = threading.Event()
    after = _report_after(request.node)

    def report(runner: Any, done: threading.Event, out: list[str]) -> None:
        try:
            lines = task_tree(runner.init_task)
            out.append(f"(trio time {runner.clock.current_time():.2f}); its {len(lines)} "
                       "tasks:\n" + "\n".join(summarized(lines)))
        finally:
            done.set()

    def watch() -> None:
        if finished.wait(after):
            return
        runner = _runner_of(sys._current_frames().get(main))
        if runner is None:
            return  # not in a trio run: the thread stacks pytest-timeout prints say it all
        done, out = threading.Event(), []
        runner.entry_queue.run_sync_soon(report, runner, done, out)
        done.wait(30.0)
        text = out[0] if out else "(its tasks could not be listed within 30 s)"
        # The test's name closes the report too: a log cut to its tail still shows it.
        message = (f"\n=== {request.node.nodeid}: still running after {after:.0f} s {text}\n"
                   f"=== end of the task list of {request.node.nodeid}\n")
        os.write(_terminal_fd(request.config), message.encode(errors="replace"))

    threading.Thread(target=watch, name="hang-report", daemon=True).start()
    yield
    finished.set()
