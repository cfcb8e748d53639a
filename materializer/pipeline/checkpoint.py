"""What a streaming query's checkpoint says about itself.

Spark writes ``offsets/<batch_id>`` (the write-ahead log of each batch's end
offsets) and ``metadata`` (the query id) before a batch runs, so both are there
when ``foreachBatch`` is called. Files are read through Hadoop's FileSystem, so
any checkpoint location Spark accepts works.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from materializer.recovery.checkpoint_files import parse_offsets_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Checkpoint:
    """Read-only view of one query's checkpoint folder."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self._spark = spark
        self.location = location.rstrip("/")

    def _read(self, relative: str) -> str:
        jvm = self._spark.sparkContext._jvm
        if jvm is None:
            raise RuntimeError("the Spark session is stopped")
        path = jvm.org.apache.hadoop.fs.Path(f"{self.location}/{relative}")
        fs = path.getFileSystem(self._spark.sparkContext._jsc.hadoopConfiguration())
        stream = fs.open(path)
        try:
            return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def query_id(self) -> str:
        """The streaming query's id: stable across restarts, new with a new checkpoint."""
        return str(orjson.loads(self._read("metadata"))["id"])

    def end_offsets(self, batch_id: int) -> dict[str, dict[int, int]]:
        """Per topic and partition, the next offset after ``batch_id`` (exclusive end)."""
        return parse_offsets_log(self._read(f"offsets/{batch_id}"))
