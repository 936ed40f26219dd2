"""pytest fixtures for ketten simulations.

Enable them in a ``conftest.py`` with ``pytest_plugins = ["ketten.testing.fixtures"]``
(pytest-trio runs the async tests).
"""

from __future__ import annotations

import pluggy
import pytest
import trio.testing

from .. import plugin_manager

__all__ = ["autojump_clock", "ketten_plugins", "memory_network"]


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Virtual time: the clock jumps ahead as soon as every task is blocked."""
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture(scope="session")
def ketten_plugins() -> pluggy.PluginManager:
    """One plugin manager for the whole session (discovery scans distributions)."""
    return plugin_manager()


@pytest.fixture
def memory_network() -> object:
    """A fault-free simulated network with seed 0."""
    from ketten.adapters.memory import MemoryNetwork

    return MemoryNetwork(seed=0)
