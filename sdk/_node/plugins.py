"""Plugin discovery and selection by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pluggy

from .. import hookspecs
from ..errors import ConfigError, PluginNotFound

if TYPE_CHECKING:
    from ..interfaces import NodeContext

__all__ = ["KINDS", "installed_names", "make_plugin", "plugin_manager"]

KINDS = ("transport", "overlay", "store", "clock", "delivery")


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
    try:
        if entry_points:
            pm.load_setuptools_entrypoints("ketten")
        for plugin in extra:
            pm.register(plugin)
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise ConfigError(f"plugin {exc.plugin!r} is invalid: {exc}") from exc
    return pm


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
        raise PluginNotFound(kind, name, installed_names(pm, kind))
    return made
