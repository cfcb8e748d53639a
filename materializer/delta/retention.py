"""Delta retention of a map with ``ttl.delta``: rows not updated for a while are deleted.

A step of the Delta query's own ``foreachBatch``, after the batch's MERGE, so
it never races a MERGE of the same table. It runs at the first batch after
start, then at the first batch once ``cleanup_interval`` has passed: a map
whose changelog stays quiet runs no batch, and so no cleanup, until its next
change.

Each cleanup deletes the rows whose ``_updated_at`` is older than now minus
``ttl.delta``, then VACUUMs the files no version younger than
``vacuum_retention`` still needs (the time-travel window shrinks to it). Both
are final-state by time, so a cleanup run again after a crash deletes nothing
twice. A row from before ``ttl.delta`` was set has no ``_updated_at``; the first
cleanup after start stamps it with the current time, so it is kept a full
period rather than deleted at once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from materializer.batch import Batch, Sink
from materializer.contract.table_layout import TABLE_UPDATED_AT
from materializer.record_columns import quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
"""Delta refuses a VACUUM retention under 168 hours unless this is false."""
SAFE_VACUUM_RETENTION = timedelta(hours=168)
LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
"""How many tasks VACUUM lists and compares the table's files with."""


@dataclass(frozen=True)
class Cleanup:
    """What one cleanup did: rows stamped (no ``_updated_at`` yet), rows deleted, vacuumed."""

    stamped: int
    deleted: int
    vacuumed: bool


class Retention(Sink):
    """Deletes a table's rows not updated for ``ttl``, then VACUUMs; at most once per interval.

    Runs on the driver, after the sink that MERGEs the batch.
    """

    name = "retention"

    def __init__(
        self,
        path: str,
        *,
        ttl: timedelta,
        interval: timedelta,
        vacuum_retention: timedelta | None,
    ) -> None:
        self.path = path
        self.ttl = ttl
        self.interval = interval
        self.vacuum_retention = vacuum_retention
        self._last: float | None = None

    def due(self) -> bool:
        """Whether a cleanup runs with this batch: the first one, then once per interval."""
        return self._last is None or time.monotonic() - self._last >= self.interval.total_seconds()

    def write(self, batch: Batch) -> None:
        """Clean up if due; the batch's rows themselves play no part."""
        if not self.due():
            return
        first = self._last is None
        self._last = time.monotonic()
        self.cleanup(batch.rows.sparkSession, stamp=first)

    def cleanup(self, spark: SparkSession, *, stamp: bool = False) -> Cleanup:
        """DELETE the rows older than ``ttl`` (after stamping rows without a time, with
        ``stamp``), then VACUUM with ``vacuum_retention`` unless it is None."""
        # SQL rather than DeltaTable.delete/update: its answer counts the rows. Only quoted
        # identifiers and an integer go into it.
        table = f"delta.{quote(self.path)}"
        column = quote(TABLE_UPDATED_AT)
        stamped = 0
        if stamp:
            now = "current_timestamp()"
            stamp_sql = f"UPDATE {table} SET {column} = {now} WHERE {column} IS NULL"  # noqa: S608
            stamped = _affected(spark.sql(stamp_sql))
        cutoff = datetime.now(UTC) - self.ttl
        micros = (cutoff - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        delete_sql = f"DELETE FROM {table} WHERE {column} < timestamp_micros({micros})"  # noqa: S608
        deleted = _affected(spark.sql(delete_sql))
        if self.vacuum_retention is not None:
            self._vacuum(spark, self.vacuum_retention)
        log.info(
            "retention table=%s deleted=%d updated_before=%s stamped=%d vacuum_retention=%s",
            self.path,
            deleted,
            cutoff.isoformat(timespec="seconds"),
            stamped,
            self.vacuum_retention,
        )
        return Cleanup(stamped, deleted, self.vacuum_retention is not None)

    def _vacuum(self, spark: SparkSession, retention: timedelta) -> None:
        """VACUUM, with settings for this call only: a retention under Delta's safety check
        lifts the check, and the file listing runs as many tasks as a batch's shuffle (Spark's
        default of 10,000 makes a small table's VACUUM take far longer than its files need)
        unless the Spark configuration chose a parallelism itself."""
        from delta.tables import DeltaTable

        settings: dict[str, str] = {}
        if retention < SAFE_VACUUM_RETENTION:
            settings[RETENTION_CHECK] = "false"
        if not spark.sparkContext.getConf().contains(LISTING_PARALLELISM):
            settings[LISTING_PARALLELISM] = spark.conf.get("spark.sql.shuffle.partitions") or "8"
        before = {key: spark.conf.get(key, None) for key in settings}
        for key, value in settings.items():
            spark.conf.set(key, value)
        try:
            DeltaTable.forPath(spark, self.path).vacuum(retention / timedelta(hours=1))
        finally:
            for key, previous in before.items():
                if previous is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, previous)


def _affected(result: DataFrame) -> int:
    """``num_affected_rows`` of a DELETE or UPDATE's answer (0 when it reports none)."""
    row = result.first()
    return int(row[0]) if row is not None and row[0] is not None else 0
