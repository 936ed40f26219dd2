"""The layout keeps its promises: read from the source's import statements.

* the sans-IO core (``ketten._core``) imports neither trio nor any driver;
* no part of the node imports ``Node`` (only the composition root builds it);
* plugins and adapters import only ketten's public modules;
* there is no import cycle, counting imports made only for type checking.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import ketten
import ketten.adapters
import ketten.plugins

PACKAGES = {
    "ketten": Path(ketten.__file__).parent,
    "ketten.plugins": Path(ketten.plugins.__file__).parent,
    "ketten.adapters": Path(ketten.adapters.__file__).parent,
}
PUBLIC = {"ketten", "ketten.errors", "ketten.interfaces", "ketten.wire", "ketten.hookspecs",
          "ketten.testing", "ketten.logs", "ketten.ipld"}
PARTS = ["rpc", "local_chains", "replica_sets", "replicator", "broker", "publisher", "reader",
         "feeds"]


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            relative = path.relative_to(root).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            name = ".".join([package, *parts])
            if package == "ketten" and parts[:1] in (["plugins"], ["adapters"], ["spark"]):
                continue
            found[name] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every ketten module ``name`` imports (at run time or for type checking)."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = [f"{module}.{alias.name}" for alias in node.names]
            named = [t for t in submodules if t in known]
            # ``from package import module`` depends on the module, not the package.
            targets = named if len(named) == len(submodules) else [module, *named]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


@functools.cache  # parsing every module takes a second; the tests only read it
def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def test_the_core_is_sans_io() -> None:
    g = graph()
    for name, path in modules().items():
        if not name.startswith("ketten._core"):
            continue
        source = path.read_text()
        assert "import trio" not in source, f"{name} imports trio"
        for target in g[name]:
            assert target.startswith("ketten._core") or target == "ketten.errors", (
                f"{name} imports {target}")


def test_no_part_of_the_node_imports_it() -> None:
    g = graph()
    for part in PARTS:
        name = f"ketten._node.{part}"
        assert name in g, name
        assert "ketten._node.node" not in g[name], f"{name} imports the Node"
        assert "ketten._node" not in g[name], f"{name} imports the package that builds the Node"


def test_plugins_import_only_public_modules() -> None:
    for name, targets in graph().items():
        if not name.startswith(("ketten.plugins", "ketten.adapters")):
            continue
        own = name.split(".")[:3]
        for target in targets:
            if target.startswith(("ketten.plugins", "ketten.adapters")):
                assert target.split(".")[:3] == own or target.count(".") <= 2, (
                    f"{name} imports {target}")
                continue
            assert target in PUBLIC, f"{name} imports the private {target}"


def test_there_is_no_import_cycle() -> None:
    g = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for target in sorted(g.get(name, ())):
            if target.startswith("ketten.testing") or name.startswith("ketten.testing"):
                continue  # the test kits sit on top of everything, by design
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if state.get(target) is None:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in sorted(g):
        if state.get(name) is None and name != "ketten":
            visit(name)
