"""What the delivery plugins share: the bound error, statistics, option parsing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ketten.errors import ConfigError, HoldbackFull

__all__ = [
    "DEFAULT_MAX_HELD",
    "DeliveryStatistics",
    "HoldbackFull",
    "parse_criteria",
    "parse_max_held",
    "parse_positions",
]

DEFAULT_MAX_HELD = 65536
_KEY_SIZE = 32


@attrs.frozen
class DeliveryStatistics:
    """A snapshot of a delivery queue's counters.

    ``offered``: events passed to ``offer``; ``delivered``: returned to the
    application; ``duplicates``: offers of a position already delivered or
    held; ``conflicts``: duplicates whose hash differs from the held event
    (a fork the caller has not resolved); ``held``: waiting now;
    ``peak_held``: the largest ``held`` so far; ``refused``: offers rejected
    with :class:`HoldbackFull`; ``wakeups``: held events re-examined because
    what they waited for arrived or was delivered; ``unstamped``: events
    without a usable vector stamp, ordered by their chain only.
    """

    offered: int = 0
    delivered: int = 0
    duplicates: int = 0
    conflicts: int = 0
    held: int = 0
    peak_held: int = 0
    refused: int = 0
    wakeups: int = 0
    unstamped: int = 0


def _key(value: object, what: str) -> bytes:
    if type(value) is not bytes or len(value) != _KEY_SIZE:
        raise ConfigError(f"{what} must be 32-byte criterion keys, got {value!r:.40}")
    return value


def parse_criteria(value: object) -> tuple[bytes, ...]:
    """The ``criteria`` option: an iterable of distinct 32-byte keys, in order."""
    if isinstance(value, bytes | str) or not isinstance(value, Iterable):
        raise ConfigError("delivery option 'criteria' must be an iterable of 32-byte keys")
    keys = tuple(_key(v, "delivery option 'criteria'") for v in value)
    if len(set(keys)) != len(keys):
        raise ConfigError("delivery option 'criteria' lists a criterion twice")
    return keys


def parse_positions(value: object, name: str, *, allow_none: bool) -> dict[bytes, int | None]:
    """A ``{criterion: seq}`` option (``None`` allowed where ``allow_none``)."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"delivery option {name!r} must map criterion keys to seq numbers")
    positions: dict[bytes, int | None] = {}
    for key, seq in value.items():
        if seq is None and allow_none:
            positions[_key(key, f"keys of delivery option {name!r}")] = None
            continue
        if type(seq) is not int or seq < 0:
            raise ConfigError(f"delivery option {name!r}: seq must be an int >= 0, got {seq!r}")
        positions[_key(key, f"keys of delivery option {name!r}")] = seq
    return positions


def parse_max_held(options: Mapping[str, Any]) -> int:
    """The ``max_held`` option: a positive int (default 65536)."""
    value = options.get("max_held", DEFAULT_MAX_HELD)
    if type(value) is not int or value < 1:
        raise ConfigError(f"delivery option 'max_held' must be a positive int, got {value!r}")
    return value
