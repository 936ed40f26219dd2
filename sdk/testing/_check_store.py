"""Conformance suite for stores."""

from collections.abc import Callable
from typing import Any


async def check_store(factory: Callable[[str], Any]) -> None:
    raise NotImplementedError
