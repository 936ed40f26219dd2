"""Shared fixtures for the ketten test suite."""

from __future__ import annotations

import pluggy
import pytest
import trio.testing

import ketten


@pytest.fixture(scope="session")
def plugins() -> pluggy.PluginManager:
    """One plugin manager (entry-point discovery is slow) shared by every test."""
    return ketten.plugin_manager()


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Virtual time: sleeping jumps the clock as soon as every task is blocked."""
    return trio.testing.MockClock(autojump_threshold=0)
