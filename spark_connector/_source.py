"""The ``ketten`` PySpark data source: batch and streaming readers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ketten._core.chain import Verify
from ketten.errors import UsageError

from ._options import ReadOptions
from ._peers import sync_peers, with_peer_directory
from ._plan import (
    Pushdown,
    Slice,
    advance_offsets,
    batch_slices,
    pack,
    push_filters,
    stream_slices,
    survey,
)
from ._reconcile import ChainView
from ._scan import read_slices
from ._schema import HEAD_COLUMNS, NAME_FIELD, declared_columns, spark_schema
from ._stores import open_readers

__all__ = ["KettenDataSource", "KettenPartition", "KettenPushdownDataSource"]

_HEADS_TASK_SCALE = 2
_HEADS_BATCH_SCALE = 16
"""How many times more rows a task and an Arrow batch hold when the rows come from
the chains' heads (no event read) than when they are read: such rows cost little
to make, so per-task and per-batch costs weigh more."""


class KettenPartition(InputPartition):
    """The slices one Spark task reads."""

    def __init__(self, slices: tuple[Slice, ...]) -> None:
        super().__init__(slices)

    @property
    def slices(self) -> tuple[Slice, ...]:
        value: tuple[Slice, ...] = self.value
        return value


def _partitions(slices: Sequence[Slice], options: ReadOptions) -> list[KettenPartition]:
    return [KettenPartition(p) for p in pack(slices, options.max_events_per_partition)]


_NO_PUSHDOWN = Pushdown()


def _survey(options: ReadOptions, pushdown: Pushdown = _NO_PUSHDOWN) -> dict[bytes, ChainView]:
    with open_readers(options.store_paths()) as readers:
        return survey(readers, options.keys, pushdown)


def _named(batches: Iterator[pa.RecordBatch], names: Mapping[str, str]) -> Iterator[pa.RecordBatch]:
    """Each batch (rows of one chain) with the ``name`` column inserted after ``criterion``."""
    for batch in batches:
        n = batch.num_rows
        name = names.get(batch.column(0)[0].as_py()) if n else None
        column = (pa.nulls(n, pa.string()) if name is None
                  else pa.repeat(pa.scalar(name, pa.string()), n))
        yield batch.add_column(1, NAME_FIELD, column)


def _selected(batches: Iterator[pa.RecordBatch],
              columns: pa.Schema | None) -> Iterator[pa.RecordBatch]:
    """Each batch with only the ``columns`` (``None``: all of them)."""
    if columns is None:
        yield from batches
        return
    for batch in batches:
        yield pa.RecordBatch.from_arrays([batch.column(f.name) for f in columns],
                                         schema=columns)


def _filtered(batches: Iterator[pa.RecordBatch],
              pushdown: Pushdown) -> Iterator[pa.RecordBatch]:
    """Each batch with only the rows the pushed author and time filters let through;
    batches left empty are dropped."""
    if not pushdown.filters_rows:
        yield from batches
        return
    allowed = (None if pushdown.authors is None
               else pa.array(sorted(pushdown.authors), pa.string()))
    for batch in batches:
        masks = []
        if allowed is not None:
            masks.append(pc.is_in(batch.column("author"), value_set=allowed))
        if pushdown.time_lo is not None or pushdown.time_hi is not None:
            micros = batch.column("time").cast(pa.int64())
            if pushdown.time_lo is not None:
                masks.append(pc.greater_equal(micros, pushdown.time_lo))
            if pushdown.time_hi is not None:
                masks.append(pc.less(micros, pushdown.time_hi))
        mask = masks[0]
        for more in masks[1:]:
            mask = pc.and_kleene(mask, more)
        kept = batch.filter(mask)  # a null (no time) does not pass
        if kept.num_rows:
            yield kept


def _from_heads(slices: tuple[Slice, ...], columns: pa.Schema,
                names: Mapping[str, str], rows: int) -> Iterator[pa.RecordBatch]:
    """The rows of ``slices`` with only ``criterion``, ``name`` and ``seq`` columns,
    made from the seq ranges the chains' heads gave the plan: no event is read."""
    for piece in slices:
        assert not piece.orphans and piece.stop is not None
        criterion = piece.criterion.hex()
        name = names.get(criterion)
        for first in range(piece.start, piece.stop, rows):
            seqs = pa.array(np.arange(first, min(first + rows, piece.stop), dtype=np.int64))
            n = len(seqs)
            made = {
                "criterion": pa.repeat(pa.scalar(criterion, pa.string()), n),
                "name": (pa.nulls(n, pa.string()) if name is None
                         else pa.repeat(pa.scalar(name, pa.string()), n)),
                "seq": seqs,
            }
            yield pa.RecordBatch.from_arrays([made[f.name] for f in columns], schema=columns)


def _missing(options: ReadOptions, pushdown: Pushdown, views: Mapping[bytes, ChainView]) -> None:
    """Raise :class:`UsageError` for a criterion the options ask for that no store holds."""
    if options.keys is None:
        return
    missing = sorted(k for k in options.keys if k not in views and pushdown.allows(k))
    if not missing:
        return
    key = missing[0]
    what = (f"criterion {options.names[key]!r} (key {key.hex()})" if key in options.names
            else f"criterion key {key.hex()}")
    where = ", ".join([*options.paths, *(f"peer {p}" for p in options.peers)])
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    raise UsageError(f"{what}{more} is held by none of the sources read ({where}); "
                     f"names are hashed exactly as written (case and spaces count)")


