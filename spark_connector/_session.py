"""Registering the source, and a local Spark session that works out of the box."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from ._source import KettenDataSource, KettenPushdownDataSource

__all__ = ["local_session", "register"]


_PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> None:
    """Make ``format("ketten")`` and ``USING ketten`` available in ``spark``.

    Filters on ``criterion``, ``name``, ``author``, ``seq`` and ``time`` are pushed
    into the source when ``spark.sql.python.filterPushdown.enabled`` is true at registration
    (Spark rejects pushdown-capable Python readers otherwise; :func:`local_session`
    sets it); a filter on ``name`` can only be answered that way, since stored
    events carry only keys. Register again after changing that setting.

    Spark 4.0 to 4.3 keep the plan of a scan that pushed filters on the
    DataFrame ``load()`` returned and reuse it for a later query of that same
    DataFrame that pushes none: ``df.where("seq < 5").count()`` followed by
    ``df.count()`` counts 5 rows. Call ``load()`` again for such a query.
    """
    enabled = str(spark.conf.get(_PUSHDOWN, "false")).strip().lower() == "true"
    spark.dataSource.register(KettenPushdownDataSource if enabled else KettenDataSource)


def local_session(
    app_name: str = "ketten",
    *,
    cores: int = 2,
    config: Mapping[str, str] | None = None,
) -> SparkSession:
    """A ``local[cores]`` Spark session with the ``ketten`` source registered.

    Spark's Python workers run this interpreter (``PYSPARK_PYTHON`` and
    ``spark.pyspark.python`` are set to :data:`sys.executable`), so they
    import the same ``ketten`` and ``pyarrow``. Filter pushdown to Python
    sources is switched on, the UI off, the session time zone is UTC and
    shuffles use ``2 * cores`` partitions; ``config`` overrides any of these.
    An already running session is reused (Spark allows one per process).
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    settings = {
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        _PUSHDOWN: "true",
        "spark.sql.shuffle.partitions": str(2 * cores),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    settings.update(config or {})
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
