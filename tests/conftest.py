"""Shared fixtures for the ketten test suite: the ones ketten ships for plugin authors."""

from __future__ import annotations

import pluggy
import pytest

pytest_plugins = ["ketten.testing.fixtures"]


@pytest.fixture(scope="session")
def plugins(ketten_plugins: pluggy.PluginManager) -> pluggy.PluginManager:
    """One plugin manager (entry-point discovery is slow) shared by every test."""
    return ketten_plugins
