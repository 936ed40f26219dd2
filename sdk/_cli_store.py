"""``ketten chains`` and ``ketten verify``: store directories (and CAR files), read offline.

A directory no installed store plugin recognises is reported and makes the
exit status 1, like a chain that fails verification. ``verify`` reads a file
as a chain's CARv1 (see ``ketten export``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click

from ._cli_car import read_car_chain
from ._cli_output import ProgressBar, emit_json, json_option, print_table, progress_bar
from ._core.chain import Verify, scan_encoded_chain
from ._core.ipld import cid_text
from ._node.plugins import plugin_manager
from .errors import KettenError
from .interfaces import StoreReader

__all__ = ["chains", "verify"]

NOT_A_STORE = "not a ketten store directory (no installed store plugin reads it)"
_STEP = 4096
"""Events checked between two updates of the progress bar."""

_paths = click.argument("paths", nargs=-1, required=True,
                        type=click.Path(exists=True, file_okay=False))


def _readers(paths: Sequence[str]) -> Iterator[tuple[str, StoreReader | None]]:
    """Each path with a reader from the store plugin that recognises it (closed after use)."""
    pm = plugin_manager()
    for path in paths:
        reader = pm.hook.ketten_open_store_reader(path=path)
        if reader is None:
            yield path, None
            continue
        try:
            yield path, reader
        finally:
            reader.close()


@click.command("chains")
@_paths
@json_option("one JSON object per directory: path, chains (criterion, events, head)")
def chains(paths: tuple[str, ...], as_json: bool) -> int:
    """List the chains in store directories: criterion, length, head hash."""
    failures = 0
    for path, reader in _readers(paths):
        if reader is None:
            failures += 1
            if as_json:
                emit_json({"path": path, "error": NOT_A_STORE})
            else:
                click.echo(f"{path}: {NOT_A_STORE}")
            continue
        heads = reader.heads()
        if as_json:
            emit_json({"path": path, "chains": [
                {"criterion": c.hex(), "events": heads[c][0] + 1, "head": heads[c][1].hex()}
                for c in sorted(heads)]})
            continue
        click.echo(f"{path}: {len(heads)} chains")
        if heads:
            print_table(["criterion", "events", "head"],
                        [[c.hex(), str(heads[c][0] + 1), heads[c][1].hex()[:16]]
                         for c in sorted(heads)], right=["events"])
    return 1 if failures else 0


def _counted(encoded: Iterable[tuple[int, bytes]], bar: ProgressBar) -> Iterator[bytes]:
    pending = 0
    for _, raw in encoded:
        yield raw
        pending += 1
        if pending == _STEP:
            bar.advance(pending)
            pending = 0
    bar.advance(pending)


def _verify_store(path: str, reader: StoreReader, verify: Verify, bar: ProgressBar,
                  as_json: bool) -> int:
    """Check every chain of one store; the number that failed."""
    heads = reader.heads()
    bar.add_total(sum(seq + 1 for seq, _ in heads.values()))
    results: list[dict[str, Any]] = []
    failures = 0
    for criterion in reader.criteria():
        try:
            count = sum(1 for _ in scan_encoded_chain(
                _counted(reader.read_encoded(criterion), bar), verify=verify))
        except KettenError as exc:
            failures += 1
            results.append({"criterion": criterion.hex(), "ok": False, "error": str(exc)})
            if not as_json:
                click.echo(f"{path}: chain {criterion.hex()}: FAILED: {exc}")
        else:
            results.append({"criterion": criterion.hex(), "ok": True, "events": count})
            if not as_json:
                click.echo(f"{path}: chain {criterion.hex()}: {count} events ok")
    if as_json:
        emit_json({"path": path, "ok": not failures, "chains": results})
    return failures


def _verify_car(path: str, verify: Verify, as_json: bool) -> int:
    """Check the chain in one CAR file; 1 if it failed, else 0."""
    try:
        chain = read_car_chain(Path(path), verify=verify)
    except (KettenError, OSError) as exc:
        message = str(exc)
        if as_json:
            emit_json({"path": path, "ok": False, "error": message})
        else:
            click.echo(f"{path}: FAILED: {message}")
        return 1
    criterion, count = chain.criterion.hex(), len(chain.events)
    if as_json:
        emit_json({"path": path, "ok": True, "chains": [
            {"criterion": criterion, "ok": True, "events": count, "root": cid_text(chain.root)}]})
    else:
        click.echo(f"{path}: chain {criterion}: {count} events ok (root {cid_text(chain.root)})")
    return 0


@click.command("verify")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--verify", "level", default=Verify.FULL.value, show_default=True,
              type=click.Choice([v.value for v in Verify]),
              help="full: links, signatures and writers; links: hash links and heights; "
                   "none: structure only")
@json_option("one JSON object per directory or CAR file: path, ok, chains (criterion, ok, "
             "events or error)")
def verify(paths: tuple[str, ...], level: str, as_json: bool) -> int:
    """Verify every chain of store directories, or the chain of CAR files, offline.

    A file is read as a chain's CARv1: every block is checked against its
    CID and every link followed, then the chain at --verify's level.
    Exit status 1 if a chain fails or a directory is not a store.
    """
    checking = Verify.parse(level)
    failures = 0
    with progress_bar("verifying") as bar:
        for path, reader in _readers(paths):
            if os.path.isfile(path):
                failures += _verify_car(path, checking, as_json)
            elif reader is None:
                failures += 1
                if as_json:
                    emit_json({"path": path, "ok": False, "error": NOT_A_STORE})
                else:
                    click.echo(f"{path}: {NOT_A_STORE}")
            else:
                failures += _verify_store(path, reader, checking, bar, as_json)
    return 1 if failures else 0
