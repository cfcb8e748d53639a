"""Raw Kafka records to decoded entities, with every failure kept as data.

Decoding never drops or raises: a record either yields an entity (or a delete)
with its key, or carries ``_error_stage`` / ``_error_message`` and goes to the
dead-letter topic. Everything here is a Spark expression, so it runs in the JVM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.config import KAFKA_KEY, MapConfig
from materializer.layout import RESERVED_KEYS
from materializer.pipeline import columns as c

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType


def value_schema(map_config: MapConfig) -> StructType:
    """The declared value schema, parsed from its DDL."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    parsed = _parse_datatype_string(map_config.source.schema_)
    if not isinstance(parsed, StructType):
        raise TypeError(f"schema must be a struct, got {parsed.simpleString()}")
    return parsed


def _key_column(map_config: MapConfig, entity: Column) -> Column:
    from pyspark.sql import functions as F

    kafka_key = F.col(c.KAFKA_KEY).cast("string")
    if map_config.key == KAFKA_KEY:
        return kafka_key
    # A tombstone has no value, so its key can only be the record's Kafka key.
    return F.when(F.col(c.VALUE).isNull(), kafka_key).otherwise(
        entity.getField(map_config.key).cast("string")
    )


def decode(raw: DataFrame, map_config: MapConfig) -> DataFrame:
    """Add ``_key``, ``_deleted``, ``_entity`` and the error columns to raw records."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    schema = value_schema(map_config)
    with_corrupt = StructType([*schema.fields, StructField(c.CORRUPT, StringType())])
    parsed = F.from_json(
        F.col(c.VALUE).cast("string"),
        with_corrupt,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": c.CORRUPT},
    )
    decoded = raw.withColumn("_parsed", parsed)
    entity = F.struct(*[F.col("_parsed").getField(f.name).alias(f.name) for f in schema.fields])
    tombstone = F.col(c.VALUE).isNull()
    bad_json = F.col(c.VALUE).isNotNull() & (
        F.col("_parsed").isNull() | F.col("_parsed").getField(c.CORRUPT).isNotNull()
    )
    key = _key_column(map_config, entity)
    key_source = "the Kafka key" if map_config.key == KAFKA_KEY else f"field {map_config.key!r}"
    return (
        decoded.withColumn(c.KEY, key)
        .withColumn(c.DELETED, tombstone)
        .withColumn(c.ENTITY, F.when(tombstone, F.lit(None)).otherwise(entity))
        .withColumn(
            c.ERROR_STAGE,
            F.when(bad_json, F.lit("decode")).when(
                F.col(c.KEY).isNull() | F.col(c.KEY).isin(*RESERVED_KEYS), F.lit("key")
            ),
        )
        .withColumn(
            c.ERROR_MESSAGE,
            F.when(bad_json, F.lit("value is not JSON matching the declared schema"))
            .when(tombstone & F.col(c.KEY).isNull(), F.lit("tombstone without a Kafka key"))
            .when(F.col(c.KEY).isNull(), F.lit(f"no key: {key_source} is missing or null"))
            .when(F.col(c.KEY).isin(*RESERVED_KEYS), F.lit("key is reserved by the Redis layout")),
        )
        .drop("_parsed")
    )


def good(decoded: DataFrame) -> DataFrame:
    """Records that fold: decoded (or tombstones) with a key."""
    from pyspark.sql import functions as F

    return decoded.where(F.col(c.ERROR_STAGE).isNull())


def bad(decoded: DataFrame) -> DataFrame:
    """Records bound for the dead-letter topic."""
    from pyspark.sql import functions as F

    return decoded.where(F.col(c.ERROR_STAGE).isNotNull())
