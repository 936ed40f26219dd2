"""Planning a read: which chains, which seq ranges, in which partitions."""

from __future__ import annotations

import datetime
import hashlib
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from ketten import criterion_key
from ketten.errors import KettenError, UsageError
from ketten.interfaces import StoreReader

from ._options import ReadOptions
from ._reconcile import ChainView, reconcile

__all__ = [
    "Pushdown",
    "Slice",
    "advance_offsets",
    "batch_slices",
    "pack",
    "push_filters",
    "stream_slices",
    "survey",
]

log = logging.getLogger("ketten.spark")


@attrs.frozen
class Pushdown:
    """Filters the source applies itself, exactly (Spark does not re-check them)."""

    criteria: frozenset[str] | None = None
    """Allowed values of the ``criterion`` column, or ``None`` for any."""
    seq_lo: int = 0
    seq_hi: int | None = None
    """Exclusive upper bound on ``seq``, or ``None``."""
    names: Mapping[bytes, str] | None = None
    """Allowed values of the ``name`` column, by key, or ``None`` for any."""
    authors: frozenset[str] | None = None
    """Allowed values of the ``author`` column, or ``None`` for any (applied to the
    rows read, before Spark gets them: stores keep no index by author)."""
    time_lo: int | None = None
    """Inclusive lower bound on ``time`` in microseconds since the epoch, or ``None``."""
    time_hi: int | None = None
    """Exclusive upper bound on ``time`` in microseconds since the epoch, or ``None``
    (rows are filtered as for ``authors``; a row without a time never passes a bound)."""

    @property
    def filters_rows(self) -> bool:
        """Whether rows of the chains read are filtered (by author or time)."""
        return (self.authors is not None or self.time_lo is not None
                or self.time_hi is not None)

    def allows(self, criterion: bytes) -> bool:
        return ((self.criteria is None or criterion.hex() in self.criteria)
                and (self.names is None or criterion in self.names))


_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")


def _criterion_values(values: frozenset[str]) -> frozenset[str]:
    for value in values:
        if not _HEX_KEY.fullmatch(value):
            raise UsageError(
                f"criterion = {value!r:.80} can match nothing: the criterion column holds "
                f"keys, 64 hex digits; filter on the name column "
                f"(name = {value!r:.80}), or read with the option criteria={value!r:.80}")
    return values


