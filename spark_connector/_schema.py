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

__all__ = ["NAME_FIELD", "arrow_schema", "spark_schema"]

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


def arrow_schema(*, orphans: bool) -> pa.Schema:
    """The Arrow schema of the decoded batches (UTC timestamps): :func:`spark_schema`
    without ``name``, which the source inserts as column 1 (:data:`NAME_FIELD`)."""
    return pa.schema([*_ARROW, _ARROW_ORPHAN] if orphans else _ARROW)
