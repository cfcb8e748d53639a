"""The changelog topic ``<map>.changelog``: every batch's entity changes, keyed by entity.

The fold writes each batch here right after Redis, and the map's Delta table
is fed from this topic by a query of its own (see ``pipeline.job``), so the
slow Delta MERGE never holds back the next batch's Redis writes. The topic is
compacted, and it doubles as a change-data-capture stream for other consumers:
the key is the entity key, the value the entity's compact JSON (as in Redis),
null for a delete, and headers carry the batch id and app id.

Replays: a batch written again after a crash repeats the same records (the
fold is deterministic for the same offsets and state), right after the first
copy and before any later batch. Readers keep the last record per key, so the
copy changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from materializer.pipeline import columns as c
from materializer.sinks.base import Batch, Sink
from materializer.sinks.encoding import entity_json

BATCH_HEADER = "x-batch-id"
APP_HEADER = "x-app-id"


class ChangelogSink(Sink):
    """Each batch's rows to the changelog topic through Spark's ``kafka`` writer."""

    name = "changelog"

    def __init__(self, topic: str, producer: Mapping[str, str]) -> None:
        self.topic = topic
        self.producer = dict(producer)

    def write(self, batch: Batch) -> None:
        """One record per row: key, entity JSON (null when deleted), batch headers."""
        from pyspark.sql import functions as F

        rows = batch.rows
        headers = F.array(
            *[
                F.struct(F.lit(name).alias("key"), F.lit(value).cast("binary").alias("value"))
                for name, value in ((BATCH_HEADER, str(batch.batch_id)), (APP_HEADER, batch.app_id))
            ]
        )
        records = rows.select(
            rows[c.KEY].alias("key"),
            F.when(rows[c.DELETED], F.lit(None))
            .otherwise(entity_json(rows[c.ENTITY]))
            .alias("value"),
            headers.alias("headers"),
        )
        writer = records.write.format("kafka").option("topic", self.topic)
        for key, value in self.producer.items():
            writer = writer.option(f"kafka.{key}", value)
        writer.save()
