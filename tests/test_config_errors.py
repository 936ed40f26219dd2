"""Configurations that cannot work are refused when the node opens, naming the fix."""

from __future__ import annotations

import types
from typing import Any

import pluggy
import pytest

import ketten
from ketten import ConfigError, NodeConfig, Option, PluginSpec, hookimpl
from ketten.adapters.memory import MemoryNetwork
from ketten.plugins.memory_store import MemoryStore

BUILT_IN = [
    ("store", "memory"), ("store", "sqlite"), ("store", "file"),
    ("transport", "memory"), ("transport", "tcp"),
    ("overlay", "static"), ("overlay", "kademlia"),
    ("clock", "lamport"), ("clock", "vector"),
    ("delivery", "chain"), ("delivery", "causal"),
]


def _config(kind: str, name: str, options: dict[str, Any], tmp: str) -> NodeConfig:
    chosen: dict[str, Any] = {"options": {kind: options}}
    if kind == "store" and name != "memory":
        options.setdefault("path", tmp)
    if kind == "delivery":
        chosen["clock"] = "vector"
    if kind in ("store", "transport", "overlay", "clock", "delivery"):
        chosen[kind] = name
    return NodeConfig(**chosen)


@pytest.mark.parametrize(("kind", "name"), BUILT_IN)
def test_every_built_in_plugin_declares_its_options(
        plugins: pluggy.PluginManager, kind: str, name: str) -> None:
    spec = plugins.hook.ketten_plugin_spec(kind=kind, name=name)
    assert isinstance(spec, PluginSpec)
    assert all(isinstance(o, Option) and o.doc for o in spec.options.values())


@pytest.mark.parametrize(("kind", "name"), [k for k in BUILT_IN if k[0] != "delivery"])
async def test_a_misspelt_option_is_refused_by_name(
        plugins: pluggy.PluginManager, tmp_path: Any, kind: str, name: str) -> None:
    spec = plugins.hook.ketten_plugin_spec(kind=kind, name=name)
    real = sorted(spec.options)[0] if spec.options else "anything"
    typo = real[:-1] + "_x" if spec.options else "anything"
    config = _config(kind, name, {typo: 1}, str(tmp_path / "s"))
    with pytest.raises(ConfigError) as info:
        async with ketten.open_node(config, plugins=plugins):
            pass  # pragma: no cover
    text = str(info.value)
    assert f"unknown {kind} option {typo!r}" in text and repr(name) in text
    if spec.options:
        assert f"did you mean {real!r}" in text and "it takes: " in text


async def test_a_value_of_the_wrong_type_is_refused_naming_the_option(
        plugins: pluggy.PluginManager) -> None:
    config = NodeConfig(overlay="kademlia", options={"overlay": {"k": True}})
    with pytest.raises(ConfigError, match="overlay option 'k' of the overlay plugin 'kademlia'"
                       r" \(bucket size\) must be of type int, got bool True"):
        async with ketten.open_node(config, plugins=plugins):
            pass  # pragma: no cover


async def test_a_delivery_option_is_checked_at_subscribe(plugins: pluggy.PluginManager) -> None:
    async with ketten.open_node(NodeConfig(replication=1), plugins=plugins) as node:
        with pytest.raises(ConfigError, match=r"unknown delivery option 'max_hold'.*did you mean "
                           r"'max_held'"):
            async with node.subscribe("x", options={"max_hold": 5}):
                pass  # pragma: no cover


def test_an_unknown_options_kind_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown kind 'trasport' \\(did you mean 'transport'"):
        NodeConfig(options={"trasport": {"listen": "127.0.0.1:0"}})


async def test_causal_delivery_without_a_vector_clock_is_refused(
        plugins: pluggy.PluginManager) -> None:
    with pytest.raises(ConfigError, match=r"needs clock='vector'.*set NodeConfig\(clock='vector'\)"):
        async with ketten.open_node(NodeConfig(delivery="causal"), plugins=plugins):
            pass  # pragma: no cover
    async with ketten.open_node(NodeConfig(replication=1, clock="lamport"),
                                plugins=plugins) as node:
        with pytest.raises(ConfigError, match="this node has clock='lamport'"):
            async with node.subscribe("x", delivery="causal"):
                pass  # pragma: no cover
    async with ketten.open_node(NodeConfig(replication=1, clock="vector", delivery="causal"),
                                plugins=plugins) as node, node.subscribe("x") as sub:
        assert sub is not None


async def test_replication_above_the_admitted_members_is_refused(
        plugins: pluggy.PluginManager) -> None:
    members = [ketten.Identity.generate() for _ in range(2)]
    admit = [m.public_key.hex() for m in members]
    config = NodeConfig(overlay="static", identity=members[0], replication=3,
                        options={"overlay": {"admit": admit}})
    with pytest.raises(ConfigError, match="replication=3 cannot be met: the static overlay "
                       r"admits 2 members.*at most 2"):
        async with ketten.open_node(config, plugins=plugins):
            pass  # pragma: no cover
    fits = NodeConfig(overlay="static", identity=members[0], replication=2,
                      options={"overlay": {"admit": admit}})
    async with ketten.open_node(fits, plugins=plugins) as node:
        assert node.address


def _third_party(spec: PluginSpec | None) -> types.ModuleType:
    plugin = types.ModuleType("ketten_test_third_party")

    @hookimpl
    def ketten_plugin_names() -> dict[str, list[str]]:
        return {"store": ["third"]}

    @hookimpl
    def ketten_make_store(name: str, options: Any, node: Any) -> MemoryStore | None:
        return MemoryStore() if name == "third" else None

    plugin.ketten_plugin_names = ketten_plugin_names  # type: ignore[attr-defined]
    plugin.ketten_make_store = ketten_make_store  # type: ignore[attr-defined]
    if spec is not None:
        @hookimpl
        def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
            return spec if (kind, name) == ("store", "third") else None

        plugin.ketten_plugin_spec = ketten_plugin_spec  # type: ignore[attr-defined]
    return plugin


async def test_third_party_options_are_checked_against_their_spec() -> None:
    pm = ketten.plugin_manager(extra=(_third_party(PluginSpec({"size": Option("bytes", int)})),))
    net = MemoryNetwork()
    ok = NodeConfig(store="third", options={"store": {"size": 5}, "transport": {"network": net}})
    async with ketten.open_node(ok, plugins=pm):
        pass
    bad = NodeConfig(store="third", options={"store": {"sise": 5}})
    with pytest.raises(ConfigError, match="unknown store option 'sise' for the store plugin "
                       "'third' \\(did you mean 'size'\\?\\); it takes: size"):
        async with ketten.open_node(bad, plugins=pm):
            pass  # pragma: no cover


async def test_a_plugin_without_a_spec_is_named_in_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    pm = ketten.plugin_manager(extra=(_third_party(None),))
    with caplog.at_level("WARNING", logger="ketten.plugins"):
        async with ketten.open_node(NodeConfig(store="third", options={"store": {"x": 1}}),
                                    plugins=pm):
            pass
        async with ketten.open_node(NodeConfig(store="third"), plugins=pm):
            pass
    warnings = [r for r in caplog.records if "declares no options" in r.getMessage()]
    assert len(warnings) == 1 and "'third'" in warnings[0].getMessage()


async def test_a_spec_of_the_wrong_type_is_refused() -> None:
    pm = ketten.plugin_manager(extra=(_third_party({"size": int}),))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"declares its options with a dict, not a "
                       r"ketten\.PluginSpec"):
        async with ketten.open_node(NodeConfig(store="third"), plugins=pm):
            pass  # pragma: no cover
