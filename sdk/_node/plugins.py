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

if TYPE_CHECKING:
    from ..interfaces import NodeContext

__all__ = ["KINDS", "broken_plugins", "installed_names", "make_plugin", "plugin_manager"]

KINDS = ("transport", "overlay", "store", "clock", "delivery")

_log = logging.getLogger("ketten.plugins")
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


def make_plugin(
    pm: pluggy.PluginManager, kind: str, name: str, options: Mapping[str, Any], node: NodeContext
) -> Any:
    """Build the ``kind`` plugin called ``name``.

    Raises :class:`~ketten.errors.PluginNotFound` listing the installed names.
    """
    factory = getattr(pm.hook, f"ketten_make_{kind}")
    made = factory(name=name, options=options, node=node)
    if made is None:
        raise PluginNotFound(kind, name, installed_names(pm, kind), broken_plugins(pm))
    return made