def push_filters(filters: Iterable[Any]) -> tuple[Pushdown, list[Any]]:
    """Split Spark filters into what the source applies and what Spark must apply.

    Accepted: ``=`` and ``IN`` on ``criterion``, on ``name`` (string
    equality; a name selects the chain of its key, whose rows then carry it)
    and on ``author``, comparisons on ``seq`` (integer bounds) and on ``time``
    (timezone-aware datetimes, as Spark hands them), and ``IS NOT NULL`` on
    ``criterion``, ``seq`` or ``author`` (never null). Everything else is returned, in
    order, for Spark to evaluate. Raises :class:`~ketten.errors.UsageError`
    for a ``criterion`` value that is not a key (it could match nothing).
    """
    try:
        from pyspark.sql.datasource import (
            EqualNullSafe,
            EqualTo,
            GreaterThan,
            GreaterThanOrEqual,
            In,
            IsNotNull,
            LessThan,
            LessThanOrEqual,
        )
    except ImportError:  # pyspark < 4.1 never calls pushFilters
        return Pushdown(), list(filters)
    criteria: frozenset[str] | None = None
    names: dict[bytes, str] | None = None
    authors: frozenset[str] | None = None
    time_lo: int | None = None
    time_hi: int | None = None
    lo: int = 0
    hi: int | None = None
    rejected: list[Any] = []

    def strings(f: Any) -> frozenset[str] | None:
        """The strings an ``=`` or ``IN`` filter of strings allows (a null in ``IN``
        matches nothing); ``None`` for any other filter."""
        if isinstance(f, EqualTo | EqualNullSafe) and isinstance(f.value, str):
            return frozenset([f.value])
        if isinstance(f, In) and all(isinstance(v, str) or v is None for v in f.value):
            return frozenset(v for v in f.value if v is not None)
        return None

    def cap(bound: int) -> None:
        nonlocal hi
        hi = bound if hi is None else min(hi, bound)

    for f in filters:
        column = getattr(f, "attribute", None)
        if column == ("criterion",):
            values = strings(f)
            if values is None:
                if not isinstance(f, IsNotNull):
                    rejected.append(f)
                continue
            values = _criterion_values(values)
            criteria = values if criteria is None else criteria & values
        elif column == ("name",):
            chosen = strings(f)
            if chosen is None:
                rejected.append(f)
                continue
            named = {criterion_key(v): v for v in chosen}
            names = named if names is None else {k: v for k, v in named.items() if k in names}
        elif column == ("author",):
            chosen = strings(f)
            if chosen is None:
                if not isinstance(f, IsNotNull):
                    rejected.append(f)
                continue
            authors = chosen if authors is None else authors & chosen
        elif column == ("time",):
            micros = _micros(getattr(f, "value", None))
            if micros is None or not isinstance(f, EqualTo | EqualNullSafe | GreaterThan
                                                 | GreaterThanOrEqual | LessThan
                                                 | LessThanOrEqual):
                rejected.append(f)
                continue
            if not isinstance(f, LessThan | LessThanOrEqual):
                low = micros + 1 if isinstance(f, GreaterThan) else micros
                time_lo = low if time_lo is None else max(time_lo, low)
            if not isinstance(f, GreaterThan | GreaterThanOrEqual):
                high = micros if isinstance(f, LessThan) else micros + 1
                time_hi = high if time_hi is None else min(time_hi, high)
        elif column == ("seq",):
            if isinstance(f, IsNotNull):
                continue
            value = getattr(f, "value", None)
            if type(value) is not int:
                rejected.append(f)
            elif isinstance(f, EqualTo | EqualNullSafe):
                lo = max(lo, value)
                cap(value + 1)
            elif isinstance(f, GreaterThan):
                lo = max(lo, value + 1)
            elif isinstance(f, GreaterThanOrEqual):
                lo = max(lo, value)
            elif isinstance(f, LessThan):
                cap(value)
            elif isinstance(f, LessThanOrEqual):
                cap(value + 1)
            else:
                rejected.append(f)
        else:
            rejected.append(f)
    if hi is not None:
        hi = max(hi, 0)
    return Pushdown(criteria, lo, hi, names, authors, time_lo, time_hi), rejected


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _micros(value: Any) -> int | None:
    """Microseconds since the epoch of a timezone-aware datetime, exactly; ``None``
    for anything else (a naive one has no instant to compare with)."""
    if not isinstance(value, datetime.datetime) or value.utcoffset() is None:
        return None
    return (value - _EPOCH) // datetime.timedelta(microseconds=1)


@attrs.frozen
class Slice:
    """Work for one read: a seq range of a chain, or the orphans of a chain.

    ``stop`` is exclusive; for orphans, ``start``/``stop`` bound the seqs
    listed (``stop`` ``None``: no bound).
    """

    criterion: bytes
    start: int
    stop: int | None
    source: str
    others: tuple[str, ...] = ()
    head_hash: bytes | None = None
    """Hash of the event at ``stop - 1`` when it is the source's head."""
    orphans: bool = False
    diverged: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        if self.orphans or self.stop is None:
            return 1
        return self.stop - self.start


def _hash_at(readers: Mapping[str, StoreReader], criterion: bytes) -> Any:
    def hash_at(path: str, seq: int) -> bytes | None:
        try:
            for _, raw in readers[path].read_encoded(criterion, seq, seq + 1):
                return hashlib.sha256(raw).digest()
        except KettenError as exc:
            log.warning("criterion %s seq %d in %s unreadable: %s", criterion.hex(), seq, path, exc)
        return None

    return hash_at


