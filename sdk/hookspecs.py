"""Hook specifications: what a ketten plugin can implement.

Plugins are modules (or objects) with functions marked ``@ketten.hookimpl``,
announced through the ``ketten`` entry-point group::

    [project.entry-points.ketten]
    my_store = "my_package.store_plugin"

Factory hooks are synchronous and ``firstresult``: each returns an object
(satisfying a protocol of :mod:`ketten.interfaces`) for the ``name`` it
provides, or ``None`` for names it does not know. A plugin that implements a
factory hook also implements :func:`ketten_plugin_names` so that the node can
list what is installed, and :func:`ketten_plugin_spec` so that the node can
check its options before the factory runs. Observer hooks are called synchronously by the node
and must not block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ._core.event import Event
    from ._node.option_schema import PluginSpec
    from .interfaces import (
        Clock,
        Delivery,
        NodeContext,
        Overlay,
        Peer,
        Store,
        StoreReader,
        Transport,
    )

__all__ = [
    "hookimpl",
    "hookspec",
    "ketten_chain_dropped",
    "ketten_event_appended",
    "ketten_fork_resolved",
    "ketten_make_clock",
    "ketten_make_delivery",
    "ketten_make_overlay",
    "ketten_make_store",
    "ketten_make_transport",
    "ketten_node_started",
    "ketten_node_stopping",
    "ketten_open_store_reader",
    "ketten_peer_joined",
    "ketten_plugin_names",
    "ketten_plugin_spec",
]

hookspec = pluggy.HookspecMarker("ketten")
hookimpl = pluggy.HookimplMarker("ketten")


@hookspec
def ketten_plugin_names() -> Mapping[str, Sequence[str]]:
    """Names this plugin provides, by kind: ``{"store": ["sqlite"], ...}``.

    Kinds are ``transport``, ``overlay``, ``store``, ``clock`` and ``delivery``.
    Called on every plugin whenever names are listed; results are merged.
    """
    raise AssertionError("hookspec")  # pragma: no cover


@hookspec(firstresult=True)
def ketten_plugin_spec(kind: str, name: str) -> PluginSpec | None:
    """The options the ``kind`` plugin called ``name`` takes, or ``None`` if it is not yours.

    Called before each call of that plugin's factory; the first non-``None``
    result is used. The node refuses (with :class:`~ketten.errors.ConfigError`)
    option names the spec does not list and values of types it does not
    accept, and a plugin whose ``clocks`` do not include the node's clock. A
    plugin that declares no spec gets its options unchecked and a warning in
    the log.
    """
    raise AssertionError("hookspec")  # pragma: no cover


@hookspec(firstresult=True)
def ketten_make_transport(name: str, options: Mapping[str, Any], node: NodeContext) -> Transport | None:
    """Build the transport called ``name``, or return ``None`` if it is not yours.

    Called once per node while it opens; the first non-``None`` result is used.
    ``options`` are the node configuration's options for this kind.
    """
    raise AssertionError("hookspec")  # pragma: no cover


@hookspec(firstresult=True)
def ketten_make_store(name: str, options: Mapping[str, Any], node: NodeContext) -> Store | None:
    """Build the store called ``name``, or return ``None`` if it is not yours.

    Called once per node while it opens; the node then awaits ``open()``.
    """
    raise AssertionError("hookspec")  # pragma: no cover


@hookspec(firstresult=True)
def ketten_open_store_reader(path: str) -> StoreReader | None:
    """Open the store directory ``path`` read-only if it is in your format, else return ``None``.

    Called by offline tools (the Spark connector, ``ketten verify``) for each
    directory they are given; the first non-``None`` result is used. Raise
    :class:`~ketten.errors.StoreFormatError` if the directory is yours but
    unreadable (for example a newer schema version).
    """
    raise AssertionError("hookspec")  # pragma: no cover


@hookspec(firstresult=True)
def ketten_make_overlay(name: str, options: Mapping[str, Any], node: NodeContext) -> Overlay | None:
    """Build the overlay called ``name``, or return ``None`` if it is not yours.

    Called once per node after its transport and store exist; the node runs
    ``overlay.run()`` in its nursery.
    """
    raise AssertionError("hookspec")  # pragma: no cover


@hookspec(firstresult=True)
def ketten_make_clock(name: str, options: Mapping[str, Any], node: NodeContext) -> Clock | None:
    """Build the clock called ``name``, or return ``None`` if it is not yours.

    Called once per node while it opens.
    """
    raise AssertionError("hookspec")  # pragma: no cover


@hookspec(firstresult=True)
def ketten_make_delivery(name: str, options: Mapping[str, Any], node: NodeContext) -> Delivery | None:
    """Build the delivery order called ``name``, or return ``None`` if it is not yours.

    Called once per subscription, so each subscriber has its own queue.
    """
    raise AssertionError("hookspec")  # pragma: no cover


@hookspec
def ketten_node_started(node: NodeContext) -> None:
    """The node is serving at ``node.address``. Called once per node."""


@hookspec
def ketten_node_stopping(node: NodeContext) -> None:
    """The node is about to close. Called once per node."""


@hookspec
def ketten_event_appended(node: NodeContext, event: Event) -> None:
    """``event`` was durably appended to ``node``'s store. Called once per event."""


@hookspec
def ketten_fork_resolved(
    node: NodeContext, criterion: bytes, orphaned: Sequence[Event], head: Event | None
) -> None:
    """``node`` cut back its copy of ``criterion``: ``orphaned`` lost, ``head`` is the new
    head (``None`` when the whole copy lost, as when two chains were started for one
    new criterion on two sides of a partition).

    Called once per cut, after the store has switched branches. The cut events
    were never committed, except in that documented case.
    """


@hookspec
def ketten_chain_dropped(node: NodeContext, criterion: bytes) -> None:
    """``node`` dropped its whole copy of ``criterion``: a reader's copy (a chain it
    does not replicate) given up to keep its copies within the ``replication``
    option ``copies_events``. The chain lives on at its brokers.

    Called once per drop, after the store removed the copy.
    """


@hookspec
def ketten_peer_joined(node: NodeContext, peer: Peer) -> None:
    """``node`` learned of an authenticated ``peer``. Called once per new peer."""
