"""``ketten publish``, ``ketten read`` and ``ketten tail``: a short-lived node on TCP.

Each command opens a node of its own (TCP, Kademlia; memory store, or
SQLite in ``--data``), joins the network through ``--bootstrap``, does its
one job and leaves. Like any node, it may be named a broker of a chain while
it is up; the chain's other brokers take over when it leaves.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import click
import trio

from ._cli_output import emit_json, event_line, event_record, json_option
from ._core.event import Event
from ._core.identity import Identity
from ._node.config import NodeConfig
from ._node.node import Node, open_node
from .errors import ConfigError, KettenError, PeerUnreachable, Unavailable

__all__ = ["publish", "read", "tail"]

F = TypeVar("F", bound=Callable[..., Any])


@attrs.frozen
class ClientSettings:
    """How a command's node joins the network."""

    bootstrap: tuple[str, ...]
    key: Path | None = None
    data: Path | None = None
    listen: str = "127.0.0.1:0"
    advertise: str | None = None
    replication: int = 3
    timeout: float = 10.0

    def node_config(self) -> NodeConfig:
        """Raises :class:`ConfigError` for a key file that is missing or unreadable."""
        identity: Identity | None = None  # without a key file: the data directory keeps one
        if self.key is not None:
            if not self.key.exists():
                raise ConfigError(f"{self.key}: no such key file (ketten keygen {self.key} "
                                  "writes one)")
            identity = Identity.load(self.key)
        transport: dict[str, Any] = {"listen": self.listen}
        if self.advertise is not None:
            transport["advertise"] = self.advertise
        options: dict[str, dict[str, Any]] = {
            "transport": transport,
            "overlay": {"bootstrap": list(self.bootstrap), "join_refresh": False},
        }
        store = "memory"
        if self.data is not None:
            store = "sqlite"
            options["store"] = {"path": str(self.data)}
        return NodeConfig(transport="tcp", overlay="kademlia", store=store, identity=identity,
                          replication=self.replication, client=True, options=options)


@asynccontextmanager
async def client_node(settings: ClientSettings) -> AsyncIterator[Node]:
    """A node that has joined through the bootstrap addresses within ``settings.timeout``.

    Raises :class:`PeerUnreachable` if no bootstrap node answered, and
    :class:`Unavailable` if joining took longer.
    """
    config = settings.node_config()
    with trio.CancelScope(deadline=trio.current_time() + settings.timeout) as joining:
        async with open_node(config) as node:
            joining.deadline = math.inf
            assert node.overlay is not None
            if not node.overlay.nearest(node.identity.node_id, 1):
                raise PeerUnreachable(f"no bootstrap node answered: "
                                      f"{await _why_unreachable(node, settings.bootstrap)}")
            yield node
    if joining.cancelled_caught:
        raise Unavailable(f"could not join through {', '.join(settings.bootstrap)} within "
                          f"{settings.timeout:g} s (--timeout)")


async def _why_unreachable(node: Node, addresses: tuple[str, ...]) -> str:
    """What each bootstrap address says when asked directly (a refused handshake
    names the reason, such as a different replication factor)."""
    reasons = []
    for address in addresses[:4]:
        try:
            with trio.move_on_after(2.0):
                await node.pull(address, bytes(32))
            reasons.append(f"{address}: no answer")
        except KettenError as exc:
            reasons.append(str(exc))
    return "; ".join(reasons)


def _bootstrap_list(_ctx: click.Context, _param: click.Parameter,
                    value: tuple[str, ...]) -> tuple[str, ...]:
    addresses = tuple(a.strip() for item in value for a in item.split(",") if a.strip())
    if not addresses:
        raise click.BadParameter("give at least one address", param_hint="'--bootstrap'")
    return addresses


def _positive(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    if value <= 0:
        raise click.BadParameter("must be more than 0")
    return value


def network_options(command: F) -> F:
    """The options that say how a command's node joins the network."""
    options = [
        click.option("--bootstrap", "-b", multiple=True, required=True,
                     envvar="KETTEN_BOOTSTRAP", callback=_bootstrap_list,
                     help="HOST:PORT of a node to join through (repeat, or comma-separated; "
                          "env KETTEN_BOOTSTRAP)"),
        click.option("--key", type=click.Path(dir_okay=False, path_type=Path),
                     help="private key file (default: the one --data keeps, else a fresh "
                          "identity)"),
        click.option("--data", type=click.Path(file_okay=False, path_type=Path),
                     help="keep this node's store in DIR (SQLite; default: memory)"),
        click.option("--listen", default="127.0.0.1:0", show_default=True,
                     help="address this node listens at"),
        click.option("--advertise", help="address peers should dial (default: the bound one)"),
        click.option("--replication", "-r", type=click.IntRange(min=1), default=3,
                     show_default=True, help="brokers per chain, r (as the network uses)"),
        click.option("--timeout", type=float, default=10.0, show_default=True,
                     callback=_positive, help="seconds to join, and to publish or read"),
        click.option("--by-key", is_flag=True,
                     help="CRITERION is a chain's 64-hex-digit key (as ketten chains "
                          "lists them), not a name"),
        click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                                      case_sensitive=False),
                     help="log to stderr at this level (default: no logs)"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _settings(flags: dict[str, Any]) -> tuple[ClientSettings, bool]:
    """The client settings and ``--by-key`` from a command's flags (which it consumes)."""
    level = flags.pop("log_level")
    if level is not None:
        logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper()),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    by_key = bool(flags.pop("by_key"))
    names = {a.name for a in attrs.fields(ClientSettings)}
    return ClientSettings(**{k: flags.pop(k) for k in names}), by_key


