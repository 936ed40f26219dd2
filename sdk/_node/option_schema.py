"""The options a plugin declares, and the check every configuration passes.

A plugin answers :func:`~ketten.hookspecs.ketten_plugin_spec` with a
:class:`PluginSpec`: the option names it takes, what each means and the
Python types it accepts, and the clocks it needs. The node checks a
configuration against it before the plugin's factory runs, so a misspelt
option is refused by name instead of silently ignored; the factory then
checks ranges and meanings.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import attrs

from ..errors import ConfigError

__all__ = ["Option", "PluginSpec", "check_options", "describe_types"]


def _types(value: Any) -> tuple[type, ...]:
    return tuple(value) if isinstance(value, tuple | list) else (value,)


@attrs.frozen
class Option:
    """One option of a plugin: what it means and the types its value may have.

    ``types`` are Python types; ``object`` accepts anything. ``bool`` is not
    accepted where ``int`` is asked for (``True`` is no count), and an ``int``
    is accepted where ``float`` is (seconds may be whole).
    """

    doc: str
    types: tuple[type, ...] = attrs.field(default=(object,), converter=_types)

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` has one of the declared types."""
        if object in self.types:
            return True
        if isinstance(value, bool):
            return bool in self.types
        if float in self.types and isinstance(value, int):
            return True
        return isinstance(value, self.types)


@attrs.frozen
class PluginSpec:
    """What a plugin takes: its ``options`` by name, and the node ``clocks`` it works
    with (empty: any clock, or none)."""

    options: Mapping[str, Option] = attrs.field(factory=dict)
    clocks: tuple[str, ...] = ()


def describe_types(types: tuple[type, ...]) -> str:
    """``int or float``: the types as a user reads them."""
    return " or ".join(t.__name__ for t in types)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_options(kind: str, name: str, options: Mapping[str, Any], spec: PluginSpec) -> None:
    """Refuse options ``spec`` does not list and values of types it does not accept.

    Raises :class:`~ketten.errors.ConfigError` naming the option, the plugin,
    the closest known name and every name the plugin takes.
    """
    if not isinstance(options, Mapping):
        raise ConfigError(f"the {kind} options must be a mapping, got {type(options).__name__}")
    known = sorted(spec.options)
    for key in options:
        if key not in spec.options:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            takes = ", ".join(known) if known else "no options"
            raise ConfigError(f"unknown {kind} option {key!r} for the {kind} plugin {name!r}"
                              f"{hint}; it takes: {takes}")
        option = spec.options[key]
        value = options[key]
        if not option.accepts(value):
            raise ConfigError(f"{kind} option {key!r} of the {kind} plugin {name!r} "
                              f"({option.doc}) must be of type {describe_types(option.types)}, got "
                              f"{type(value).__name__} {_shown(value)}")
