"""Typed entities from schemaless JSON documents, once per micro-batch, on the driver.

The fold of a schemaless JSON map emits each entity as a VARIANT document
(see ``json_inferred``). Before a batch reaches the sinks, this step infers
the documents' fields (``schema_of_variant_agg``, one pass over the batch's
cached rows), merges them with the fields the map already has and casts every
document to that struct. It runs twice per map: in the fold's projection
(Redis and the changelog then hold the typed entity's compact JSON), and in
the Delta query, which reads the changelog back as documents
(:func:`changelog_entity`) and adds a column for each field the table lacks.

Types stay stable: a field the map already has keeps its type (the Delta
table's column type, read once when the step starts), and a new field takes
the type this batch infers, normalised as JSON readers do — every integer is
LONG, every other number DOUBLE, values of mixed types in one batch STRING
(their JSON text), objects STRUCT, arrays ARRAY. A field seen only as null, an
empty array or an empty object has no type yet and is left out (null) until a
value gives it one. A value that does not fit its field's established type is
null in that field. A nested object's established struct keeps its fields: a
member that first appears inside an existing object column is not added.

The step is deterministic for a batch and the map's fields before it, so a
replayed batch types its entities exactly as the first attempt did.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.config import DOCUMENT
from materializer.encoding import entity_from_json

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

Project = Callable[["DataFrame", int], None]
"""A ``foreachBatch`` callback: the folded rows of one batch and its id."""


class VariantSchemaError(ValueError):
    """A ``schema_of_variant`` answer this parser does not know."""


class _Reader:
    """A cursor over the text of a ``schema_of_variant`` type, e.g. ``OBJECT<a: BIGINT>``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos : self.pos + 1]

    def skip_spaces(self) -> None:
        while self.peek() == " ":
            self.pos += 1

    def expect(self, token: str) -> None:
        self.skip_spaces()
        if not self.text.startswith(token, self.pos):
            raise VariantSchemaError(f"expected {token!r} at {self.pos} in {self.text!r}")
        self.pos += len(token)

    def word(self) -> str:
        self.skip_spaces()
        start = self.pos
        while self.pos < len(self.text) and (
            self.text[self.pos].isalnum() or self.text[self.pos] == "_"
        ):
            self.pos += 1
        if start == self.pos:
            raise VariantSchemaError(f"expected a word at {self.pos} in {self.text!r}")
        return self.text[start : self.pos]

    def name(self) -> str:
        """A field name: plain, or backquoted with doubled backquotes inside."""
        self.skip_spaces()
        if self.peek() != "`":
            return self.word()
        self.pos += 1
        out = []
        while True:
            end = self.text.find("`", self.pos)
            if end < 0:
                raise VariantSchemaError(f"unclosed name in {self.text!r}")
            out.append(self.text[self.pos : end])
            self.pos = end + 1
            if self.peek() != "`":
                return "".join(out)
            out.append("`")
            self.pos += 1


def parse_variant_schema(text: str) -> DataType | None:
    """A ``schema_of_variant(_agg)`` answer as the Spark type a field gets; None: no type yet."""
    reader = _Reader(text)
    dtype = _parse(reader)
    reader.skip_spaces()
    if reader.pos != len(text):
        raise VariantSchemaError(f"unexpected text at {reader.pos} in {text!r}")
    return dtype


def _parse(reader: _Reader) -> DataType | None:
    from pyspark.sql import types as T

    word = reader.word().upper()
    if word == "OBJECT":
        reader.expect("<")
        fields = []
        reader.skip_spaces()
        if reader.peek() == ">":
            reader.pos += 1
            return None
        while True:
            name = reader.name()
            reader.expect(":")
            dtype = _parse(reader)
            if dtype is not None:
                fields.append(T.StructField(name, dtype))
            reader.skip_spaces()
            if reader.peek() == ",":
                reader.pos += 1
                continue
            reader.expect(">")
            return T.StructType(fields) if fields else None
    if word == "ARRAY":
        reader.expect("<")
        item = _parse(reader)
        reader.expect(">")
        return None if item is None else T.ArrayType(item)
    if word == "DECIMAL":
        reader.expect("(")
        reader.word()
        reader.expect(",")
        reader.word()
        reader.expect(")")
        return T.DoubleType()
    simple: dict[str, DataType | None] = {
        "VOID": None,
        "NULL": None,
        "BOOLEAN": T.BooleanType(),
        "TINYINT": T.LongType(),
        "SMALLINT": T.LongType(),
        "INT": T.LongType(),
        "BIGINT": T.LongType(),
        "FLOAT": T.DoubleType(),
        "DOUBLE": T.DoubleType(),
        "STRING": T.StringType(),
        "BINARY": T.BinaryType(),
        "DATE": T.DateType(),
        "TIMESTAMP": T.TimestampType(),
        "TIMESTAMP_NTZ": T.TimestampNTZType(),
        "VARIANT": T.StringType(),
    }
    if word not in simple:
        raise VariantSchemaError(f"unknown type {word} in {reader.text!r}")
    return simple[word]


