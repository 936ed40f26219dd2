"""Node configuration."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import attrs

from .._core.event import DEFAULT_MAX_EVENT_SIZE
from .._core.identity import Identity
from ..errors import ConfigError

__all__ = ["OPTION_KINDS", "NodeConfig"]


def _positive_int(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value < 1:
        raise ConfigError(f"{attribute.name} must be a positive integer, got {value!r}")


def _identity(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, Identity):
        raise ConfigError(f"identity must be a ketten.Identity (Identity.generate(), "
                          f"Identity.load(path)) or None, got {type(value).__name__}")


def _positive_number(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise ConfigError(f"{attribute.name} must be a positive number, got {value!r}")


def _boolean(_: object, attribute: attrs.Attribute[bool], value: bool) -> None:
    if type(value) is not bool:
        raise ConfigError(f"{attribute.name} must be True or False, got {value!r}")


def _plugin_name(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{attribute.name} must be a plugin name, got {value!r}")


OPTION_KINDS = ("transport", "overlay", "store", "clock", "delivery", "replication",
                "subscriptions")


def _options(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{attribute.name} must map plugin kinds to option mappings")
    for kind, options in value.items():
        if kind not in OPTION_KINDS:
            close = difflib.get_close_matches(str(kind), OPTION_KINDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"options: unknown kind {kind!r}{hint}; the kinds are "
                              + ", ".join(OPTION_KINDS))
        if not isinstance(options, Mapping):
            raise ConfigError(f"options[{kind!r}] must be a mapping of option names to "
                              f"values, got {type(options).__name__}")


@attrs.frozen
class NodeConfig:
    """Everything a node is built from. Plugins are chosen by name.

    ``options`` maps a plugin kind (``"transport"``, ``"store"``, ...) to the
    options handed to that plugin's factory, e.g.
    ``{"transport": {"network": net}, "store": {"path": "data/"}}``.
    Invalid values raise :class:`~ketten.errors.ConfigError`.
    """

    transport: str = attrs.field(default="memory", validator=_plugin_name)
    store: str = attrs.field(default="memory", validator=_plugin_name)
    overlay: str | None = attrs.field(default=None, validator=_plugin_name)
    clock: str | None = attrs.field(default=None, validator=_plugin_name)
    delivery: str = attrs.field(default="chain", validator=_plugin_name)
    identity: Identity | None = attrs.field(default=None, validator=_identity)
    replication: int = attrs.field(default=3, validator=_positive_int)
    """``r``: how many brokers hold each chain (network-wide)."""
    max_event_size: int = attrs.field(default=DEFAULT_MAX_EVENT_SIZE, validator=_positive_int)
    sync_batch_bytes: int = attrs.field(default=1 << 20, validator=_positive_int)
    """Upper bound on the events returned by one sync request, in bytes."""
    request_timeout: float = attrs.field(default=5.0, validator=_positive_number)
    """Seconds to wait for one peer's reply before giving up on it."""
    client: bool = attrs.field(default=False, validator=_boolean)
    """A client node publishes, reads and subscribes through the network but
    never becomes one of its members: peers do not put it in their routing
    tables or remember it, so it is never chosen as a broker, and leaving for
    good costs the network nothing. For short-lived processes, such as the
    ``ketten`` command's. Needs an overlay that supports it (``kademlia``)."""
    options: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict, validator=_options)

    def options_for(self, kind: str) -> Mapping[str, Any]:
        return self.options.get(kind, {})
