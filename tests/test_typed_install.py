"""A user's ``mypy --strict`` sees ketten's types under a normal and an editable install,
and a normal install holds every module of the source tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TOP = Path(__file__).resolve().parent.parent
SOURCES = ["sdk", "plugins", "adapters", "spark_connector", "tools", "pyproject.toml",
           "README.md"]
USER_PROGRAM = textwrap.dedent("""\
    import ketten
    from ketten.testing import open_cluster


    async def main() -> None:
        async with ketten.open_node(ketten.NodeConfig()) as node:
            event = await node.publish("orders", b"created")
            count: int = event.payload
            reveal_type(open_cluster)
""")


def _install(tmp_path: Path, editable: bool) -> Path:
    """A fresh environment holding only ketten, installed from a copy of the sources;
    its dependencies come from the running environment (no network)."""
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        path = TOP / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    command = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
               "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run([*command, *(["-e"] if editable else []), str(source)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


@pytest.mark.parametrize("editable", [False, True], ids=["normal", "editable"])
def test_mypy_strict_sees_kettens_types(tmp_path: Path, editable: bool) -> None:
    python = _install(tmp_path, editable)
    user = tmp_path / "user"
    user.mkdir()
    (user / "app.py").write_text(USER_PROGRAM)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--python-executable", str(python), "app.py"],
        capture_output=True, text=True, cwd=user, timeout=600)
    out = checked.stdout
    assert "import-not-found" not in out and "import-untyped" not in out, out
    # The types are real: a payload is bytes, and a helper's signature is known.
    assert 'Incompatible types in assignment (expression has type "bytes", variable has ' \
        'type "int")' in out, out
    assert 'Revealed type is "def (count: int, *, seed: int =' in out, out
    assert checked.returncode == 1 and out.count("error:") == 1, out


def test_a_normal_install_holds_every_module(tmp_path: Path) -> None:
    python = _install(tmp_path, editable=False)
    mapping = {"sdk": "ketten", "plugins": "ketten.plugins", "adapters": "ketten.adapters",
               "spark_connector": "ketten.spark"}
    modules = []
    for folder, package in mapping.items():
        for path in sorted((TOP / folder).rglob("*.py")):
            relative = path.relative_to(TOP / folder).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            modules.append(".".join([package, *parts]))
    probe = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\n"
    done = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    located = subprocess.run([python, "-c", "import ketten._node.node as m; print(m.__file__)"],
                             capture_output=True, text=True, cwd=tmp_path, check=True)
    assert str(tmp_path / "env") in located.stdout
