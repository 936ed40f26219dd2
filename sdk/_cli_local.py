"""``ketten plugins`` and ``ketten keygen``: commands that need no network and no store."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import click

from ._cli_output import emit_json, json_option, print_table
from ._core.identity import Identity
from ._node.plugins import KINDS, broken_plugins, installed_names, plugin_manager

__all__ = ["keygen", "plugins"]


@click.command("plugins")
@json_option("one JSON object: kind -> names, and 'broken': name -> why")
def plugins(as_json: bool) -> int:
    """List the installed plugins by kind, and any that failed to load."""
    pm = plugin_manager()
    broken = broken_plugins(pm)
    names = {kind: installed_names(pm, kind) for kind in KINDS}
    if as_json:
        emit_json({**names, "broken": broken})
        return 0
    rows = [[kind, ", ".join(names[kind]) or "-"] for kind in KINDS]
    rows += [["broken", f"{name}: {why}"] for name, why in sorted(broken.items())]
    print_table(["kind", "plugins"], rows)
    return 0


@click.command("keygen")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@json_option("one JSON object: path, node_id, public_key")
def keygen(path: Path, as_json: bool) -> int:
    """Write a new private key file (mode 0600) and print its node id.

    An existing file is never overwritten.
    """
    if not path.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path.parent))
    identity = Identity.generate()
    identity.save(path)
    if as_json:
        emit_json({"path": str(path), "node_id": identity.node_id.hex(),
                   "public_key": identity.public_key.hex()})
    else:
        click.echo(identity.node_id.hex())
    return 0
