"""JSON values with a declared schema (Spark SQL DDL), parsed in the JVM: plain, or in
Confluent's JSON Schema wire format (a zero magic byte and a 4-byte schema id first)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.config import MapConfig
from materializer.errors import ConfigError
from materializer.source.formats.parsed import PARSED, spread_parsed
from materializer.source.record_errors import with_error, without_errors

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

CORRUPT = "__corrupt_record"


def json_schema(map_config: MapConfig) -> StructType:
    """The declared JSON value schema, parsed from its DDL."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    ddl = map_config.source.schema_
    try:
        parsed = _parse_datatype_string(ddl or "")
    except Exception as exc:  # pyspark raises several types for a bad DDL string
        raise ConfigError("", [f"source.schema: not valid Spark SQL DDL: {exc}"]) from None
    if not isinstance(parsed, StructType):
        raise ConfigError("", [f"source.schema: must be a struct, got {parsed.simpleString()}"])
    return parsed


WIRE_HEADER_BYTES = 5


def decode_json(raw: DataFrame, schema: StructType, wire_format: bool = False) -> DataFrame:
    """``from_json`` in permissive mode; a value that does not parse is a decode error.

    With ``wire_format`` the header is checked and cut off first; a value without it
    is a decode error of its own. The writer's schema id is not looked up: the JSON
    names its fields, and the declared schema types them.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    df, text = json_text(without_errors(raw), wire_format)
    with_corrupt = StructType([*schema.fields, StructField(CORRUPT, StringType())])
    parsed = F.from_json(
        text.cast("string"),
        with_corrupt,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
    )
    df = df.withColumn(PARSED, parsed)
    bad = F.col(c.VALUE).isNotNull() & (
        F.col(PARSED).isNull() | F.col(PARSED).getField(CORRUPT).isNotNull()
    )
    df = spread_parsed(df, bad, "value is not JSON matching the declared schema")
    return df.drop(CORRUPT)


def json_text(df: DataFrame, wire_format: bool) -> tuple[DataFrame, Column]:
    """The JSON text of each value: the value itself, or with ``wire_format`` what follows
    the header, a value without one marked as a decode error of its own."""
    from pyspark.sql import functions as F

    text = F.col(c.VALUE)
    if not wire_format:
        return df, text
    magic = F.substring(text, 1, 1)
    short = F.length(text) < WIRE_HEADER_BYTES
    framed = ~short & (magic == F.unhex(F.lit("00")))
    df = with_error(
        df,
        "decode",
        text.isNotNull() & ~framed,
        F.when(
            short,
            F.concat(
                F.lit("not in Confluent's wire format: "),
                F.length(text).cast("string"),
                F.lit(" bytes, fewer than its 5-byte header"),
            ),
        ).otherwise(
            F.concat(
                F.lit("not in Confluent's wire format: magic byte 0x"),
                F.lower(F.hex(magic)),
                F.lit(", expected 0x00"),
            )
        ),
    )
    text = F.when(framed, F.expr(f"substring(`{c.VALUE}`, {WIRE_HEADER_BYTES + 1})"))
    return df, text
