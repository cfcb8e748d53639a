"""The Delta table ``<root>/<map>``: one row per live key, written with MERGE.

Idempotency comes from Delta's own transaction ids: the MERGE runs with
``txnAppId`` = the batch's app id and ``txnVersion`` = its batch id, so Delta
skips a MERGE whose (app id, version) it has already committed. The settings go
on the batch DataFrame's own session, since each streaming query runs on a
cloned session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.pipeline import columns as c
from materializer.sinks.base import Batch, Sink

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession
    from pyspark.sql.types import StructType

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class DeltaSink(Sink):
    """MERGE of each batch into a table keyed by ``_key``, with the entity's fields as columns."""

    def __init__(self, path: str, entity_schema: StructType) -> None:
        self.path = path
        self.entity_schema = entity_schema
        self._created = False

    def table_schema(self) -> StructType:
        """``_key`` first, then the entity's fields."""
        from pyspark.sql.types import StringType, StructField, StructType

        return StructType([StructField(c.KEY, StringType(), False), *self.entity_schema.fields])

    def ensure_table(self, spark: SparkSession) -> None:
        """Create the table on first use, so readers find it even before data arrives."""
        from delta.tables import DeltaTable

        if self._created:
            return
        DeltaTable.createIfNotExists(spark).location(self.path).addColumns(
            self.table_schema()
        ).execute()
        self._created = True

    def write(self, batch: Batch) -> None:
        """MERGE the batch; a replayed (app id, batch id) commits nothing."""
        from delta.tables import DeltaTable

        spark = batch.rows.sparkSession
        self.ensure_table(spark)
        fields = [f.name for f in self.entity_schema.fields]
        source = batch.rows.select(c.KEY, c.DELETED, *[f"{c.ENTITY}.{_quote(f)}" for f in fields])
        assignments: dict[str, str | Column] = {
            _quote(n): f"s.{_quote(n)}" for n in [c.KEY, *fields]
        }
        spark.conf.set(TXN_APP_ID, batch.app_id)
        spark.conf.set(TXN_VERSION, str(batch.batch_id))
        try:
            (
                DeltaTable.forPath(spark, self.path)
                .alias("t")
                .merge(source.alias("s"), f"t.{c.KEY} = s.{c.KEY}")
                .whenMatchedDelete(condition=f"s.{c.DELETED}")
                .whenMatchedUpdate(condition=f"NOT s.{c.DELETED}", set=assignments)
                .whenNotMatchedInsert(condition=f"NOT s.{c.DELETED}", values=assignments)
                .execute()
            )
        finally:
            spark.conf.unset(TXN_APP_ID)
            spark.conf.unset(TXN_VERSION)
