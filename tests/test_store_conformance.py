"""The store conformance suite against every built-in store."""

from __future__ import annotations

from pathlib import Path

import pytest

from ketten.interfaces import Store
from ketten.plugins.file_store import FileStore
from ketten.plugins.memory_store import MemoryBacking, MemoryStore
from ketten.plugins.sqlite_store import SqliteStore
from ketten.testing import check_store


async def test_memory_store_conforms() -> None:
    backings: dict[str, MemoryBacking] = {}

    def factory(location: str) -> Store:
        return MemoryStore(backing=backings.setdefault(location, MemoryBacking()))

    await check_store(factory)


@pytest.mark.parametrize("inline_limit", [0.0, 0.005, 1.0],
                         ids=["commits-in-thread", "default", "commits-inline"])
async def test_sqlite_store_conforms(tmp_path: Path, inline_limit: float) -> None:
    stores: list[SqliteStore] = []

    def factory(location: str) -> Store:
        store = SqliteStore(path=str(tmp_path / location), inline_limit=inline_limit)
        stores.append(store)
        return store

    await check_store(factory)
    inline = sum(store.inline_transactions for store in stores)
    if inline_limit == 0.0:
        assert inline == 0
    elif inline_limit == 1.0:
        assert inline > 100  # the small appends of the suite


async def test_file_store_conforms(tmp_path: Path) -> None:
    await check_store(lambda location: FileStore(path=str(tmp_path / location)))
