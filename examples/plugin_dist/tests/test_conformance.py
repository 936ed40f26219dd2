"""The counting store against ketten's store conformance kit, and in a node."""

from __future__ import annotations

import logging

import pluggy
import pytest

import ketten
import ketten_counting_store
from ketten.interfaces import Store
from ketten.plugins.memory_store import MemoryBacking
from ketten.testing import check_store
from ketten_counting_store import CountingStore


@pytest.fixture(scope="module")
def plugins() -> pluggy.PluginManager:
    """The installed plugins, with this one registered even when it is not installed."""
    pm = ketten.plugin_manager()
    if not pm.is_registered(ketten_counting_store):
        pm.register(ketten_counting_store)
    return pm


async def test_the_counting_store_conforms() -> None:
    # The kit reopens a location and expects its data back: one backing per location.
    backings: dict[str, MemoryBacking] = {}
    made: list[CountingStore] = []

    def factory(location: str) -> Store:
        store = CountingStore(backing=backings.setdefault(location, MemoryBacking()))
        made.append(store)
        return store

    await check_store(factory)
    assert sum(store.appended for store in made) > 0


async def test_a_node_stores_its_chains_in_it(plugins: pluggy.PluginManager) -> None:
    backing = MemoryBacking()
    # A store belongs to the node that opened it first: reopen it as that node.
    config = ketten.NodeConfig(store="counting", identity=ketten.Identity.generate(),
                               options={"store": {"backing": backing}})
    key = ketten.criterion_key("counted")
    async with ketten.open_node(config, plugins=plugins) as node:
        assert isinstance(node.store, CountingStore)
        await node.append_local(key, b"one")
        await node.append_local(key, b"two")
        assert (node.store.appended, node.store.batches) == (2, 2)
    async with ketten.open_node(config, plugins=plugins) as node:
        assert [e.payload for e in await node.store.range(key)] == [b"one", b"two"]
        assert node.store.appended == 0


async def test_it_reports_every_so_many_events(plugins: pluggy.PluginManager,
                                               caplog: pytest.LogCaptureFixture) -> None:
    config = ketten.NodeConfig(store="counting", options={"store": {"report_every": 2}})
    caplog.set_level(logging.INFO, logger="ketten_counting_store")
    async with ketten.open_node(config, plugins=plugins) as node:
        for payload in (b"a", b"b", b"c", b"d", b"e"):
            await node.append_local(ketten.criterion_key("reported"), payload)
    reports = [r.getMessage() for r in caplog.records if r.name == "ketten_counting_store"]
    assert reports == ["2 events appended", "4 events appended"]


@pytest.mark.parametrize(("options", "message"), [
    ({"report_evry": 10}, r"unknown store option 'report_evry'.*did you mean 'report_every'"),
    ({"report_every": "10"}, r"'report_every'.*must be of type int, got str"),
    ({"report_every": True}, r"'report_every'.*must be of type int, got bool"),
    ({"backing": {}}, r"'backing'.*must be of type MemoryBacking, got dict"),
    ({"report_every": -1}, r"'report_every'.*must be 0 or more, got -1"),
])
async def test_bad_options_are_refused_by_name(plugins: pluggy.PluginManager,
                                               options: dict[str, object], message: str) -> None:
    config = ketten.NodeConfig(store="counting", options={"store": options})
    with pytest.raises(ketten.ConfigError, match=message):
        async with ketten.open_node(config, plugins=plugins):
            pass  # pragma: no cover
