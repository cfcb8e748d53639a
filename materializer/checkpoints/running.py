"""What a streaming query's checkpoint says about itself.

Spark writes ``offsets/<batch_id>`` (the write-ahead log of each batch's end
offsets) and ``metadata`` (the query id) before a batch runs, so both are there
when ``foreachBatch`` is called. Files are read through Hadoop's FileSystem, so
any checkpoint location Spark accepts works.

A batch's offsets are read by several of its sinks, and each read is many py4j
round trips: the view keeps the last few batches' offsets
(docs/decisions/0014-kafka-fetch-wait-of-20-ms.md). That is safe because Spark
never rewrites a batch's entry while its query runs, and a query that starts again
(or an operator's offset reset, made with the map stopped) gets a new view.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import orjson

from materializer.checkpoints.files import parse_batch_time, parse_offsets_log

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
        self._batches: OrderedDict[int, tuple[dict[str, dict[int, int]], int]] = OrderedDict()
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

    def discard(self) -> None:
        """Delete the whole folder (if any), wherever it is: a query that must start where
        its caller says, not where the folder's last batch ended."""
        jvm = self._spark.sparkContext._jvm
        if jvm is None:
            raise RuntimeError("the Spark session is stopped")
        path = jvm.org.apache.hadoop.fs.Path(self.location)
        fs = path.getFileSystem(self._spark.sparkContext._jsc.hadoopConfiguration())
        fs.delete(path, True)

    def drop_unfinished_writes(self) -> int:
        """Delete what a stop or a crash left of a log entry Spark was writing (its temporary
        ``offsets/.<n>.<uuid>.tmp``, ``commits/...``), before the query starts on the
        folder; how many. Spark never reads them, but refuses to start a query whose first
        batch finds its offsets folder holding one (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``):
        a map stopped, or its worker killed, while its first batch was being planned."""
        jvm = self._spark.sparkContext._jvm
        if jvm is None:
            raise RuntimeError("the Spark session is stopped")
        path_class = jvm.org.apache.hadoop.fs.Path
        fs = path_class(self.location).getFileSystem(
            self._spark.sparkContext._jsc.hadoopConfiguration()
        )
        dropped = 0
        for folder in ("offsets", "commits"):
            found = fs.globStatus(path_class(f"{self.location}/{folder}/.*.tmp"))
            for status in found or []:
                if fs.delete(status.getPath(), False):
                    dropped += 1
        return dropped

    def query_id(self) -> str:
        """The streaming query's id: stable across restarts, new with a new checkpoint."""
        return str(orjson.loads(self._read("metadata"))["id"])

    def _batch(self, batch_id: int) -> tuple[dict[str, dict[int, int]], int]:
        """A batch's offsets log: its end offsets and its timestamp."""
        kept = self._batches.get(batch_id)
        if kept is None:
            text = self._read(f"offsets/{batch_id}")
            kept = self._batches[batch_id] = (parse_offsets_log(text), parse_batch_time(text))
            while len(self._batches) > KEPT_BATCHES:
                self._batches.popitem(last=False)
        return kept

    def end_offsets(self, batch_id: int) -> dict[str, dict[int, int]]:
        """Per topic and partition, the next offset after ``batch_id`` (exclusive end)."""
        offsets = self._batch(batch_id)[0]
        # A copy: a caller may change what it gets without changing what others get.
        return {topic: dict(partitions) for topic, partitions in offsets.items()}

    def batch_time_ms(self, batch_id: int) -> int:
        """The batch's timestamp, the one its ``current_timestamp()`` is, in a replay too."""
        return self._batch(batch_id)[1]
