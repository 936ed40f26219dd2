"""Copying chains from live peers into local store directories.

A short-lived client node per peer (TCP transport) pulls the requested
chains into that peer's own store directory, so several peers are read and
reconciled like several replica directories. Pulls are incremental: a
directory kept between reads (option ``peerDirectory``) only fetches what
is new.
"""

from __future__ import annotations

import os
import tempfile

import attrs
import trio

from ketten import NodeConfig, open_node
from ketten.errors import KettenError, Unavailable

from ._options import ReadOptions, peer_copy
from ._stores import plugins

__all__ = ["sync_peers", "with_peer_directory"]


def with_peer_directory(options: ReadOptions) -> ReadOptions:
    """``options`` with a directory for the peers' copies (a new temporary one if unset)."""
    if not options.peers or options.peer_directory is not None:
        return options
    return attrs.evolve(options, peer_directory=tempfile.mkdtemp(prefix="ketten-spark-peers-"))


async def _pull_from(options: ReadOptions, peer: str, directory: str) -> None:
    assert options.keys is not None
    config = NodeConfig(
        transport="tcp",
        store=options.peer_store,
        replication=options.replication,
        request_timeout=options.peer_timeout,
        options={
            "store": {"path": directory},
            "transport": {"listen": "127.0.0.1:0"},
            "overlay": {"puzzle_difficulty": options.puzzle_difficulty},
        },
    )
    async with open_node(config, plugins=plugins()) as node:
        for key in sorted(options.keys):
            try:
                await node.pull(peer, key)
            except Unavailable as exc:
                raise type(exc)(f"peer {peer}: {exc}") from None


def sync_peers(options: ReadOptions) -> None:
    """Pull the requested chains from every peer into ``options.peer_directory``.

    Raises :class:`~ketten.errors.PeerUnreachable` naming the peer that did
    not answer within ``peerTimeout``, and the errors of
    :meth:`ketten.Node.pull` (:class:`~ketten.errors.InvalidEvent` if a
    peer's chain does not extend the copy already held).
    """
    if not options.peers:
        return
    assert options.peer_directory is not None

    async def pull_all() -> None:
        async with trio.open_nursery() as nursery:
            for peer in options.peers:
                directory = peer_copy(options.peer_directory, peer)  # type: ignore[arg-type]
                os.makedirs(directory, exist_ok=True)
                nursery.start_soon(_pull_from, options, peer, directory)

    try:
        trio.run(pull_all)
    except BaseExceptionGroup as group:
        first = group.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        if isinstance(first, KettenError):
            raise first from None
        raise
