"""The store conformance suite against every built-in store."""

from __future__ import annotations

from pathlib import Path

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


async def test_sqlite_store_conforms(tmp_path: Path) -> None:
    await check_store(lambda location: SqliteStore(path=str(tmp_path / location)))


async def test_file_store_conforms(tmp_path: Path) -> None:
    await check_store(lambda location: FileStore(path=str(tmp_path / location)))
