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

Two engines run the same MERGE (``delta.merge_engine``). ``delta_rs`` collects the
batch's changes (at most ``delta.max_changes_per_batch``) to the driver as Arrow, keeps
each key's last one there and merges them: the table's rewrite is Rust's work in this
process, not a Spark job on the cores the fold needs. It writes the same transaction
action as Spark (``txn`` with the batch's app id and id) and checks the table's last one
before it merges, so a replay is skipped whichever engine wrote the first attempt: the
table has one writer, the map's Delta query, so nothing can commit between the check and
the MERGE. ``spark`` runs it as a Spark job, for batches the driver cannot hold.

With ``delta_rs`` delta-rs also creates the table and adds its columns, where the
entity's types map one to one (``_rs_schema``): Spark's ``CREATE`` is the first
Delta code a run's JVM executes, seconds of a cold JVM's CPU beside the fold's first
batch, where delta-rs takes a small fraction of that
(docs/decisions/0020-delta-table-created-by-delta-rs.md). Either way the table is the
same to its readers: the same schema as Spark reads it, the same protocol, the table
properties the session gives new tables (``tests/integration/test_delta_engines.py``).
A type delta-rs would write otherwise (a ``TIMESTAMP_NTZ``, whose table feature it
lists without ``invariants``, which the NOT NULL ``_key`` needs; a variant, a
collated string, field metadata, a name Delta refuses) leaves the DDL with Spark.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from materializer import record_columns as c
from materializer.batch import Batch, Sink
from materializer.contract.table_layout import COMMENT, AddedColumn
from materializer.errors import MaterializerError
from materializer.record_columns import quote

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructField, StructType

_Taken = tuple[str, str, str | None]
"""A column of a MERGE's source: its name, the batch's column it comes from, and the
entity's field it is (None: the column itself)."""

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


class TableColumnError(MaterializerError):
    """An entity field whose name the map's Delta table uses for a column of its own."""


class DeltaSink(Sink):
    """MERGE of each batch into a table keyed by ``_key``.

    ``updated_at``: the rows carry ``_updated_at``, and each batch's rows a
    ``__timestamp`` column to set it from (``ttl.delta``). ``location``: the table's URI
    and storage options for delta-rs (``clients.object_store.delta_rs_location``);
    ``path`` itself when it is a local folder. ``user_metadata``: the ``userMetadata``
    of a batch's MERGE commit, asked just before it (``delta.marks.SourceOffsets``); both
    engines record it as the commit's ``commitInfo.userMetadata``. ``mark_only``: that of
    a commit of an empty batch, when it has a newer mark to record (None: nothing to
    commit), which delta-rs commits as an append of no rows.
    """

    name = "delta"

    def __init__(
        self,
        path: str,
        *,
        updated_at: bool = False,
        engine: Literal["delta_rs", "spark"] = "delta_rs",
        location: tuple[str, dict[str, str] | None] | None = None,
        user_metadata: Callable[[int], str | None] | None = None,
        mark_only: Callable[[int], str | None] | None = None,
    ) -> None:
        self.path = path
        self._mark_only = mark_only
        self.updated_at = updated_at
        self.engine = engine
        self.location = location or (path, None)
        self._user_metadata = user_metadata
        self._columns: set[str] | None = None
        self._rows_out: int | None = None

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
            rs_schema = self._rs_schema(schema)
            if rs_schema is not None:
                self._columns = self._create_rs(spark, rs_schema)
            else:
                table = DeltaTable.createIfNotExists(spark).location(self.path).addColumns(schema)
                table.execute()
                self._columns = set(DeltaTable.forPath(spark, self.path).toDF().columns)
        missing = [f for f in [*own[1:], *entity.fields] if f.name not in self._columns]
        if missing:
            self._add_columns(spark, StructType(missing))
            self._columns.update(f.name for f in missing)

    def _add_columns(self, spark: SparkSession, missing: StructType) -> None:
        """ADD COLUMNS, each column's comment saying which commit added it and when (the
        map's sink is the table's one writer, so that commit is the next version)."""
        from delta.tables import DeltaTable
        from deltalake import DeltaTable as RsTable
        from deltalake import Field, Schema

        uri, options = self.location
        rs_missing = self._rs_schema(missing)
        if rs_missing is not None:
            table = RsTable(uri, storage_options=options)
            note = {COMMENT: AddedColumn.now(table.version() + 1).comment()}
            fields = [
                Field(f.name, f.type, nullable=f.nullable, metadata=note)
                for f in Schema.from_arrow(rs_missing).fields
            ]
            table.alter.add_columns(fields)
            return
        (last,) = DeltaTable.forPath(spark, self.path).history(1).select("version").collect()
        comment = AddedColumn.now(int(last[0]) + 1).comment()
        columns = ", ".join(
            f"{quote(f.name)} {f.dataType.simpleString()} COMMENT '{comment}'" for f in missing
        )
        spark.sql(f"ALTER TABLE delta.{quote(self.path)} ADD COLUMNS ({columns})")

    def _rs_schema(self, schema: StructType) -> pa.Schema | None:
        """The Arrow schema delta-rs makes the table's DDL from, or None: Spark makes it
        (the ``spark`` engine, or a type delta-rs would write otherwise)."""
        if self.engine != "delta_rs" or not all(_same_in_delta_rs(f) for f in schema.fields):
            return None
        from pyspark.sql.pandas.types import to_arrow_schema

        # The zone only names UTC instants, as Spark's TIMESTAMP columns hold them.
        return to_arrow_schema(schema, timezone="UTC")

    def _create_rs(self, spark: SparkSession, schema: pa.Schema) -> set[str]:
        """Create the table with delta-rs unless it exists; its columns. New tables get the
        properties the session sets for them (``...delta.properties.defaults.*``), as
        Spark's ``CREATE`` gives them."""
        from deltalake import DeltaTable as RsTable

        defaults = "spark.databricks.delta.properties.defaults."
        properties = {
            "delta." + key[len(defaults) :]: value
            for key, value in spark.conf.getAll.items()
            if key.startswith(defaults)
        }
        uri, options = self.location
        table = RsTable.create(
            uri, schema, mode="ignore", configuration=properties, storage_options=options
        )
        return {f.name for f in table.schema().fields}

    def rows_out(self) -> int | None:
        """The last batch's rows, which delta-rs's MERGE counts as it collects them."""
        return self._rows_out

    def write(self, batch: Batch) -> None:
        """MERGE the batch; a replayed (app id, batch id) commits nothing."""
        self._rows_out = None
        spark = batch.rows.sparkSession
        entity = batch.rows.schema[c.ENTITY].dataType
        self.ensure_table(spark, entity)  # type: ignore[arg-type]
        if batch.count == 0:
            self._commit_mark(batch)  # a MERGE of nothing would still read the whole table
            return
        fields = [f.name for f in entity.fields]  # type: ignore[attr-defined]
        own = [f.name for f in self._own_columns()]
        # The MERGE's source: each column, the batch's column it is, and its entity field.
        taken: list[_Taken] = [
            (c.TABLE_KEY, c.KEY, None),
            *([(c.TABLE_UPDATED_AT, c.TIMESTAMP, None)] if self.updated_at else []),
            (c.DELETED, c.DELETED, None),
            *[(f, c.ENTITY, f) for f in fields],
            *[(n, n, None) for n in (c.PARTITION, c.OFFSET) if n in batch.rows.columns],
        ]
        rows = batch.rows
        source = rows.select(
            *[
                (rows[column] if field is None else rows[column].getField(field)).alias(name)
                for name, column, field in taken
            ]
        )
        written = [*own, *fields]
        # A column this batch's entities lack (an older field) is cleared, not kept.
        cleared = sorted((self._columns or set()) - set(written))
        if self.engine == "spark":
            if c.PARTITION in source.columns:
                raise ValueError("Spark's MERGE takes one row per key, not changes")
            self._merge_spark(source, batch, written, cleared)
        else:
            self._merge_delta_rs(source, taken, batch, written, cleared)

    def _merge_spark(
        self, source: DataFrame, batch: Batch, written: list[str], cleared: list[str]
    ) -> None:
        from delta.tables import DeltaTable

        spark = source.sparkSession
        assignments: dict[str, str | Column] = {
            **{quote(n): f"s.{quote(n)}" for n in written},
            **{quote(n): "NULL" for n in cleared},
        }
        metadata = self._metadata(batch)
        spark.conf.set(TXN_APP_ID, batch.app_id)
        spark.conf.set(TXN_VERSION, str(batch.batch_id))
        if metadata is not None:
            spark.conf.set(USER_METADATA, metadata)
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
            spark.conf.unset(USER_METADATA)

    def _merge_delta_rs(
        self,
        source: DataFrame,
        taken: list[_Taken],
        batch: Batch,
        written: list[str],
        cleared: list[str],
    ) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction

        uri, options = self.location
        table = DeltaTable(uri, storage_options=options)
        done = table.transaction_version(batch.app_id)
        if done is not None and done >= batch.batch_id:
            return
        rows = _last_per_key(_arrow_source(source, taken, batch.collected))
        self._rows_out = rows.num_rows
        if rows.num_rows == 0:
            self._commit_mark(batch)
            return
        assignments = {
            **{_sql_name(n): f"s.{_sql_name(n)}" for n in written},
            **{_sql_name(n): "NULL" for n in cleared},
        }
        deleted = f"s.{_sql_name(c.DELETED)}"
        metadata = self._metadata(batch)
        (
            table.merge(
                rows,
                predicate=f"t.{_sql_name(c.TABLE_KEY)} = s.{_sql_name(c.TABLE_KEY)}",
                source_alias="s",
                target_alias="t",
                commit_properties=CommitProperties(
                    # delta-rs writes this key of its custom metadata as commitInfo's own
                    # userMetadata, where Spark's DESCRIBE HISTORY reads it.
                    custom_metadata=None if metadata is None else {"userMetadata": metadata},
                    app_transactions=[Transaction(batch.app_id, batch.batch_id)],
                ),
            )
            .when_matched_delete(predicate=deleted)
            .when_matched_update(updates=assignments, predicate=f"NOT {deleted}")
            .when_not_matched_insert(updates=assignments, predicate=f"NOT {deleted}")
            .execute()
        )

    def _commit_mark(self, batch: Batch) -> None:
        """Commit an empty batch's newer mark, if it has one: an append of no rows, with
        the batch's app transaction (a replay commits nothing)."""
        if self._mark_only is None or self.engine != "delta_rs":
            return
        import pyarrow as pa
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        uri, options = self.location
        table = DeltaTable(uri, storage_options=options)
        done = table.transaction_version(batch.app_id)
        if done is not None and done >= batch.batch_id:
            return
        metadata = self._mark_only(batch.batch_id)
        if metadata is None:
            return
        write_deltalake(
            table,
            pa.schema(table.schema().to_arrow()).empty_table(),
            mode="append",
            commit_properties=CommitProperties(
                custom_metadata={"userMetadata": metadata},
                app_transactions=[Transaction(batch.app_id, batch.batch_id)],
            ),
        )

    def _metadata(self, batch: Batch) -> str | None:
        return None if self._user_metadata is None else self._user_metadata(batch.batch_id)


def _arrow_source(source: DataFrame, taken: list[_Taken], collected: pa.Table | None) -> pa.Table:
    """The MERGE's source rows in Arrow: collected by a job of their own, or the same columns
    (``taken``, as ``source`` selects them) from the batch's rows already collected
    (``Batch.collected``): an entity field is the entity struct's child, its nulls and all."""
    if collected is None:
        return source.toArrow()
    import pyarrow as pa

    entity = collected[c.ENTITY]
    fields = dict(zip([f.name for f in entity.type], entity.flatten(), strict=True))
    columns = [collected[column] if f is None else fields[f] for _, column, f in taken]
    return pa.Table.from_arrays(columns, names=[name for name, _, _ in taken])


def _last_per_key(rows: pa.Table) -> pa.Table:
    """The last change of each key by (partition, offset), when the rows are changelog
    records (a key's changes share its partition); rows without them are one per key.
    In Arrow, on the driver: a Spark shuffle for this costs the query a stage a batch."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if c.PARTITION not in rows.column_names:
        return rows
    ordered = rows.sort_by(
        [(c.TABLE_KEY, "ascending"), (c.PARTITION, "ascending"), (c.OFFSET, "ascending")]
    )
    keys = ordered[c.TABLE_KEY]
    count = ordered.num_rows
    # A row is its key's last when the next row has another key (the last row always is).
    last = pc.not_equal(keys.slice(0, max(count - 1, 0)), keys.slice(1))
    mask = pa.chunked_array(
        [*last.chunks, pa.array([True] if count else [], pa.bool_())], pa.bool_()
    )
    return ordered.filter(mask).drop_columns([c.PARTITION, c.OFFSET])


def _sql_name(name: str) -> str:
    """A column name as delta-rs's SQL (DataFusion) quotes it: case and dots kept."""
    return '"' + name.replace('"', '""') + '"'


def _same_in_delta_rs(field: StructField) -> bool:
    """Whether delta-rs writes this field as Spark's DDL does (see the module docstring)."""
    from pyspark.sql import types as T

    plain = {
        T.BinaryType,
        T.BooleanType,
        T.ByteType,
        T.DateType,
        T.DecimalType,
        T.DoubleType,
        T.FloatType,
        T.IntegerType,
        T.LongType,
        T.ShortType,
        T.TimestampType,
    }

    def same(dt: T.DataType) -> bool:
        if isinstance(dt, T.ArrayType):
            return same(dt.elementType)
        if isinstance(dt, T.MapType):
            return same(dt.keyType) and same(dt.valueType)
        if isinstance(dt, T.StructType):
            return all(_same_in_delta_rs(f) for f in dt.fields)
        if type(dt) is T.StringType:
            return dt.collation == "UTF8_BINARY"
        return type(dt) in plain

    # Names Delta refuses without column mapping fail with Spark's own error.
    return not field.metadata and not _NOT_IN_NAMES & set(field.name) and same(field.dataType)


_NOT_IN_NAMES = set(" ,;{}()\n\t=")
"""What a Delta column name may not hold without column mapping, which Spark checks and
delta-rs does not."""