def with_new_fields(known: StructType, found: StructType) -> StructType:
    """``known`` as it is, then the fields of ``found`` it lacks, in ``found``'s order."""
    from pyspark.sql.types import StructType

    names = set(known.names)
    return StructType([*known.fields, *[f for f in found.fields if f.name not in names]])


def ddl(dtype: DataType) -> str:
    """A type as DDL that survives any field name (names backquoted)."""
    from pyspark.sql import types as T

    if isinstance(dtype, T.StructType):
        fields = ",".join(
            "`" + f.name.replace("`", "``") + "`:" + ddl(f.dataType) for f in dtype.fields
        )
        return f"struct<{fields}>"
    if isinstance(dtype, T.ArrayType):
        return f"array<{ddl(dtype.elementType)}>"
    if isinstance(dtype, T.MapType):
        return f"map<{ddl(dtype.keyType)},{ddl(dtype.valueType)}>"
    return dtype.simpleString()


def table_fields(
    spark: SparkSession, table: str, meta: Collection[str] = (c.TABLE_KEY,)
) -> StructType:
    """The entity fields of a map's Delta table (its columns but ``meta``, see
    ``materializer.contract.table_layout.table_meta``); none when it does not exist yet."""
    from delta.tables import DeltaTable
    from pyspark.sql.types import StructType

    if not DeltaTable.isDeltaTable(spark, table):
        return StructType([])
    schema = DeltaTable.forPath(spark, table).toDF().schema
    return StructType([f for f in schema.fields if f.name not in meta])


class EntityTyper:
    """Types each batch's documents against the fields the map has so far.

    Runs on the driver. ``table`` is the map's Delta table, whose columns but
    ``meta`` are the fields the map already has when the query starts.
    """

    def __init__(self, table: str, meta: Collection[str] = (c.TABLE_KEY,)) -> None:
        self._table = table
        self._meta = meta
        self._known: StructType | None = None

    def fields(self, spark: SparkSession) -> StructType:
        """The fields entities have so far."""
        if self._known is None:
            self._known = table_fields(spark, self._table, self._meta)
        return self._known

    def typed(self, rows: DataFrame) -> DataFrame:
        """The batch with ``__entity`` cast from its document to the map's fields.

        Other columns pass through; deleted rows keep a null entity.
        """
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        document = F.col(c.ENTITY).getField(DOCUMENT)
        answer = rows.where(~F.col(c.DELETED)).select(F.schema_of_variant_agg(document)).first()
        found = parse_variant_schema(answer[0]) if answer and answer[0] else None
        if not isinstance(found, StructType):
            found = StructType([])
        fields = with_new_fields(self.fields(rows.sparkSession), found)
        self._known = fields
        entity = F.try_variant_get(document, "$", ddl(fields))
        return rows.withColumn(c.ENTITY, F.when(F.col(c.DELETED), F.lit(None)).otherwise(entity))


class TypedBatches(EntityTyper):
    """A ``foreachBatch`` callback that types each batch's documents, then projects the batch."""

    def __init__(
        self, project: Project, table: str, meta: Collection[str] = (c.TABLE_KEY,)
    ) -> None:
        super().__init__(table, meta)
        self._project = project

    def __call__(self, rows: DataFrame, batch_id: int) -> None:
        """Type the batch (the fold runs once: its rows are cached) and project it."""
        rows.persist()
        try:
            self._project(self.typed(rows), batch_id)
        finally:
            rows.unpersist()


def typed_batches(
    project: Project, table: str, inferred: bool, meta: Collection[str] = (c.TABLE_KEY,)
) -> Project:
    """``project`` itself, or wrapped to type documents first when the map's JSON is schemaless.

    ``meta``: the table's columns that are not entity fields
    (``materializer.contract.table_layout.table_meta``)."""
    return TypedBatches(project, table, meta) if inferred else project


def changelog_entity(value: Column, entity: StructType, inferred: bool) -> Column:
    """A changelog record's entity: its JSON read with the fold's entity struct, or as a document.

    A schemaless JSON map's fields are only known per batch, so its changelog
    entities are read back as documents and typed by :class:`TypedBatches`
    against the Delta table, like the fold's own.
    """
    from pyspark.sql import functions as F

    if inferred:
        return F.struct(F.try_parse_json(value).alias(DOCUMENT))
    return entity_from_json(value, entity)
