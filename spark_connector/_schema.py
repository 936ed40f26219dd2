"""The columns of the ``ketten`` source, in Spark and in Arrow."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ketten.errors import UsageError

__all__ = ["HEAD_COLUMNS", "NAME_FIELD", "arrow_schema", "declared_columns", "spark_schema"]

_COLUMNS = [
    StructField("criterion", StringType(), nullable=False),
    StructField("seq", LongType(), nullable=False),
    StructField("hash", StringType(), nullable=False),
    StructField("prev", StringType(), nullable=True),
    StructField("author", StringType(), nullable=False),
    StructField("command", LongType(), nullable=True),
    StructField("clock", BinaryType(), nullable=False),
    StructField("time", TimestampType(), nullable=True),
    StructField("payload", BinaryType(), nullable=False),
    StructField("replicas", IntegerType(), nullable=False),
]
_ORPHAN = StructField("orphan", BooleanType(), nullable=False)
_NAME = StructField("name", StringType(), nullable=True)
NAME_FIELD = pa.field("name", pa.string(), nullable=True)

_ARROW = [
    pa.field("criterion", pa.string(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("hash", pa.string(), nullable=False),
    pa.field("prev", pa.string(), nullable=True),
    pa.field("author", pa.string(), nullable=False),
    pa.field("command", pa.int64(), nullable=True),
    pa.field("clock", pa.binary(), nullable=False),
    pa.field("time", pa.timestamp("us", tz="UTC"), nullable=True),
    pa.field("payload", pa.binary(), nullable=False),
    pa.field("replicas", pa.int32(), nullable=False),
]
_ARROW_ORPHAN = pa.field("orphan", pa.bool_(), nullable=False)


def spark_schema(*, orphans: bool) -> StructType:
    """The Spark schema; the ``orphan`` column exists only with ``includeOrphans``.

    ``name`` follows ``criterion``; the stored events carry only keys, so the
    source adds it (see :func:`arrow_schema`)."""
    columns = [_COLUMNS[0], _NAME, *_COLUMNS[1:]]
    return StructType([*columns, _ORPHAN] if orphans else columns)


HEAD_COLUMNS = frozenset({"criterion", "name", "seq"})
"""Columns the chains' heads alone can give: with ``verify=none`` a read of only
these reads no events (see :mod:`ketten.spark`, "Columns")."""


def declared_columns(schema: StructType, *, orphans: bool) -> pa.Schema | None:
    """The Arrow schema of the rows a schema given to the reader asks for: ``None``
    for the whole :func:`spark_schema`, else its columns in its order (column
    pruning, which Python data sources do not get from Spark's planner).

    Raises :class:`~ketten.errors.UsageError` for a column the source does not have,
    one with another type, one named twice, or one declared ``NOT NULL`` that can
    be null.
    """
    expected = spark_schema(orphans=orphans)
    if schema == expected:
        return None
    fields = {f.name: f for f in expected.fields}
    arrow = {f.name: f for f in [*arrow_schema(orphans=orphans), NAME_FIELD]}
    chosen: list[pa.Field] = []
    for field in schema.fields:
        known = fields.get(field.name)
        if known is None:
            raise UsageError(
                f"the ketten source has no column {field.name!r}; a schema given to it may "
                f"hold any of its columns: {expected.simpleString()}")
        if field.dataType != known.dataType:
            raise UsageError(
                f"column {field.name!r} of the ketten source is "
                f"{known.dataType.simpleString()}, not {field.dataType.simpleString()}")
        if known.nullable and not field.nullable:
            raise UsageError(f"column {field.name!r} of the ketten source can be null; "
                             "declare it without NOT NULL")
        if any(c.name == field.name for c in chosen):
            raise UsageError(f"column {field.name!r} is named twice in the schema")
        chosen.append(arrow[field.name].with_nullable(field.nullable))
    if not chosen:
        raise UsageError("the schema given to the ketten source has no columns")
    return pa.schema(chosen)


def arrow_schema(*, orphans: bool) -> pa.Schema:
    """The Arrow schema of the decoded batches (UTC timestamps): :func:`spark_schema`
    without ``name``, which the source inserts as column 1 (:data:`NAME_FIELD`)."""
    return pa.schema([*_ARROW, _ARROW_ORPHAN] if orphans else _ARROW)
