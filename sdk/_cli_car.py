"""``ketten export`` and ``ketten import``: a chain as a CARv1 file, offline.

``export`` reads a chain from a store directory (through the store reader
hook) and writes its blocks, genesis first, under a header whose one root is
the head block. ``import`` checks a CAR completely (every CID, link,
signature and hash link) before it loads the chain into a store directory
through the store plugin; a store that already holds a prefix of the chain
gets the rest, one that holds another chain for the criterion is refused.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import click
import trio
from multiformats import CID, multihash

from ._cli_network import _criterion
from ._cli_output import emit_json, json_option
from ._core.car import car_header, car_section, read_car_header, read_car_sections
from ._core.chain import Verify
from ._core.chain_car import CarChain, chain_blocks, chain_from_car
from ._core.event import Event
from ._core.identity import criterion_key
from ._core.ipld import DAG_CBOR, SHA2_256, cid_text
from ._node.config import NodeConfig
from ._node.node import open_node
from ._node.plugins import plugin_manager
from .errors import StoreConflict, UsageError

__all__ = ["export_car", "import_car", "read_car_chain", "write_car"]

NOT_A_STORE = "not a ketten store directory (no installed store plugin reads it)"
_BATCH = 1000
"""Events appended to the store at a time on import."""
_PLACEHOLDER = CID("base32", 1, DAG_CBOR, multihash.wrap(bytes(32), SHA2_256))


def read_car_chain(path: Path, *, verify: Verify = Verify.FULL) -> CarChain:
    """The chain in the CAR file ``path``, checked (see ``chain_from_car``)."""
    data = path.read_bytes()
    roots, offset = read_car_header(data)
    return chain_from_car(roots, read_car_sections(data, offset), verify=verify)


def write_car(events: Iterator[Event], path: Path) -> tuple[CID, int, int]:
    """Write a chain's CAR to ``path``, streaming; return its root, events and bytes.

    The header's root has a fixed size, so it is written last over a
    placeholder; the file appears under ``path`` only when complete.
    """
    directory = path.parent if str(path.parent) else Path(".")
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(car_header([_PLACEHOLDER]))
            last = None
            count = 0
            for block in chain_blocks(events):
                out.write(car_section(block.cid, block.data))
                last = block.cid
                count += 1
            if last is None:
                raise UsageError("the chain has no events")
            size = out.tell()
            out.seek(0)
            out.write(car_header([last]))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return last, count, size


@click.command("export")
@click.argument("criterion")
@click.option("--car", "car_path", required=True,
              type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="write the CARv1 file here (replaced if it exists)")
@click.option("--data", required=True, type=click.Path(exists=True, file_okay=False),
              help="the store directory to read the chain from")
@click.option("--by-key", is_flag=True,
              help="CRITERION is a chain's 64-hex-digit key (as ketten chains lists them), "
                   "not a name")
@json_option("one JSON object: car, criterion, events, root, bytes")
def export_car(criterion: str, car_path: Path, data: str, by_key: bool, as_json: bool) -> None:
    """Write a chain of a store directory as a CARv1 file, its head block the root."""
    named = _criterion(criterion, by_key)
    key = named if isinstance(named, bytes) else criterion_key(named)
    reader = plugin_manager().hook.ketten_open_store_reader(path=data)
    if reader is None:
        raise UsageError(f"{data}: {NOT_A_STORE}")
    try:
        if key not in reader.heads():
            raise UsageError(f"{data}: no chain {criterion!r} (key {key.hex()})")
        events = (Event.from_bytes(raw) for _, raw in reader.read_encoded(key))
        root, count, size = write_car(events, car_path)
    finally:
        reader.close()
    if as_json:
        emit_json({"car": str(car_path), "criterion": key.hex(), "events": count,
                   "root": cid_text(root), "bytes": size})
    else:
        click.echo(f"{car_path}: {count} events of {key.hex()}, root {cid_text(root)}")


async def _load(chain: CarChain, data: Path, store: str) -> int:
    """Append the part of ``chain`` the store lacks; the number of events appended."""
    events = chain.events
    config = NodeConfig(store=store, replication=1, options={"store": {"path": str(data)}})
    async with open_node(config) as node:
        head = await node.store.head(chain.criterion)
        start = 0
        if head is not None:
            last = len(events) - 1
            ours = head if head.seq <= last else (
                await node.store.range(chain.criterion, last, last + 1))[0]
            if ours != events[ours.seq]:
                raise StoreConflict(
                    f"{data} holds another chain for {chain.criterion.hex()}: its seq "
                    f"{ours.seq} differs from the CAR's")
            start = head.seq + 1
        for i in range(start, len(events), _BATCH):
            await node.store.append(events[i:i + _BATCH])
    return max(0, len(events) - start)


@click.command("import")
@click.argument("car_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--data", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="the store directory to load the chain into (created if missing)")
@click.option("--store", default="sqlite", show_default=True,
              help="store plugin of the directory")
@json_option("one JSON object: car, criterion, events, added, root")
def import_car(car_file: Path, data: Path, store: str, as_json: bool) -> None:
    """Check a chain's CARv1 file completely, then load the chain into a store directory.

    Every block must match its CID, every link must lead to the genesis and
    every signature and hash link must verify; nothing is stored otherwise.
    """
    chain = read_car_chain(car_file)
    added = trio.run(_load, chain, data, store)
    if as_json:
        emit_json({"car": str(car_file), "criterion": chain.criterion.hex(),
                   "events": len(chain.events), "added": added, "root": cid_text(chain.root)})
    else:
        click.echo(f"{car_file}: {len(chain.events)} events of {chain.criterion.hex()} ok, "
                   f"{added} added to {data}")
