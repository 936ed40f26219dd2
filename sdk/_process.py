"""Settings for a process whose main job is running a node."""

from __future__ import annotations

import gc

from .errors import UsageError

__all__ = ["DEFAULT_GC_THRESHOLD", "tune_gc"]

DEFAULT_GC_THRESHOLD = 50_000
"""Allocations between two collections of the youngest generation (Python's is 700)."""


def tune_gc(threshold: int = DEFAULT_GC_THRESHOLD) -> None:
    """Make the cyclic garbage collector cheaper for a node process (``ketten serve``
    calls this once its node is open; an application that embeds a node may too).

    What exists now is moved out of the collector's reach (:func:`gc.freeze`:
    what a node allocates at start lives as long as the process), and the
    youngest generation is collected after ``threshold`` allocations instead
    of 700, so that the many short-lived objects of message handling are
    mostly freed by reference counting before a collection looks at them.
    ``threshold`` 0 leaves the collector as it is. Process-wide: it changes
    every thread's collector. Raises :class:`~ketten.errors.UsageError` for a
    negative or non-integer ``threshold``.
    """
    if type(threshold) is not int or threshold < 0:
        raise UsageError(f"the gc threshold must be an int >= 0, got {threshold!r}")
    if threshold == 0:
        return
    gc.collect()
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(threshold, second, third)
