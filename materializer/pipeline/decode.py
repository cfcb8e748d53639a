"""Raw Kafka records to decoded records, with every failure kept as data.

Decoding never drops or raises: a record either yields the entity's fields (as
top-level columns) or carries ``__error_stage`` / ``__error_message`` and goes
the way of the map's error policy. Everything here is a Spark expression, so it
runs in the JVM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.config import MapConfig
from materializer.errors import ConfigError
from materializer.pipeline import columns as c

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


def with_error(df: DataFrame, stage: str, failed: Column, message: Column) -> DataFrame:
    """Mark records where ``failed`` holds, unless an earlier stage already marked them."""
    from pyspark.sql import functions as F

    first = F.col(c.ERROR_STAGE).isNull() & F.coalesce(failed, F.lit(False))
    return df.withColumns(
        {
            c.ERROR_STAGE: F.when(first, F.lit(stage)).otherwise(F.col(c.ERROR_STAGE)),
            c.ERROR_MESSAGE: F.when(first, message).otherwise(F.col(c.ERROR_MESSAGE)),
        }
    )


def _no_errors(raw: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return raw.withColumns(
        {
            c.ERROR_STAGE: F.lit(None).cast("string"),
            c.ERROR_MESSAGE: F.lit(None).cast("string"),
        }
    )


def _decode_json(raw: DataFrame, schema: StructType) -> DataFrame:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    with_corrupt = StructType([*schema.fields, StructField(CORRUPT, StringType())])
    parsed = F.from_json(
        F.col(c.VALUE).cast("string"),
        with_corrupt,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
    )
    df = _no_errors(raw).withColumn("__parsed", parsed)
    bad = F.col(c.VALUE).isNotNull() & (
        F.col("__parsed").isNull() | F.col("__parsed").getField(CORRUPT).isNotNull()
    )
    df = with_error(df, "decode", bad, F.lit("value is not JSON matching the declared schema"))
    fields = [F.col("__parsed").getField(f.name).alias(f.name) for f in schema.fields]
    return df.select(*[F.col(n) for n in df.columns if n != "__parsed"], *fields)


def _decode_string(raw: DataFrame, field: str) -> DataFrame:
    from pyspark.sql import functions as F

    return _no_errors(raw).withColumn(field, F.col(c.VALUE).cast("string"))


def decode(raw: DataFrame, map_config: MapConfig) -> DataFrame:
    """Add the entity's fields and the error columns to raw records.

    A tombstone (null value) decodes to null fields and no error.
    """
    src = map_config.source
    if src.format == "json":
        return _decode_json(raw, json_schema(map_config))
    if src.format == "string":
        return _decode_string(raw, src.string_field)
    raise ConfigError("", [f"source.format: {src.format} decoding is not available yet"])
