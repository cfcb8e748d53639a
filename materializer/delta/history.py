"""The history of a map folded in Redis (``<map>__events``): a sink of the batch's records.

It runs in the map's fold query, beside the fold, on the records the batch
already read and decoded (``Batch.records``), so no second query reads and
decodes the source again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.batch import Batch, Sink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


HISTORY_META = {
    c.KEY: "_key",
    c.DELETED: "_deleted",
    c.TOPIC: "_topic",
    c.PARTITION: "_partition",
    c.OFFSET: "_offset",
    c.TIMESTAMP: "_timestamp",
}
"""The history table's columns for each folded event's bookkeeping, before its fields."""


def history_events(records: DataFrame) -> DataFrame:
    """Every folded event as a row of ``<map>__events``."""
    from pyspark.sql import functions as F

    return records.select(
        *[F.col(n).alias(alias) for n, alias in HISTORY_META.items()],
        *[F.col(c.quote(n)) for n in c.entity_fields(records.columns)],
    )


class HistorySink(Sink):
    """Every folded event appended to ``<map>__events``, once per batch.

    Delta's ``txnAppId`` / ``txnVersion`` make the append idempotent: a replayed
    batch (same app id, same batch id) is skipped by the table itself.
    """

    name = "history"

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, batch: Batch) -> None:
        """Append the batch's good records."""
        if batch.records is None:
            raise ValueError("the history sink needs the batch's records (a map folded in Redis)")
        (
            history_events(_folding(batch.records))
            .write.format("delta")
            .mode("append")
            .option("mergeSchema", "true")
            .option("txnAppId", f"{batch.app_id}:history")
            .option("txnVersion", batch.batch_id)
            .save(self.path)
        )


def _folding(records: DataFrame) -> DataFrame:
    """The records that fold (decoded, or tombstones, with a key): the history keeps those;
    the others are the dead letters'."""
    from pyspark.sql import functions as F

    return records.where(F.col(c.ERROR_STAGE).isNull())
