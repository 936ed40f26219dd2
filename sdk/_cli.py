"""The ``ketten`` command line.

Exit codes: 0 success; 1 a check found a problem (``verify``, ``chains``);
2 bad usage or an error, printed as one line on stderr (no traceback);
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence

from ._core.chain import Verify, scan_encoded_chain
from ._core.identity import Identity
from ._node.plugins import KINDS, broken_plugins, installed_names, plugin_manager
from .errors import KettenError
from .interfaces import StoreReader

__all__ = ["main"]


def _cmd_plugins(args: argparse.Namespace) -> int:
    pm = plugin_manager()
    broken = broken_plugins(pm)
    if args.json:
        print(json.dumps({**{kind: installed_names(pm, kind) for kind in KINDS},
                          "broken": broken}))
        return 0
    for kind in KINDS:
        print(f"{kind:10} {', '.join(installed_names(pm, kind)) or '-'}")
    for name, why in sorted(broken.items()):
        print(f"broken     {name}: {why}")
    return 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    identity = Identity.generate()
    identity.save(args.path)
    print(identity.node_id.hex())
    return 0


def _readers(paths: Sequence[str]) -> Iterator[tuple[str, StoreReader | None]]:
    """Each path with a reader from the store plugin that recognises it (closed after use)."""
    pm = plugin_manager()
    for path in paths:
        reader = pm.hook.ketten_open_store_reader(path=path)
        if reader is None:
            print(f"{path}: not a ketten store directory (no installed store plugin reads it)")
            yield path, None
            continue
        try:
            yield path, reader
        finally:
            reader.close()


def _cmd_chains(args: argparse.Namespace) -> int:
    """List the chains of store directories with their heights and head hashes."""
    failures = 0
    for path, reader in _readers(args.paths):
        if reader is None:
            failures += 1
            continue
        heads = reader.heads()
        if args.json:
            print(json.dumps({"path": path, "chains": [
                {"criterion": c.hex(), "events": heads[c][0] + 1, "head": heads[c][1].hex()}
                for c in sorted(heads)]}))
            continue
        print(f"{path}: {len(heads)} chains")
        for criterion in sorted(heads):
            seq, head = heads[criterion]
            print(f"  {criterion.hex()}  {seq + 1:>10} events  head {head.hex()[:16]}")
    return 1 if failures else 0


def _cmd_verify(args: argparse.Namespace) -> int:
    """Check every chain of one or more store directories, offline."""
    verify = Verify.parse(args.verify)
    failures = 0
    for path, reader in _readers(args.paths):
        if reader is None:
            failures += 1
            continue
        for criterion in reader.criteria():
            encoded = (raw for _, raw in reader.read_encoded(criterion))
            try:
                count = sum(1 for _ in scan_encoded_chain(encoded, verify=verify))
            except KettenError as exc:
                failures += 1
                print(f"{path}: chain {criterion.hex()}: FAILED: {exc}")
            else:
                print(f"{path}: chain {criterion.hex()}: {count} events ok")
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="ketten", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ketten {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list the installed plugins by kind")
    p.add_argument("--json", action="store_true", help="one JSON object: kind -> names")
    p.set_defaults(run=_cmd_plugins)
    p = sub.add_parser("keygen", help="write a new private key file (mode 0600)")
    p.add_argument("path")
    p.set_defaults(run=_cmd_keygen)
    p = sub.add_parser("chains", help="list the chains in store directories")
    p.add_argument("paths", nargs="+")
    p.add_argument("--json", action="store_true", help="one JSON object per directory")
    p.set_defaults(run=_cmd_chains)
    p = sub.add_parser("verify", help="verify every chain in store directories")
    p.add_argument("paths", nargs="+")
    p.add_argument("--verify", default="full", choices=[v.value for v in Verify])
    p.set_defaults(run=_cmd_verify)
    from ._serve import add_serve_parser

    add_serve_parser(sub)
    sub.add_parser("sim", help="seeded fault simulation with the Jepsen-style checker "
                   "(ketten sim --help for its options)", add_help=False)
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["sim"]:
        from .testing.jepsen import main as simulate

        return simulate(args_list[1:])
    args = parser.parse_args(args_list)
    try:
        code: int = args.run(args)
    except KettenError as exc:
        print(f"ketten: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        print(f"ketten: error:{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
