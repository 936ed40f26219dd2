"""Test helpers for ketten and for plugin authors.

Conformance suites in the style of ``trio.testing.check_two_way_stream``:
call them from your own tests with a factory for your plugin.
"""

from __future__ import annotations

from ._check_clock import check_clock
from ._check_store import check_store

__all__ = ["check_clock", "check_store"]
