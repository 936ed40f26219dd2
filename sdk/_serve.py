"""``ketten serve``: run one node as a process until SIGTERM or SIGINT.

    ketten serve --data DIR --key FILE [--listen HOST:PORT] [--bootstrap ADDR ...]
                 [--overlay kademlia] [--store sqlite] [--replication 3] [--config FILE]

Flags override the JSON ``--config`` file, which may hold any of
``listen``, ``advertise``, ``bootstrap`` (list), ``overlay``, ``store``,
``data``, ``key``, ``replication``, ``request_timeout``, ``log_level``,
``gc_threshold`` (see :func:`ketten.tune_gc`) and ``options`` (per plugin kind, as :class:`ketten.NodeConfig` takes them). The
key file is created (mode 0600) if it does not exist. Once serving, one
line ``ketten: serving at ADDRESS node NODE_ID`` goes to stdout; logs go to
stderr. SIGTERM or SIGINT closes the node cleanly (stores closed, commit
marks written); the exit status is then 0.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import trio

from ._core.identity import Identity
from ._node.config import NodeConfig
from ._node.node import open_node
from ._process import DEFAULT_GC_THRESHOLD, tune_gc
from .errors import ConfigError, KettenError

__all__ = ["build_config", "serve", "serve_settings"]

_FLAGS = ("listen", "advertise", "overlay", "store", "data", "key", "replication",
          "request_timeout", "log_level", "gc_threshold")


def serve_settings(config: str | None, bootstrap: Sequence[str] | None,
                   flags: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of ``--config`` with the flags given on top (``None``: not given)."""
    settings: dict[str, Any] = {}
    if config:
        try:
            loaded = json.loads(Path(config).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{config}: cannot read the configuration: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{config}: the configuration must be a JSON object")
        settings.update(loaded)
    for name in _FLAGS:
        value = flags.get(name)
        if value is not None:
            settings[name] = value
    if bootstrap:
        settings["bootstrap"] = [a for item in bootstrap for a in item.split(",") if a]
    return settings


def build_config(settings: Mapping[str, Any]) -> NodeConfig:
    """A node configuration from ``serve`` settings. Raises :class:`ConfigError`."""
    known = {"listen", "advertise", "bootstrap", "overlay", "store", "data", "key",
             "replication", "request_timeout", "log_level", "gc_threshold", "options"}
    unknown = set(settings) - known
    if unknown:
        raise ConfigError(f"unknown serve settings: {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(known))})")
    overlay = settings.get("overlay", "kademlia")
    store = settings.get("store", "sqlite")
    options: dict[str, dict[str, Any]] = {
        kind: dict(values) for kind, values in dict(settings.get("options", {})).items()}
    transport = options.setdefault("transport", {})
    transport.setdefault("listen", settings.get("listen", "127.0.0.1:0"))
    if settings.get("advertise"):
        transport.setdefault("advertise", settings["advertise"])
    bootstrap = list(settings.get("bootstrap", []))
    overlay_options = options.setdefault("overlay", {})
    if overlay == "static":
        overlay_options.setdefault("seeds", bootstrap)
    elif overlay in ("kademlia", "ipfs", "gosskip"):
        overlay_options.setdefault("bootstrap", bootstrap)
    if store != "memory":
        data = settings.get("data")
        if not data:
            raise ConfigError(f"the {store} store needs a directory: --data DIR")
        options.setdefault("store", {}).setdefault("path", str(data))
    key = settings.get("key")
    if not key:
        raise ConfigError("a node needs a key file: --key FILE (created if missing)")
    path = Path(key)
    if path.exists():
        identity = Identity.load(path)
    else:
        if not path.parent.is_dir():
            raise ConfigError(f"{path.parent}: no such directory for the key file")
        identity = Identity.generate()
        identity.save(path)
    extra: dict[str, Any] = {}
    if "replication" in settings:
        extra["replication"] = settings["replication"]
    if "request_timeout" in settings:
        extra["request_timeout"] = settings["request_timeout"]
    return NodeConfig(transport="tcp", store=store, overlay=overlay, identity=identity,
                      options=options, **extra)


async def _run(config: NodeConfig, gc_threshold: int) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_node(config) as node:
            tune_gc(gc_threshold)
            print(f"ketten: serving at {node.address} node {node.identity.node_id.hex()}",
                  flush=True)
            async for signum in signals:
                logging.getLogger("ketten").info("stopping on %s",
                                                 signal.Signals(signum).name)
                return


@click.command("serve")
@click.option("--config", help="JSON file with settings (flags override it)")
@click.option("--listen", help="address to listen at (default 127.0.0.1:0)")
@click.option("--advertise", help="address peers should dial (default: the bound one)")
@click.option("--bootstrap", "-b", multiple=True,
              help="address of a node to join through (repeat, or comma-separated)")
@click.option("--overlay", help="overlay plugin (default kademlia)")
@click.option("--store", help="store plugin (default sqlite)")
@click.option("--data", help="store directory")
@click.option("--key", help="private key file (created if missing)")
@click.option("--replication", type=int, help="brokers per chain, r (default 3)")
@click.option("--request-timeout", type=float, help="seconds to wait for one peer's reply")
@click.option("--log-level", help="DEBUG, INFO (default), WARNING or ERROR")
@click.option("--gc-threshold", type=int,
              help=f"allocations between collections of the youngest generation once the "
                   f"node is open (default {DEFAULT_GC_THRESHOLD}; 0: Python's own settings)")
def serve(config: str | None, bootstrap: tuple[str, ...], **flags: Any) -> int:
    """Run a node until SIGTERM or SIGINT (logs to stderr).

    Flags override the JSON --config file, which may also hold "options" (per
    plugin kind, as ketten.NodeConfig takes them). Once serving, one line
    "ketten: serving at ADDRESS node NODE_ID" goes to stdout. SIGTERM or
    SIGINT closes the node cleanly; the exit status is then 0.
    """
    settings = serve_settings(config, bootstrap, flags)
    level = str(settings.get("log_level", "INFO")).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log level must be DEBUG, INFO, WARNING or ERROR, not {level!r}")
    node_config = build_config(settings)
    gc_threshold = settings.get("gc_threshold", DEFAULT_GC_THRESHOLD)
    if type(gc_threshold) is not int or gc_threshold < 0:
        raise ConfigError(f"gc_threshold must be an int >= 0, not {gc_threshold!r}")
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        trio.run(_run, node_config, gc_threshold)
    except KettenError:
        raise
    except BaseExceptionGroup as group:
        leaves = [e for e in group.exceptions if isinstance(e, KettenError)]
        if leaves:
            raise leaves[0] from None
        raise
    return 0