def _heights(views: Mapping[bytes, ChainView]) -> dict[str, int]:
    return {key.hex(): views[key].height for key in sorted(views)}


class KettenDataSource(DataSource):
    """``spark.read.format("ketten")``: replicated ketten chains as rows.

    See :mod:`ketten.spark` for the options and columns.
    """

    @classmethod
    def name(cls) -> str:
        return "ketten"

    def _resolved(self) -> ReadOptions:
        """Parsed options with every source checked (and live peers synced)."""
        resolved: ReadOptions | None = getattr(self, "_ketten_options", None)
        if resolved is None:
            resolved = ReadOptions.parse(self.options)
            if resolved.peers:
                resolved = with_peer_directory(resolved)
                sync_peers(resolved)
            with open_readers(resolved.store_paths()):
                pass
            self._ketten_options = resolved
        return resolved

    def schema(self) -> StructType:
        """The columns; parses and checks the options, so bad ones fail at ``load()``."""
        return spark_schema(orphans=self._resolved().include_orphans)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._resolved()
        return KettenReader(options, declared_columns(schema, orphans=options.include_orphans))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = self._resolved()
        options.check_streaming()
        return KettenStreamReader(options,
                                  declared_columns(schema, orphans=options.include_orphans))


class KettenPushdownDataSource(KettenDataSource):
    """:class:`KettenDataSource` whose batch reader takes pushed-down filters.

    Spark refuses a reader that implements ``pushFilters`` unless
    ``spark.sql.python.filterPushdown.enabled`` is true, so
    :func:`ketten.spark.register` picks this variant only then.
    """

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._resolved()
        return KettenPushdownReader(options,
                                    declared_columns(schema, orphans=options.include_orphans))


class KettenReader(DataSourceReader):
    """Batch reads: one partition per chain or chain range, small chains grouped."""

    def __init__(self, options: ReadOptions, columns: pa.Schema | None = None) -> None:
        self._options = options
        self._columns = columns
        self._pushdown = Pushdown()

    def _heads_only(self) -> bool:
        """Whether the rows come from the chains' heads alone (see :func:`_from_heads`)."""
        columns = self._columns
        return (columns is not None and HEAD_COLUMNS.issuperset(columns.names)
                and self._options.verify is Verify.NONE and not self._options.include_orphans
                and not self._pushdown.filters_rows)

    def partitions(self) -> Sequence[InputPartition]:
        options = self._options
        if self._heads_only():
            # A row made from a head costs a small part of one read from a store.
            options = attrs.evolve(options, max_events_per_partition=(
                options.max_events_per_partition * _HEADS_TASK_SCALE))
        views = _survey(options, self._pushdown)
        _missing(options, self._pushdown, views)
        slices = batch_slices(views, options, self._pushdown)
        return _partitions(slices, options) or [KettenPartition(())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KettenPartition)
        names = {k.hex(): v for k, v in
                 {**self._options.names, **(self._pushdown.names or {})}.items()}
        if self._heads_only():
            assert self._columns is not None
            return _from_heads(partition.slices, self._columns, names,
                               self._options.batch_rows * _HEADS_BATCH_SCALE)
        return _selected(_filtered(_named(read_slices(partition.slices, self._options), names),
                                   self._pushdown), self._columns)


class KettenPushdownReader(KettenReader):
    """:class:`KettenReader` that applies filters on ``criterion`` and ``seq`` itself."""

    def pushFilters(self, filters: list[Any]) -> Any:
        self._pushdown, rejected = push_filters(filters)
        return rejected


def _offsets(value: Any, where: str) -> dict[str, int]:
    if not isinstance(value, dict):
        raise UsageError(f"{where}: a ketten offset is a JSON object, got {value!r:.80}")
    for key, height in value.items():
        if not (isinstance(key, str) and len(key) == 64 and type(height) is int and height >= 0):
            raise UsageError(f"{where}: bad entry {key!r}: {height!r} in a ketten offset")
    return value


class KettenStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming reads; an offset is ``{criterion hex: height}`` with sorted keys."""

    def __init__(self, options: ReadOptions, columns: pa.Schema | None = None) -> None:
        self._options = options
        self._columns = columns
        self._target: dict[str, int] | None = None

    def _now(self) -> dict[str, int]:
        sync_peers(self._options)
        return _heights(_survey(self._options))

    def _available(self) -> dict[str, int]:
        now = self._now()
        if self._target is None:
            return now
        return {k: min(now.get(k, 0), h) for k, h in self._target.items()}

    def initialOffset(self) -> dict[str, int]:
        now = self._now()
        if self._options.starting_offsets == "latest":
            return now
        return {k: self._options.starting_seq for k in now}

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._options.max_events_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return advance_offsets(
            _offsets(start, "start offset"), self._available(), rows, self._options.starting_seq
        )

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = _offsets(start, "start offset")
        finish = _offsets(end, "end offset")
        if begin == finish:
            return []
        slices = stream_slices(_survey(self._options), begin, finish, self._options)
        return _partitions(slices, self._options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KettenPartition)
        return _selected(_named(read_slices(partition.slices, self._options),
                                {k.hex(): v for k, v in self._options.names.items()}),
                         self._columns)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the stores are read, never consumed."""
