"""A third-party store plugin: the memory store, counting its appends."""

from ketten import hookimpl
from ketten.plugins.memory_store import MemoryStore


class CountingStore(MemoryStore):
    appended = 0

    async def append(self, events):
        await super().append(events)
        type(self).appended += len(events)


@hookimpl
def ketten_plugin_names():
    return {"store": ["counting"]}


@hookimpl
def ketten_make_store(name, options, node):
    return CountingStore() if name == "counting" else None
