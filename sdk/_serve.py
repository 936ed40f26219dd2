"""``ketten serve``: run one node as a process until SIGTERM or SIGINT.

    ketten serve --data DIR --key FILE [--listen HOST:PORT] [--bootstrap ADDR ...]
                 [--overlay kademlia] [--store sqlite] [--replication 3] [--config FILE]

Flags override the JSON ``--config`` file, which may hold any of
``listen``, ``advertise``, ``bootstrap`` (list), ``overlay``, ``store``,
``data``, ``key``, ``replication``, ``request_timeout``, ``log_level`` and
``options`` (per plugin kind, as :class:`ketten.NodeConfig` takes them). The
key file is created (mode 0600) if it does not exist. Once serving, one
line ``ketten: serving at ADDRESS node NODE_ID`` goes to stdout; logs go to
stderr. SIGTERM or SIGINT closes the node cleanly (stores closed, commit
marks written); the exit status is then 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from ._core.identity import Identity
from ._node.config import NodeConfig
from ._node.node import open_node
from .errors import ConfigError, KettenError

__all__ = ["add_serve_parser", "build_config", "serve"]


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run a node until SIGTERM (logs to stderr)",
                       description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--config", help="JSON file with settings (flags override it)")
    p.add_argument("--listen", help="address to listen at (default 127.0.0.1:0)")
    p.add_argument("--advertise", help="address peers should dial (default: the bound one)")
    p.add_argument("--bootstrap", action="append", default=None,
                   help="address of a node to join through (repeat, or comma-separated)")
    p.add_argument("--overlay", help="overlay plugin (default kademlia)")
    p.add_argument("--store", help="store plugin (default sqlite)")
    p.add_argument("--data", help="store directory")
    p.add_argument("--key", help="private key file (created if missing)")
    p.add_argument("--replication", type=int, help="brokers per chain, r (default 3)")
    p.add_argument("--request-timeout", type=float, dest="request_timeout")
    p.add_argument("--log-level", dest="log_level", help="DEBUG, INFO (default), WARNING")
    p.set_defaults(run=serve)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    if args.config:
        try:
            loaded = json.loads(Path(args.config).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{args.config}: cannot read the configuration: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{args.config}: the configuration must be a JSON object")
        settings.update(loaded)
    for name in ("listen", "advertise", "overlay", "store", "data", "key", "replication",
                 "request_timeout", "log_level"):
        value = getattr(args, name, None)
        if value is not None:
            settings[name] = value
    if args.bootstrap:
        settings["bootstrap"] = [a for item in args.bootstrap for a in item.split(",") if a]
    return settings


def build_config(settings: Mapping[str, Any]) -> NodeConfig:
    """A node configuration from ``serve`` settings. Raises :class:`ConfigError`."""
    known = {"listen", "advertise", "bootstrap", "overlay", "store", "data", "key",
             "replication", "request_timeout", "log_level", "options"}
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
    elif overlay == "kademlia":
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


async def _run(config: NodeConfig) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_node(config) as node:
            print(f"ketten: serving at {node.address} node {node.identity.node_id.hex()}",
                  flush=True)
            async for signum in signals:
                logging.getLogger("ketten").info("stopping on %s",
                                                 signal.Signals(signum).name)
                return


def serve(args: argparse.Namespace) -> int:
    """Run a node from flags and a config file until SIGTERM or SIGINT."""
    settings = _settings(args)
    level = str(settings.get("log_level", "INFO")).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log level must be DEBUG, INFO, WARNING or ERROR, not {level!r}")
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = build_config(settings)
    try:
        trio.run(_run, config)
    except KettenError:
        raise
    except BaseExceptionGroup as group:
        leaves = [e for e in group.exceptions if isinstance(e, KettenError)]
        if leaves:
            raise leaves[0] from None
        raise
    return 0


def main(argv: Sequence[str]) -> int:  # pragma: no cover - through ketten._cli
    parser = argparse.ArgumentParser(prog="ketten")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    args = parser.parse_args(argv)
    return int(args.run(args))
