"""When the sqlite store runs a small transaction on the event loop's thread."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ketten.errors import ConfigError
from ketten.plugins.sqlite_store import ketten_make_store
from ketten.plugins.sqlite_store._inline import InlineCommits


def test_fast_commits_stay_inline_despite_an_occasional_slow_one() -> None:
    policy = InlineCommits(0.005)
    now = 0.0
    for duration in [0.001, 0.002, 0.050, 0.001, 0.001, 0.030, 0.002] * 10:
        assert policy.allowed(now)
        now += duration
        policy.observe(duration, now)


def test_a_slow_disk_sends_commits_to_the_thread_for_a_while() -> None:
    policy = InlineCommits(0.005, backoff=5.0)
    now = 0.0
    inline = 0
    while now < 60.0:
        if policy.allowed(now):
            inline += 1
            now += 0.020
            policy.observe(0.020, now)
        else:
            now += 0.010  # a commit in the worker thread
    # Eight slow inline commits (half the window) before each 5 s back-off:
    # about 12 rounds in 60 s.
    assert 80 <= inline <= 100


@given(st.lists(st.sampled_from([0.001, 0.004, 0.005, 0.006, 0.050]), max_size=200))
def test_the_policy_backs_off_exactly_when_the_median_of_the_window_is_over(
        durations: list[float]) -> None:
    """Against the rule written out: keep the last 16 durations, back off when
    at least 8 are kept and their median (the upper one) is over the limit."""
    policy = InlineCommits(0.005, backoff=5.0)
    kept: deque[float] = deque(maxlen=16)
    threaded_until = float("-inf")
    for n, duration in enumerate(durations):
        now = float(n)
        kept.append(duration)
        if len(kept) >= 8 and sorted(kept)[len(kept) // 2] > 0.005:
            threaded_until = now + 5.0
            kept.clear()
        policy.observe(duration, now)
        assert policy.allowed(now + 1e-9) == (now + 1e-9 >= threaded_until)


def test_zero_turns_inline_commits_off() -> None:
    assert not InlineCommits(0.0).allowed(0.0)


@pytest.mark.parametrize("value", ["fast", -1, 2, True])
def test_a_bad_inline_limit_is_a_config_error(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigError, match="inline_limit"):
        ketten_make_store(name="sqlite", options={"path": str(tmp_path), "inline_limit": value},
                          node=None)  # type: ignore[arg-type]


async def test_cursor_writes_run_inline_and_side_by_side_in_one_transaction(
        tmp_path: Path) -> None:
    """A node writes many chains' states at once (a commit flush): they share one
    transaction on the event loop's thread, not one thread hand-off each."""
    import trio

    from ketten.plugins.sqlite_store import SqliteStore

    store = SqliteStore(path=str(tmp_path / "s"), inline_limit=1.0)
    await store.open()
    try:
        before = store.inline_transactions
        async with trio.open_nursery() as nursery:
            for n in range(40):
                nursery.start_soon(store.put_cursor, f"state/{n}", b"%d" % n)
        assert 1 <= store.inline_transactions - before <= 2
        for n in range(40):
            assert await store.get_cursor(f"state/{n}") == b"%d" % n
    finally:
        await store.aclose()
