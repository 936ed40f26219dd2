"""The build backend: setuptools, with editable installs in strict mode by default.

setuptools' default ("lenient") editable install maps ``ketten`` to ``sdk/``
(and ``ketten.plugins`` to ``plugins/``, ...) with an import hook, which
static type checkers cannot follow: ``mypy`` would see no ``ketten`` at all.
Strict mode builds a tree of links under ``build/`` that has the installed
layout, which both Python and type checkers read; edits to existing files
show at once, and a new module shows after ``pip install -e .`` again.
``pip install -e . --config-settings editable_mode=lenient`` still gives the
import hook.
"""

from __future__ import annotations

from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - the whole PEP 517 interface


def build_editable(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                   metadata_directory: str | None = None) -> str:
    settings = dict(config_settings or {})
    if "editable-mode" not in settings:
        settings.setdefault("editable_mode", "strict")
    return _setuptools.build_editable(wheel_directory, settings, metadata_directory)
