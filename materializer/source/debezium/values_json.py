"""Debezium's JSON change events, parsed in the JVM into the row's declared columns.

One ``from_json`` reads both shapes Kafka Connect's JSON converter writes: with
``schemas.enable`` (its default) the envelope is the ``payload`` beside a ``schema``,
whose fields name each column's encoding; without it the envelope is the value itself.
Only the wrapper's field names and parameters are kept from its schema, read where a
column needs them (``types``). What the envelope means is ``envelope``'s; this module
gives each record the row as its fields (``after``, or ``before`` for a delete, whose
``after`` is null) and the envelope's own columns (``record_columns.OP`` and the rest).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.errors import ConfigError
from materializer.source.debezium.ops import DELETE, OPS, UPSERTS, unknown_op, without_after
from materializer.source.debezium.types import ENCODING, UNAVAILABLE_VALUE, WireField, read
from materializer.source.formats.json import CORRUPT, json_text
from materializer.source.formats.parsed import PARSED
from materializer.source.record_errors import with_error, without_errors

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

STAGE = "decode"
WRAPPER_SCHEMA = f"struct<fields: array<struct<field: string, fields: array<{ENCODING}>>>>"
"""What is kept of the wrapper's ``schema``: per envelope field, its fields' encodings."""


def _parse_schema(row: StructType) -> StructType:
    from pyspark.sql import types as T

    wire_row = T.StructType(
        [T.StructField(f.name, WireField(f.name, f.dataType).wire) for f in row.fields]
    )
    envelope = [
        T.StructField("before", wire_row),
        T.StructField("after", wire_row),
        T.StructField("op", T.StringType()),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("source", T.StructType([T.StructField("ts_ms", T.LongType())])),
    ]
    wrapper = T._parse_datatype_string(WRAPPER_SCHEMA)
    return T.StructType(
        [
            T.StructField("schema", wrapper),
            T.StructField("payload", T.StructType(envelope)),
            *envelope,
            T.StructField(CORRUPT, T.StringType()),
        ]
    )


def _envelope(name: str) -> Column:
    """The envelope's field ``name``, from the payload when the value has the wrapper."""
    from pyspark.sql import functions as F

    parsed = F.col(PARSED)
    return F.coalesce(parsed.getField("payload").getField(name), parsed.getField(name))


def decode_debezium_json(raw: DataFrame, row: StructType, wire_format: bool = False) -> DataFrame:
    """Raw records plus the row's fields (declared ``row``), the envelope's columns and the
    error columns; a value that is not such an envelope is a decode error.

    In three projections: the JSON parsed; the envelope's parts and each field's text as
    sent; the fields read into their types. Each part is an expression of its own then,
    not one copied into every expression that reads it: the plan stays small enough to
    plan for every micro-batch."""
    from pyspark.sql import functions as F

    clash = [f.name for f in row.fields if c.is_internal(f.name)]
    if clash:
        raise ConfigError("", [f"source.schema: fields {', '.join(clash)} start with {c.PREFIX!r}"])
    fields = [WireField(f.name, f.dataType) for f in row.fields]
    df, text = json_text(without_errors(raw), wire_format)
    parsed = F.from_json(
        text.cast("string"),
        _parse_schema(row),
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
    )
    df = df.withColumn(PARSED, parsed)
    op = _envelope("op")
    unparsed = F.col(PARSED).isNull() | F.col(PARSED).getField(CORRUPT).isNotNull()
    problem = (
        F.when(
            unparsed,
            F.lit("value is not Debezium's change event as JSON with the declared row (schema)"),
        )
        .when(op.isNull(), F.lit("value is not Debezium's change event: no op"))
        .when(~op.isin(*OPS), _message(unknown_op, op))
        .when(op.isin(*UPSERTS) & _envelope("after").isNull(), _message(without_after, op))
    )
    wrapper = F.col(PARSED).getField("schema").getField("fields")
    df = df.withColumn(ENCODINGS, _named(wrapper, "after").getField("fields"))
    encodings = F.col(ENCODINGS)
    before, after = _envelope("before"), _envelope("after")
    sent = {
        _sent(n): F.when(op == DELETE, before.getField(f.name)).otherwise(after.getField(f.name))
        for n, f in enumerate(fields)
    }
    sent |= {_encoding(n): _named(encodings, f.name) for n, f in enumerate(fields) if f.converted}
    df = df.select(
        *[F.col(c.quote(n)) for n in df.columns if n not in (PARSED, ENCODINGS)],
        *[v.alias(k) for k, v in sent.items()],
        F.when(F.col(c.VALUE).isNotNull(), problem).alias(PROBLEM),
        op.alias(c.OP),
        before.alias(c.BEFORE),
        _envelope("ts_ms").alias(c.TS_MS),
        _envelope("source").getField("ts_ms").alias(c.SOURCE_TS_MS),
    )
    df = df.withColumns(
        {
            _read(n): read(F.col(_sent(n)), f, F.col(_encoding(n)))
            for n, f in enumerate(fields)
            if f.converted
        }
    )
    return _typed_row(df, fields)


