"""The documentation (docs/) builds with warnings as errors, documents every public
name, and its Spark guide lists every option of the data source."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import ketten
from ketten.spark import _options

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
PUBLIC_MODULES = ("ketten", "ketten.errors", "ketten.hookspecs", "ketten.interfaces",
                  "ketten.wire", "ketten.testing", "ketten.blocking", "ketten.aio",
                  "ketten.spark")


def sphinx(source: Path, out: Path, *extra: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", *extra,
         str(source), str(out)],
        capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "html"
    done = sphinx(DOCS, out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def documented(html: Path) -> set[str]:
    """The Python objects the build described, from its objects.inv."""
    data = (html / "objects.inv").read_bytes()
    header, _, compressed = data.partition(b"compressed using zlib.\n")
    assert header.startswith(b"# Sphinx inventory version 2")
    names = set()
    for line in zlib.decompress(compressed).decode().splitlines():
        match = re.match(r"(\S+)\s+py:\w+\s", line)
        if match:
            names.add(match.group(1))
    return names


def test_the_docs_build_with_warnings_as_errors(built: Path) -> None:
    for page in ("index", "embedding", "guarantees", "operations", "plugins", "spark",
                 "api/ketten", "api/testing"):
        assert (built / f"{page}.html").is_file(), page
    operations = (built / "operations.html").read_text()
    # The options table is made from the plugins' own declarations.
    assert "max_handshakes_per_source" in operations and "segment_bytes" in operations
    plugins = (built / "plugins.html").read_text()
    assert "ketten_make_store" in plugins and "check_store" in plugins


def test_every_public_name_is_documented(built: Path) -> None:
    names = documented(built)
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.ismodule(value):
                wanted = {value.__name__}
            elif module is ketten and name in ketten.errors.__all__:
                wanted = {f"ketten.errors.{name}"}  # documented once, in ketten.errors
            else:
                wanted = {f"{module_name}.{name}"}
            if not wanted & names:
                missing.append(f"{module_name}.{name}")
    assert missing == []


def test_the_spark_guide_lists_every_option() -> None:
    guide = (DOCS / "spark.rst").read_text().lower()
    missing = [option for option in _options._KNOWN if f"``{option}``" not in guide]
    assert missing == []


def test_a_docstring_error_fails_the_build(tmp_path: Path) -> None:
    # The project's configuration (-c docs) over a module whose docstring is broken RST.
    (tmp_path / "broken_doc.py").write_text(
        '"""A module.\n\n    indented\n  less indented\n"""\n')
    source = tmp_path / "source"
    source.mkdir()
    (source / "index.rst").write_text("Broken\n======\n\n.. automodule:: broken_doc\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = sphinx(source, tmp_path / "html", "-c", str(DOCS), env=env)
    assert done.returncode != 0
    assert "broken_doc" in done.stderr
