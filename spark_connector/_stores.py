"""Opening store directories through the ``ketten_open_store_reader`` hook."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import lru_cache

import pluggy

from ketten import installed_names, plugin_manager
from ketten.errors import UsageError
from ketten.interfaces import StoreReader

__all__ = ["check_store_path", "open_reader", "open_readers", "plugins"]


@lru_cache(maxsize=1)
def plugins() -> pluggy.PluginManager:
    """The installed ketten plugins, discovered once per process (Spark reuses workers)."""
    return plugin_manager()


def check_store_path(path: str) -> None:
    """Raise :class:`~ketten.errors.UsageError` unless ``path`` is an existing directory."""
    if not os.path.exists(path):
        raise UsageError(f"store path {path!r} does not exist")
    if not os.path.isdir(path):
        raise UsageError(f"store path {path!r} is not a directory")


def open_reader(path: str) -> StoreReader:
    """A read-only reader of the store directory ``path``.

    Raises :class:`~ketten.errors.UsageError` if the path is missing or no
    installed store plugin recognises it, and whatever the plugin raises for
    a store it cannot read (:class:`~ketten.errors.StoreFormatError`,
    :class:`~ketten.errors.StoreCorrupted`).
    """
    check_store_path(path)
    pm = plugins()
    reader: StoreReader | None = pm.hook.ketten_open_store_reader(path=path)
    if reader is None:
        stores = ", ".join(installed_names(pm, "store")) or "(none)"
        raise UsageError(
            f"{path!r} is not a store directory any installed store plugin can read "
            f"(installed stores: {stores})"
        )
    return reader


@contextmanager
def open_readers(paths: tuple[str, ...]) -> Iterator[dict[str, StoreReader]]:
    """Readers for several directories, all closed on exit."""
    with ExitStack() as stack:
        readers: dict[str, StoreReader] = {}
        for path in paths:
            reader = open_reader(path)
            stack.callback(reader.close)
            readers[path] = reader
        yield readers
