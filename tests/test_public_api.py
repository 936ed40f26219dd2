"""The public API is re-exported explicitly, each name exactly once."""

from __future__ import annotations

import ast
from pathlib import Path

import ketten
import ketten.testing

SDK = Path(ketten.__file__).parent


def test_every_public_name_is_exported_exactly_once() -> None:
    assert len(ketten.__all__) == len(set(ketten.__all__))
    for name in ketten.__all__:
        assert hasattr(ketten, name), name


def test_all_matches_the_imports() -> None:
    tree = ast.parse((SDK / "__init__.py").read_text())
    imported: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            imported.extend(alias.asname or alias.name for alias in node.names)
    imported = [n for n in imported if n != "annotations"]
    assert len(imported) == len(set(imported)), "a name is imported twice"
    assert set(imported) | {"__version__"} == set(ketten.__all__)


def test_public_objects_live_in_private_modules_or_public_submodules() -> None:
    public_modules = {"ketten.errors", "ketten.hookspecs", "ketten.interfaces"}
    for name in ketten.__all__:
        obj = getattr(ketten, name)
        module = getattr(obj, "__module__", None)
        if module is None or name.isupper() or name == "__version__":
            continue
        assert module == "ketten" or module in public_modules or module.split(".")[1].startswith("_") \
            or module.startswith(("ketten.errors", "ketten.hookspecs", "ketten.interfaces")), (name, module)


def test_errors_share_one_base() -> None:
    for name in ketten.errors.__all__:
        assert issubclass(getattr(ketten.errors, name), ketten.KettenError)
        assert getattr(ketten, name) is getattr(ketten.errors, name)


def test_testing_exports() -> None:
    assert len(ketten.testing.__all__) == len(set(ketten.testing.__all__))
    for name in ketten.testing.__all__:
        assert hasattr(ketten.testing, name)
