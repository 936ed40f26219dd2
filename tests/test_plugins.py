"""Plugin discovery through entry points, selection by name, hook validation."""

from __future__ import annotations

import shutil
import subprocess
import sys
import types
from pathlib import Path

import pluggy
import pytest
import trio

import ketten
from ketten import ConfigError, NodeConfig, PluginNotFound, criterion_key, hookimpl
from ketten._node.plugins import make_plugin
from ketten.adapters.memory import MemoryNetwork

EXAMPLE_DIST = Path(__file__).parent.parent / "examples" / "plugin_dist"


def test_builtins_are_registered_through_entry_points(plugins: pluggy.PluginManager) -> None:
    names = {name for name, _ in plugins.list_name_plugin()}
    assert {"memory_store", "memory_transport"} <= names
    assert "memory" in ketten.installed_names(plugins, "store")
    assert "memory" in ketten.installed_names(plugins, "transport")


async def test_unknown_plugin_name_lists_installed(plugins: pluggy.PluginManager) -> None:
    config = NodeConfig(store="sqlte", options={"transport": {"network": MemoryNetwork()}})
    with pytest.raises(PluginNotFound) as info:
        async with ketten.open_node(config, plugins=plugins):
            pass  # pragma: no cover
    assert info.value.kind == "store" and info.value.name == "sqlte"
    assert "memory" in info.value.installed
    assert "installed: " in str(info.value) and "memory" in str(info.value)


def test_misspelt_hook_is_rejected() -> None:
    plugin = types.ModuleType("misspelt")

    @hookimpl
    def ketten_make_stor(name: str, options: object, node: object) -> None:
        return None

    plugin.ketten_make_stor = ketten_make_stor  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="ketten_make_stor"):
        ketten.plugin_manager(entry_points=False, extra=(plugin,))


def test_wrong_hook_signature_is_rejected() -> None:
    plugin = types.ModuleType("wrong_args")

    @hookimpl
    def ketten_make_store(name: str, color: str) -> None:
        return None

    plugin.ketten_make_store = ketten_make_store  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="color"):
        ketten.plugin_manager(entry_points=False, extra=(plugin,))


@pytest.mark.slow
def test_separately_installed_distribution_is_discovered(tmp_path: Path) -> None:
    # Built from a copy, so that the build leaves nothing in the source tree.
    source = tmp_path / "dist"
    shutil.copytree(EXAMPLE_DIST, source,
                    ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "build",
                                                  "*.egg-info"))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        check=True,
        capture_output=True,
    )
    # A fresh interpreter with the distribution on its path, as an application would see it.
    script = """
import trio, ketten
from ketten.adapters.memory import MemoryNetwork
pm = ketten.plugin_manager()
assert "counting" in ketten.installed_names(pm, "store"), ketten.installed_names(pm, "store")
assert not ketten.broken_plugins(pm), ketten.broken_plugins(pm)

async def main():
    config = ketten.NodeConfig(store="counting", options={"transport": {"network": MemoryNetwork()},
                                                          "store": {"report_every": 1}})
    async with ketten.open_node(config, plugins=pm) as node:
        await node.append_local(ketten.criterion_key("c"), b"x")
        await node.append_local(ketten.criterion_key("c"), b"y")
        print(type(node.store).__module__, node.store.appended)
    try:
        async with ketten.open_node(ketten.NodeConfig(
                store="counting", options={"store": {"report_evry": 1}}), plugins=pm):
            pass
    except ketten.ConfigError as exc:
        print("refused:", exc)

trio.run(main)
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        check=True, capture_output=True, text=True,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["ketten_counting_store", "2"]
    assert lines[1].startswith("refused: unknown store option 'report_evry'")
    assert "did you mean 'report_every'" in lines[1]


async def test_plugin_objects_can_be_registered_directly() -> None:
    made: list[str] = []

    class Plugin:
        @hookimpl
        def ketten_plugin_names(self) -> dict[str, list[str]]:
            return {"store": ["recorded"]}

        @hookimpl
        def ketten_make_store(self, name: str, options: object, node: object) -> object:
            if name != "recorded":
                return None
            from ketten.plugins.memory_store import MemoryStore

            made.append(name)
            return MemoryStore()

    pm = ketten.plugin_manager(extra=(Plugin(),))
    assert "recorded" in ketten.installed_names(pm, "store")
    config = NodeConfig(store="recorded", options={"transport": {"network": MemoryNetwork()}})
    async with ketten.open_node(config, plugins=pm) as node:
        await node.append_local(criterion_key("k"), b"v")
    assert made == ["recorded"]
    await trio.lowlevel.checkpoint()


def test_a_broken_plugin_is_reported_and_skipped_not_fatal(
        caplog: pytest.LogCaptureFixture) -> None:
    import importlib.metadata

    from ketten._node.plugins import load_entry_points

    pm = ketten.plugin_manager()
    bad_hooks = types.ModuleType("ketten_test_bad_hooks")

    @hookimpl
    def ketten_make_stor(name: str, options: object, node: object) -> None:
        return None

    bad_hooks.ketten_make_stor = ketten_make_stor  # type: ignore[attr-defined]
    sys.modules["ketten_test_bad_hooks"] = bad_hooks
    try:
        entries = [
            importlib.metadata.EntryPoint("missing", "ketten_no_such_module_xyz", "ketten"),
            importlib.metadata.EntryPoint("misspelt", "ketten_test_bad_hooks", "ketten"),
        ]
        with caplog.at_level("WARNING", logger="ketten.plugins"):
            load_entry_points(pm, entries)
    finally:
        del sys.modules["ketten_test_bad_hooks"]
    broken = ketten.broken_plugins(pm)
    assert set(broken) == {"missing", "misspelt"}
    assert "ModuleNotFoundError" in broken["missing"] and "ketten_make_stor" in broken["misspelt"]
    assert "broken and was skipped" in caplog.text
    # The others still work, and asking for a name that is not there says what broke.
    assert "sqlite" in ketten.installed_names(pm, "store")
    with pytest.raises(PluginNotFound, match="failed to load") as info:
        make_plugin(pm, "store", "missing", {}, None)  # type: ignore[arg-type]
    assert info.value.broken == broken
