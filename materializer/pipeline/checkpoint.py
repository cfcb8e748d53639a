"""What a streaming query's checkpoint says about itself.

Spark writes ``offsets/<batch_id>`` (the write-ahead log of each batch's end
offsets) and ``metadata`` (the query id) before a batch runs, so both are there
when ``foreachBatch`` is called. Files are read through Hadoop's FileSystem, so
any checkpoint location Spark accepts works.

A batch's offsets are read by several of its sinks, and each read is a dozen py4j
round trips: the view keeps the last few batches' offsets. That is safe because Spark
never rewrites a batch's entry while its query runs, and a query that starts again
(or an operator's offset reset, made with the map stopped) gets a new view.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import orjson

from materializer.recovery.checkpoint_files import parse_offsets_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


KEPT_BATCHES = 4
"""Batches whose offsets a view keeps: the batch running and the one before it (its
size), with room for a replay."""


class Checkpoint:
    """Read-only view of one query's checkpoint folder."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self._spark = spark
        self.location = location.rstrip("/")
        self._offsets: OrderedDict[int, dict[str, dict[int, int]]] = OrderedDict()
        self._hadoop: tuple[Any, Any, Any] | None = None

    def _read(self, relative: str) -> str:
        jvm = self._spark.sparkContext._jvm
        if jvm is None:
            raise RuntimeError("the Spark session is stopped")
        if self._hadoop is None:
            # Each name looked up through the gateway is a round trip: look them up once.
            path_class = jvm.org.apache.hadoop.fs.Path
            fs = path_class(self.location).getFileSystem(
                self._spark.sparkContext._jsc.hadoopConfiguration()
            )
            self._hadoop = (path_class, fs, jvm.org.apache.commons.io.IOUtils)
        path_class, fs, io_utils = self._hadoop
        stream = fs.open(path_class(f"{self.location}/{relative}"))
        try:
            return str(io_utils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def query_id(self) -> str:
        """The streaming query's id: stable across restarts, new with a new checkpoint."""
        return str(orjson.loads(self._read("metadata"))["id"])

    def end_offsets(self, batch_id: int) -> dict[str, dict[int, int]]:
        """Per topic and partition, the next offset after ``batch_id`` (exclusive end)."""
        offsets = self._offsets.get(batch_id)
        if offsets is None:
            offsets = parse_offsets_log(self._read(f"offsets/{batch_id}"))
            self._offsets[batch_id] = offsets
            while len(self._offsets) > KEPT_BATCHES:
                self._offsets.popitem(last=False)
        # A copy: a caller may change what it gets without changing what others get.
        return {topic: dict(partitions) for topic, partitions in offsets.items()}
