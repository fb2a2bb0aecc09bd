"""liftlog streams as a Spark data source (format ``liftlog``): batch and Structured Streaming, read and write.

``liftlog.spark.register(spark)`` makes ``spark.read.format("liftlog")`` (and
``readStream``, ``write``, ``writeStream``) available. The source itself
(:mod:`.source`) needs the ``spark`` extra; ``options`` (checked at planning)
and ``offsets`` (offset ranges, their JSON form, admission control) are plain
Python, and importing this package does not import pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["local_session", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``liftlog`` data source with a SparkSession (needs ``pip install 'liftlog[spark]'``)."""
    from .source import register as _register

    _register(spark)


def local_session(app_name: str = "liftlog", *, cores: int = 2, conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession on this machine with the source registered: workers run this Python (where liftlog is
    installed), the driver binds to 127.0.0.1, the UI is off. For trying things, tests and benchmarks."""
    from .source import local_session as _local_session

    return _local_session(app_name, cores=cores, conf=conf)
