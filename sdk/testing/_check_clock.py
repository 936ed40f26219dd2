"""Conformance suite for clocks."""

from collections.abc import Callable
from typing import Any


def check_clock(factory: Callable[[], Any]) -> None:
    raise NotImplementedError