ENCODINGS = f"{c.PREFIX}encodings"
"""The wrapper's schemas of ``after``'s fields, a column of their own: found once per record."""
PROBLEM = f"{c.PREFIX}problem"
"""The first reason a record does not decode, while its fields are read."""


def _sent(n: int) -> str:
    """The column of field ``n``'s JSON as sent (``after``'s, ``before``'s for a delete)."""
    return f"{c.PREFIX}sent_{n}"


def _encoding(n: int) -> str:
    """The column of field ``n``'s schema in the wrapper (null without one)."""
    return f"{c.PREFIX}encoding_{n}"


def _read(n: int) -> str:
    """The column of field ``n`` read into its declared type."""
    return f"{c.PREFIX}read_{n}"


def _typed_row(df: DataFrame, fields: list[WireField]) -> DataFrame:
    """The row's fields as declared, a value that does not read a decode error, one
    Debezium could not send null and named in ``record_columns.UNAVAILABLE``; ``before``
    typed the same way."""
    from pyspark.sql import functions as F

    typed: dict[str, Column] = {}
    befores: list[Column] = []
    unavailable: list[Column] = []
    problem = F.col(PROBLEM)
    for n, wire in enumerate(fields):
        now = F.col(_sent(n))
        placeholder = _placeholder(wire)
        missing = now == placeholder if placeholder is not None else F.lit(False)
        value = now
        old = F.col(c.BEFORE).getField(wire.name)
        if wire.converted:
            value = F.col(_read(n))
            problem = F.coalesce(
                problem,
                F.when(
                    now.isNotNull() & ~missing & value.isNull(),
                    F.concat(
                        F.lit(f"field {wire.name}: "),
                        now,
                        F.lit(f" is not a {wire.declared.simpleString()} as Debezium writes one"),
                    ),
                ),
            )
            old = F.when(old.isNotNull(), read(old, wire, F.col(_encoding(n))))
        typed[wire.name] = F.when(missing, F.lit(None)).otherwise(value).cast(wire.declared)
        befores.append(old.cast(wire.declared).alias(wire.name))
        if placeholder is not None:
            unavailable.append(F.when((F.col(c.OP) != DELETE) & missing, F.lit(wire.name)))
    own = {PROBLEM, c.BEFORE}
    own |= {name(n) for n in range(len(fields)) for name in (_sent, _encoding, _read)}
    df = df.select(
        *[F.col(c.quote(n)) for n in df.columns if n not in own],
        *[v.alias(k) for k, v in typed.items()],
        F.when(F.col(c.BEFORE).isNotNull(), F.struct(*befores)).alias(c.BEFORE),
        (
            F.array_compact(F.array(*unavailable))
            if unavailable
            else F.array().cast("array<string>")
        ).alias(c.UNAVAILABLE),
        problem.alias(PROBLEM),
    )
    problem = F.col(PROBLEM)
    return with_error(df, STAGE, problem.isNotNull(), problem).drop(PROBLEM)


def _named(fields: Column, name: str) -> Column:
    """The wrapper schema's entry of field ``name`` among ``fields`` (null: none). Found by
    its place among the names: a lambda over the array (``filter``) runs outside Spark's
    generated code, and cost a fifth of the decode."""
    from pyspark.sql import functions as F

    place = F.array_position(fields.getField("field"), F.lit(name)).cast("int")
    return F.when(place > 0, F.try_element_at(fields, place))


def _message(text: Callable[[str], str], op: Column) -> Column:
    """A message of ``ops`` about the record's ``op``, built in Spark."""
    from pyspark.sql import functions as F

    marker = "\x00"
    before, after = text(marker).split(marker)
    return F.concat(F.lit(before), op, F.lit(after))


def _placeholder(wire: WireField) -> Column | None:
    """What Debezium sends in place of a TOASTed value of this field; None: it cannot."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(wire.wire, T.StringType):
        return F.lit(UNAVAILABLE_VALUE)
    if isinstance(wire.wire, T.BinaryType):
        return F.lit(UNAVAILABLE_VALUE.encode())
    return None
