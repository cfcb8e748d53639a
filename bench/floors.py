"""Spark's own floors for a map's events: minimal queries over the same topic, with no
Materializer code in them, that a fold's rate is divided by (``pipeline.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import SCHEMA

from materializer import record_columns as c

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
"""The state store a streaming aggregation floor keeps its state in, with changelog
checkpointing: Spark's fastest stateful fold, the one a state-store design would run."""


def source(spark: Any, bootstrap: str, topic: str, streaming: bool) -> Any:
    """The topic's JSON values parsed with the events' schema, with partition and offset."""
    from pyspark.sql import functions as F

    reader = spark.readStream if streaming else spark.read
    raw = (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    return raw.select(
        F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"),
        F.col("partition").alias(c.PARTITION),
        F.col("offset").alias(c.OFFSET),
    ).select("e.*", c.PARTITION, c.OFFSET)


def aggregated(records: Any) -> Any:
    """Each id's last event by (partition, offset): ``latest`` as one Spark aggregation."""
    from pyspark.sql import functions as F

    entity = F.struct(*[F.col(n) for n in records.columns if not n.startswith("__")])
    last = F.max_by(entity, F.struct(F.col(c.PARTITION), F.col(c.OFFSET)))
    return records.groupBy("id").agg(last.alias("e"))


def count_batch(counts: list[int], rows: Any, _batch_id: int) -> None:
    """A ``foreachBatch`` step that only counts its rows."""
    counts.append(rows.count())


def use_rocksdb(spark: Any) -> None:
    """Stateful floors keep their state in RocksDB, changelog checkpointing on."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")


def run_stream(
    frame: Any, work: Path, name: str, step: Callable[[Any, int], None], *, output_mode: str
) -> float:
    """Seconds for a streaming query over ``frame`` to take everything available."""
    writer = (
        frame.writeStream.queryName(name)
        .outputMode(output_mode)
        .option("checkpointLocation", str(work / "ck" / name))
        .foreachBatch(step)
    )
    started = time.perf_counter()
    writer.trigger(availableNow=True).start().awaitTermination()
    return time.perf_counter() - started
