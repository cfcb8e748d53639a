"""Spark's ``kafka`` source, configured from a map's source block."""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.config import AppConfig, MapConfig
from materializer.contract.kafka_clients import java

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def kafka_options(
    config: AppConfig, source_topics: list[str], starting_offsets: str
) -> dict[str, str]:
    """Options for ``readStream.format("kafka")``: the Java client's settings, prefixed."""
    options = {f"kafka.{key}": value for key, value in java(config.kafka).items()}
    options |= {
        "subscribe": ",".join(source_topics),
        "startingOffsets": starting_offsets,
        "includeHeaders": "true",
    }
    if config.spark.max_offsets_per_trigger is not None:
        options["maxOffsetsPerTrigger"] = str(config.spark.max_offsets_per_trigger)
    return options


def read_source(spark: SparkSession, config: AppConfig, map_config: MapConfig) -> DataFrame:
    """The map's topics as a stream of raw records, columns renamed to ``__key``, ``__value``..."""
    src = map_config.source
    reader = spark.readStream.format("kafka")
    for key, value in kafka_options(config, src.topics, src.starting_offsets).items():
        reader = reader.option(key, value)
    raw = reader.load()
    return raw.select(*[raw[name].alias(alias) for name, alias in c.SOURCE_COLUMNS.items()])
