"""The overlay conformance suite against the built-in overlays."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pluggy
import pytest
import trio
import trio.testing

import ketten
from ketten.interfaces import Peer
from ketten.plugins.static_overlay import StaticOverlay
from ketten.testing._check_overlay import check_overlay


def kademlia(index: int, seeds: Sequence[str]) -> tuple[str, Mapping[str, Any]]:
    return "kademlia", {"bootstrap": list(seeds[-1:])}


def static(index: int, seeds: Sequence[str]) -> tuple[str, Mapping[str, Any]]:
    return "static", {"seeds": list(seeds[:3]), "interval": 5.0, "evict_after": 15.0}


async def test_kademlia_conforms(plugins: pluggy.PluginManager,
                                 autojump_clock: trio.testing.MockClock) -> None:
    await check_overlay(kademlia, nodes=40, seed=1, plugins=plugins)


async def test_static_overlay_conforms(plugins: pluggy.PluginManager,
                                       autojump_clock: trio.testing.MockClock) -> None:
    await check_overlay(static, nodes=40, seed=2, plugins=plugins,
                        settle=20.0, liveness=30.0)


class Reversed:
    """A plugin whose overlay answers farthest first: the suite must reject it."""

    @ketten.hookimpl
    def ketten_make_overlay(self, name: str, options: Mapping[str, Any],
                            node: ketten.Node) -> Any:
        if name != "reversed":
            return None
        inner = StaticOverlay(node, list(options["seeds"]), interval=5.0)

        class Overlay:
            run = inner.run
            statistics = inner.statistics

            async def closest(self, key: bytes, count: int) -> list[Peer]:
                return list(reversed(await inner.closest(key, count)))

            def nearest(self, key: bytes, count: int) -> list[Peer]:
                return list(reversed(inner.nearest(key, count)))

        return Overlay()


async def test_the_suite_rejects_wrong_order_and_departed_nodes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plugins = ketten.plugin_manager(extra=(Reversed(),))
    with pytest.raises(AssertionError, match=r"\[self\].*nearest first"):
        await check_overlay(lambda i, seeds: ("reversed", {"seeds": list(seeds[:3])}),
                            nodes=10, settle=20.0, plugins=plugins)

    def never_evicts(index: int, seeds: Sequence[str]) -> tuple[str, Mapping[str, Any]]:
        return "static", {"seeds": list(seeds[:3]), "interval": 5.0, "evict_after": 1e6}

    with pytest.raises(AssertionError, match=r"\[leave\].*not the authenticated identity"):
        await check_overlay(never_evicts, nodes=10, settle=20.0, liveness=30.0, plugins=plugins)


class FrozenVersion:
    """A plugin whose overlay keeps one version whatever its answers: the node would
    cache stale replica sets by it, and the suite must reject it."""

    @ketten.hookimpl
    def ketten_make_overlay(self, name: str, options: Mapping[str, Any],
                            node: ketten.Node) -> Any:
        if name != "frozen-version":
            return None
        inner = StaticOverlay(node, list(options["seeds"]), interval=5.0, evict_after=15.0)

        class Overlay:
            run = inner.run
            statistics = inner.statistics
            closest = inner.closest
            nearest = inner.nearest
            version = 7

        return Overlay()


async def test_the_suite_rejects_a_version_that_misses_changes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plugins = ketten.plugin_manager(extra=(FrozenVersion(),))
    with pytest.raises(AssertionError, match=r"\[version\].*kept version 7"):
        await check_overlay(lambda i, seeds: ("frozen-version", {"seeds": list(seeds[:3])}),
                            nodes=10, settle=20.0, liveness=30.0, plugins=plugins)


def test_the_suite_needs_virtual_time() -> None:
    with pytest.raises(ketten.UsageError, match="virtual time"):
        trio.run(check_overlay, kademlia)


def ipfs(index: int, seeds: Sequence[str]) -> tuple[str, Mapping[str, Any]]:
    return "ipfs", {"bootstrap": list(seeds[-1:])}


async def test_ipfs_conforms(plugins: pluggy.PluginManager,
                             autojump_clock: trio.testing.MockClock) -> None:
    await check_overlay(ipfs, nodes=40, seed=3, plugins=plugins)