def _criterion(text: str, by_key: bool) -> str | bytes:
    if not by_key:
        if not text:
            raise click.BadParameter("a criterion name cannot be empty",
                                     param_hint="'CRITERION'")
        return text
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise click.BadParameter(f"{text!r} is not a 64-hex-digit key", param_hint="'CRITERION'")
    return key


def _print_event(event: Event, as_json: bool) -> None:
    if as_json:
        emit_json(event_record(event))
    else:
        click.echo(event_line(event))


def _payload(payload: str | None, file: str | None) -> bytes:
    if payload is not None and file is not None:
        raise click.UsageError("give the payload as an argument or with --file, not both")
    if payload is not None:
        return payload.encode("utf-8", "surrogateescape")  # argv bytes as given
    if file is not None and file != "-":
        return Path(file).read_bytes()
    if file is None and sys.stdin.isatty():
        raise click.UsageError("no payload: give PAYLOAD, --file FILE, or pipe it to stdin")
    return sys.stdin.buffer.read()


@click.command("publish")
@click.argument("criterion")
@click.argument("payload", required=False)
@click.option("--file", "-f", "file", metavar="FILE",
              help="read the payload from FILE ('-': stdin)")
@network_options
@json_option("print the committed event as one JSON object")
def publish(criterion: str, payload: str | None, file: str | None, as_json: bool,
            **flags: Any) -> int:
    """Append PAYLOAD (or --file, or stdin) to the chain of CRITERION.

    Prints the committed event's seq and hash once a majority of the chain's
    brokers hold it.
    """
    settings, by_key = _settings(flags)
    key = _criterion(criterion, by_key)
    data = _payload(payload, file)

    async def run() -> Event:
        async with client_node(settings) as node:
            return await node.publish(key, data, deadline=settings.timeout)

    event = trio.run(run)
    if as_json:
        emit_json(event_record(event))
    else:
        click.echo(f"seq {event.seq} hash {event.hash.hex()}")
    return 0


@click.command("read")
@click.argument("criterion")
@click.option("--from", "from_seq", type=click.IntRange(min=0), default=0, show_default=True,
              help="first seq to print")
@click.option("--limit", "-n", type=click.IntRange(min=0),
              help="print at most N events")
@network_options
@json_option("one JSON object per event (payload as text, or base64 if not UTF-8)")
def read(criterion: str, from_seq: int, limit: int | None, as_json: bool,
         **flags: Any) -> int:
    """Print the committed events of CRITERION, oldest first.

    Every event acknowledged before the command started is included. Each
    line is SEQ TIME PAYLOAD (text if it is UTF-8, else hex).
    """
    settings, by_key = _settings(flags)
    key = _criterion(criterion, by_key)

    async def run() -> list[Event]:
        async with client_node(settings) as node:
            return await node.read(key, from_seq, deadline=settings.timeout)

    events = trio.run(run)
    for event in events[:limit] if limit is not None else events:
        _print_event(event, as_json)
    return 0


@click.command("tail")
@click.argument("criterion")
@click.option("--from", "from_seq", type=click.IntRange(min=0),
              help="start at this seq (default: only events committed from now on)")
@network_options
@json_option("one JSON object per event (payload as text, or base64 if not UTF-8)")
def tail(criterion: str, from_seq: int | None, as_json: bool, **flags: Any) -> int:
    """Follow CRITERION: print its events as they commit, until Ctrl-C.

    Once following, one line "ketten: following CRITERION" goes to stderr.
    Stopping with Ctrl-C or SIGTERM exits with status 0.
    """
    settings, by_key = _settings(flags)
    key = _criterion(criterion, by_key)

    async def follow() -> None:
        start: int | str = "head" if from_seq is None else from_seq
        async with client_node(settings) as node, \
                node.subscribe(key, start=start) as subscription:
            click.echo(f"ketten: following {criterion}", err=True)
            async for event in subscription:
                _print_event(event, as_json)

    async def run() -> None:
        if threading.current_thread() is not threading.main_thread():
            await follow()  # signal handlers can only be installed on the main thread
            return
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(stop_on_signal)
                await follow()
                nursery.cancel_scope.cancel()

    trio.run(run)
    return 0
