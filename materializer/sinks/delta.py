"""The Delta table ``<root>/<map>``: one row per live key, written with MERGE.

Idempotency comes from Delta's own transaction ids: the MERGE runs with
``txnAppId`` = the batch's app id and ``txnVersion`` = its batch id, so Delta
skips a MERGE whose (app id, version) it has already committed. The settings go
on the batch DataFrame's own session, since each streaming query runs on a
cloned session.

The table's columns are ``_key`` then the entity's fields. A field that first
appears in a later batch is added to the table (ADD COLUMNS, itself idempotent)
before that batch's MERGE. A map with ``ttl.delta`` also has ``_updated_at``
after ``_key``: each change's ``__timestamp`` (its changelog record's Kafka
timestamp, when the fold wrote it), which the retention cleanup deletes by.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.errors import MaterializerError
from materializer.record_columns import quote
from materializer.sinks.base import Batch, Sink

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession
    from pyspark.sql.types import StructField, StructType

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


class TableColumnError(MaterializerError):
    """An entity field whose name the map's Delta table uses for a column of its own."""


class DeltaSink(Sink):
    """MERGE of each batch into a table keyed by ``_key``.

    ``updated_at``: the rows carry ``_updated_at``, and each batch's rows a
    ``__timestamp`` column to set it from (``ttl.delta``).
    """

    name = "delta"

    def __init__(self, path: str, *, updated_at: bool = False) -> None:
        self.path = path
        self.updated_at = updated_at
        self._columns: set[str] | None = None

    def _own_columns(self) -> list[StructField]:
        from pyspark.sql.types import StringType, StructField, TimestampType

        own = [StructField(c.TABLE_KEY, StringType(), False)]
        if self.updated_at:
            own.append(StructField(c.TABLE_UPDATED_AT, TimestampType(), True))
        return own

    def ensure_table(self, spark: SparkSession, entity: StructType) -> None:
        """Create the table, or add the columns it lacks (entity fields, ``_updated_at``)."""
        from delta.tables import DeltaTable
        from pyspark.sql.types import StructType

        own = self._own_columns()
        clash = {f.name for f in own[1:]} & set(entity.names)
        if clash:
            raise TableColumnError(
                f"Delta table {self.path}: the entity field {sorted(clash)[0]!r} has the name "
                "of a column the table keeps for itself; rename it (a rename transform)"
            )
        if self._columns is None:
            schema = StructType([*own, *entity.fields])
            table = DeltaTable.createIfNotExists(spark).location(self.path).addColumns(schema)
            table.execute()
            self._columns = set(DeltaTable.forPath(spark, self.path).toDF().columns)
        missing = [f for f in [*own[1:], *entity.fields] if f.name not in self._columns]
        if missing:
            columns = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in missing)
            spark.sql(f"ALTER TABLE delta.{quote(self.path)} ADD COLUMNS ({columns})")
            self._columns.update(f.name for f in missing)

    def write(self, batch: Batch) -> None:
        """MERGE the batch; a replayed (app id, batch id) commits nothing."""
        from delta.tables import DeltaTable

        spark = batch.rows.sparkSession
        entity = batch.rows.schema[c.ENTITY].dataType
        self.ensure_table(spark, entity)  # type: ignore[arg-type]
        if batch.count == 0:
            return  # a MERGE of nothing still reads the whole table
        fields = [f.name for f in entity.fields]  # type: ignore[attr-defined]
        own = [f.name for f in self._own_columns()]
        stamp = [batch.rows[c.TIMESTAMP].alias(c.TABLE_UPDATED_AT)] if self.updated_at else []
        source = batch.rows.select(
            batch.rows[c.KEY].alias(c.TABLE_KEY),
            *stamp,
            c.DELETED,
            *[batch.rows[c.ENTITY].getField(f).alias(f) for f in fields],
        )
        written = [*own, *fields]
        # A column this batch's entities lack (an older field) is cleared, not kept.
        known = sorted((self._columns or set()) - set(written))
        assignments: dict[str, str | Column] = {
            **{quote(n): f"s.{quote(n)}" for n in written},
            **{quote(n): "NULL" for n in known},
        }
        spark.conf.set(TXN_APP_ID, batch.app_id)
        spark.conf.set(TXN_VERSION, str(batch.batch_id))
        try:
            (
                DeltaTable.forPath(spark, self.path)
                .alias("t")
                .merge(source.alias("s"), f"t.{c.TABLE_KEY} = s.{c.TABLE_KEY}")
                .whenMatchedDelete(condition=f"s.{c.DELETED}")
                .whenMatchedUpdate(condition=f"NOT s.{c.DELETED}", set=assignments)
                .whenNotMatchedInsert(condition=f"NOT s.{c.DELETED}", values=assignments)
                .execute()
            )
        finally:
            spark.conf.unset(TXN_APP_ID)
            spark.conf.unset(TXN_VERSION)
