"""Plugin discovery and selection by name."""

from __future__ import annotations

import importlib.metadata
import logging
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

from .. import hookspecs
from ..errors import ConfigError, PluginNotFound
from .option_schema import PluginSpec, check_options

if TYPE_CHECKING:
    from ..interfaces import NodeContext

__all__ = [
    "KINDS",
    "broken_plugins",
    "check_clock",
    "check_selected",
    "installed_names",
    "make_plugin",
    "plugin_manager",
    "plugin_spec",
]

KINDS = ("transport", "overlay", "store", "clock", "delivery")

_log = logging.getLogger("ketten.plugins")
_UNCHECKED: weakref.WeakKeyDictionary[pluggy.PluginManager, set[tuple[str, str]]] = (
    weakref.WeakKeyDictionary())
_BROKEN: weakref.WeakKeyDictionary[pluggy.PluginManager, dict[str, str]] = (
    weakref.WeakKeyDictionary())


def plugin_manager(*, entry_points: bool = True, extra: tuple[object, ...] = ()) -> pluggy.PluginManager:
    """A plugin manager with the ketten hookspecs and the installed plugins.

    Plugins come from the ``ketten`` entry-point group (built-ins included)
    and from ``extra`` (modules or objects, e.g. in tests). Unknown hooks are
    rejected by ``check_pending()``: a misspelt ``ketten_*`` hook is an error,
    not silently ignored (:class:`~ketten.errors.ConfigError`). Build one and share it between the nodes of a
    simulation: discovery scans the installed distributions.
    """
    pm = pluggy.PluginManager("ketten")
    pm.add_hookspecs(hookspecs)
    _BROKEN[pm] = {}
    if entry_points:
        load_entry_points(pm, importlib.metadata.entry_points(group="ketten"))
    try:
        for plugin in extra:
            pm.register(plugin)
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise ConfigError(f"plugin {exc.plugin!r} is invalid: {exc}") from exc
    return pm


def load_entry_points(pm: pluggy.PluginManager,
                      entries: Iterable[importlib.metadata.EntryPoint]) -> None:
    """Register the plugin of each entry point. One that cannot be imported or whose
    hooks do not match the specs is a third party's bug: it is logged, remembered
    (see :func:`broken_plugins`) and skipped, so the other plugins still work."""
    broken = _BROKEN.setdefault(pm, {})
    for entry in entries:
        if pm.get_plugin(entry.name) is not None or pm.is_blocked(entry.name):
            continue
        try:
            pm.register(entry.load(), name=entry.name)
            pm.check_pending()
        except Exception as exc:  # any failure of foreign code
            if pm.get_plugin(entry.name) is not None:
                pm.unregister(name=entry.name)
            broken[entry.name] = f"{entry.value}: {type(exc).__name__}: {exc}"
            _log.warning("plugin %r is broken and was skipped: %s", entry.name,
                         broken[entry.name])


def broken_plugins(pm: pluggy.PluginManager) -> dict[str, str]:
    """The installed plugins that failed to load, with what went wrong."""
    return dict(_BROKEN.get(pm, {}))


def installed_names(pm: pluggy.PluginManager, kind: str) -> list[str]:
    """The names the installed plugins provide for ``kind``."""
    names: set[str] = set()
    for provided in pm.hook.ketten_plugin_names():
        names.update(provided.get(kind, ()))
    return sorted(names)


def plugin_spec(pm: pluggy.PluginManager, kind: str, name: str) -> PluginSpec | None:
    """What the ``kind`` plugin called ``name`` declares it takes (``None``: nothing declared)."""
    spec = pm.hook.ketten_plugin_spec(kind=kind, name=name)
    if spec is not None and not isinstance(spec, PluginSpec):
        raise ConfigError(f"the {kind} plugin {name!r} declares its options with a "
                          f"{type(spec).__name__}, not a ketten.PluginSpec")
    return spec


def check_clock(kind: str, name: str, spec: PluginSpec, clock: str | None) -> None:
    """Refuse a plugin that needs a clock the node does not run (:class:`ConfigError`)."""
    if spec.clocks and clock not in spec.clocks:
        wanted = " or ".join(repr(c) for c in spec.clocks)
        raise ConfigError(f"the {kind} plugin {name!r} orders events by their clock stamps and "
                          f"needs clock={wanted} on every node of the network; this node has "
                          f"clock={clock!r}: set NodeConfig(clock={spec.clocks[0]!r})")


def check_selected(pm: pluggy.PluginManager, kind: str, name: str, clock: str | None) -> None:
    """Check a plugin the node will build later (the default delivery): that it is
    installed and that the node runs the clock it needs. Raises
    :class:`~ketten.errors.PluginNotFound` or :class:`~ketten.errors.ConfigError`."""
    if name not in installed_names(pm, kind):
        raise PluginNotFound(kind, name, installed_names(pm, kind), broken_plugins(pm))
    spec = plugin_spec(pm, kind, name)
    if spec is not None:
        check_clock(kind, name, spec, clock)


def make_plugin(
    pm: pluggy.PluginManager, kind: str, name: str, options: Mapping[str, Any], node: NodeContext
) -> Any:
    """Build the ``kind`` plugin called ``name``, after checking ``options`` against its spec.

    Raises :class:`~ketten.errors.PluginNotFound` listing the installed names
    and :class:`~ketten.errors.ConfigError` for options the plugin does not take.
    """
    spec = plugin_spec(pm, kind, name)
    if spec is not None:
        check_options(kind, name, options, spec)
        check_clock(kind, name, spec, node.config.clock)
    elif name in installed_names(pm, kind):
        unchecked = _UNCHECKED.setdefault(pm, set())
        if (kind, name) not in unchecked:
            unchecked.add((kind, name))
            _log.warning("the %s plugin %r declares no options (ketten_plugin_spec): "
                         "its options are not checked", kind, name)
    factory = getattr(pm.hook, f"ketten_make_{kind}")
    made = factory(name=name, options=options, node=node)
    if made is None:
        raise PluginNotFound(kind, name, installed_names(pm, kind), broken_plugins(pm))
    return made
