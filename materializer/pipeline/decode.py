"""Raw Kafka records to decoded records, with every failure kept as data.

Decoding never drops or raises: a record either yields the entity's fields (as
top-level columns) or carries ``__error_stage`` / ``__error_message`` and goes
the way of the map's error policy. Everything here is a Spark expression, so it
runs in the JVM.
"""

from __future__ import annotations

from pathlib import Path
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
    df = _with_struct_fields(df, bad, "value is not JSON matching the declared schema")
    return df.drop(CORRUPT)


def _with_struct_fields(df: DataFrame, bad: Column, message: str) -> DataFrame:
    """Mark ``bad`` rows as decode errors and spread ``__parsed`` into top-level fields."""
    from pyspark.sql import functions as F

    df = with_error(df, "decode", bad, F.lit(message))
    parsed = df.schema["__parsed"].dataType
    fields = [F.col("__parsed").getField(f.name).alias(f.name) for f in parsed.fields]  # type: ignore[attr-defined]
    return df.select(*[F.col(n) for n in df.columns if n != "__parsed"], *fields)


def avro_schema(map_config: MapConfig) -> str:
    """The Avro schema file's JSON text; a top-level record is required."""
    import orjson

    path = map_config.source.schema_file or ""
    try:
        text = Path(path).read_text()
        doc = orjson.loads(text)
    except OSError as exc:
        raise ConfigError("", [f"source.schema_file: cannot read {path}: {exc.strerror}"]) from None
    except orjson.JSONDecodeError as exc:
        raise ConfigError("", [f"source.schema_file: {path} is not JSON: {exc}"]) from None
    if not isinstance(doc, dict) or doc.get("type") != "record":
        raise ConfigError("", [f"source.schema_file: {path} must hold an Avro record schema"])
    return text


def _decode_avro(raw: DataFrame, schema: str) -> DataFrame:
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    df = _no_errors(raw).withColumn(
        "__parsed", from_avro(F.col(c.VALUE), schema, {"mode": "PERMISSIVE"})
    )
    bad = F.col(c.VALUE).isNotNull() & F.col("__parsed").isNull()
    return _with_struct_fields(df, bad, "value is not Avro of the declared schema")


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
    if src.format == "avro" and src.schema_file:
        return _decode_avro(raw, avro_schema(map_config))
    if src.format == "string":
        return _decode_string(raw, src.string_field)
    raise ConfigError("", [f"source.format: {src.format} decoding is not available yet"])