def survey(
    readers: Mapping[str, StoreReader],
    keys: frozenset[bytes] | None,
    pushdown: Pushdown | None = None,
) -> dict[bytes, ChainView]:
    """Every selected chain, reconciled across the replicas in ``readers``, by key.

    Raises whatever the readers raise (:class:`~ketten.errors.StoreError`).
    """
    heads = {path: reader.heads() for path, reader in readers.items()}
    found: set[bytes] = set()
    for chains in heads.values():
        found.update(chains)
    allowed = pushdown or Pushdown()
    chosen = sorted(c for c in found if (keys is None or c in keys) and allowed.allows(c))
    views: dict[bytes, ChainView] = {}
    for criterion in chosen:
        replica_heads = {path: chains[criterion] for path, chains in heads.items()
                         if criterion in chains}
        views[criterion] = reconcile(criterion, replica_heads, _hash_at(readers, criterion))
    return views


def _split(view: ChainView, lo: int, hi: int, options: ReadOptions) -> list[Slice]:
    # A damaged chain is cut exactly at its damage only if one task reads all of it.
    size = max(hi - lo, 1) if options.skip_damaged else options.max_events_per_partition
    slices = []
    for start in range(lo, hi, size):
        stop = min(start + size, hi)
        slices.append(Slice(
            view.criterion, start, stop, view.source, view.others,
            head_hash=view.head_hash if stop == view.height else None,
        ))
    return slices


def batch_slices(
    views: Mapping[bytes, ChainView], options: ReadOptions, pushdown: Pushdown
) -> list[Slice]:
    """The slices of a batch read, in criterion and seq order."""
    lo = max(options.starting_seq, pushdown.seq_lo)
    bounds = [b for b in (options.ending_seq, pushdown.seq_hi) if b is not None]
    hi_limit = min(bounds) if bounds else None
    slices: list[Slice] = []
    for criterion in sorted(views):
        view = views[criterion]
        hi = view.height if hi_limit is None else min(view.height, hi_limit)
        slices.extend(_split(view, lo, hi, options))
        if options.include_orphans:
            slices.append(Slice(criterion, lo, hi_limit, view.source, view.others,
                                orphans=True, diverged=view.diverged))
    return slices


def stream_slices(
    views: Mapping[bytes, ChainView],
    start: Mapping[str, int],
    end: Mapping[str, int],
    options: ReadOptions,
) -> list[Slice]:
    """The slices of a micro-batch from offsets ``start`` to ``end``."""
    slices: list[Slice] = []
    for key in sorted(end):
        lo = start.get(key, options.starting_seq)
        hi = end[key]
        if hi <= lo:
            continue
        view = views.get(bytes.fromhex(key))
        if view is None or view.height < hi:
            # The chain shrank since the offset was planned (a fork was resolved
            # on every replica); read what is there now.
            if view is None:
                continue
            hi = view.height
        slices.extend(_split(view, lo, hi, options))
    return slices


def pack(slices: Sequence[Slice], target: int) -> list[tuple[Slice, ...]]:
    """Group slices into partitions of about ``target`` events, keeping order."""
    partitions: list[tuple[Slice, ...]] = []
    current: list[Slice] = []
    size = 0
    for piece in slices:
        if current and size + piece.size > target:
            partitions.append(tuple(current))
            current, size = [], 0
        current.append(piece)
        size += piece.size
    if current:
        partitions.append(tuple(current))
    return partitions


def advance_offsets(
    start: Mapping[str, int], available: Mapping[str, int], limit: int | None, base: int
) -> dict[str, int]:
    """The end offset of the next micro-batch (keys sorted).

    ``available`` holds each chain's height now; chains missing from
    ``start`` begin at ``base``. With a ``limit``, at most ``limit`` events
    are admitted, shared in proportion to what each chain has pending (the
    remainder goes to chains in key order), so no chain starves.
    """
    keys = sorted(set(start) | set(available))
    begin = {k: start.get(k, base) for k in keys}
    pending = {k: max(0, available.get(k, 0) - begin[k]) for k in keys}
    total = sum(pending.values())
    if limit is None or total <= limit:
        return {k: begin[k] + pending[k] for k in keys}
    share = {k: pending[k] * limit // total for k in keys}
    left = limit - sum(share.values())
    for k in keys:
        if left == 0:
            break
        if share[k] < pending[k]:
            share[k] += 1
            left -= 1
    return {k: begin[k] + share[k] for k in keys}
