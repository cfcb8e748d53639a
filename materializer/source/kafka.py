"""Spark's ``kafka`` source, configured from a map's source block."""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.clients.kafka import java
from materializer.config import AppConfig, MapConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


FETCH_MAX_WAIT_MS = 20
"""How long the broker may hold a fetch of Spark's readers that finds no new records.

A task reads offsets that exist (its batch's end was read before it ran), but the
consumer it borrows may still have a fetch on its way for offsets past the log's end,
sent ahead by its last poll, and a new fetch waits for that one. At Kafka's 500 ms a
Delta query's tasks spent most of their time waiting, not working, holding both task
slots while a fold batch waited for one, so fold batches beside each MERGE took several
times as long (docs/decisions/0014-kafka-fetch-wait-of-20-ms.md). ``kafka.properties``
can set another value."""

LIVE_FETCH_MAX_WAIT_MS = 500
"""The same for the real-time path's readers (Kafka's default): there each task waits for
records that do not exist yet, and a held fetch answers as soon as one comes, so the wait
costs no freshness; at 20 ms each idle partition's reader asked the broker fifty times a
second (docs/decisions/0032-the-live-path-in-real-time-mode.md)."""


def kafka_options(
    config: AppConfig,
    source_topics: list[str],
    starting_offsets: str,
    max_records: int | None = None,
    fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS,
) -> dict[str, str]:
    """Options for ``readStream.format("kafka")``: the Java client's settings, prefixed.
    ``max_records`` a batch bounds it below ``spark.max_offsets_per_trigger``."""
    settings = java(config.kafka, **{"fetch.max.wait.ms": str(fetch_max_wait_ms)})
    options = {f"kafka.{key}": value for key, value in settings.items()}
    options |= {
        "subscribe": ",".join(source_topics),
        "startingOffsets": starting_offsets,
        "includeHeaders": "true",
    }
    limits = [n for n in (config.spark.max_offsets_per_trigger, max_records) if n is not None]
    if limits:
        options["maxOffsetsPerTrigger"] = str(min(limits))
    return options


def read_source(
    spark: SparkSession,
    config: AppConfig,
    map_config: MapConfig,
    max_records: int | None = None,
    starting_offsets: str | None = None,
    fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS,
) -> DataFrame:
    """The map's topics as a stream of raw records, columns renamed to ``__key``, ``__value``...;
    at most ``max_records`` a batch when given. ``starting_offsets`` (Spark's JSON of
    offsets per partition) replaces the map's ``source.starting_offsets`` where a query
    starts from positions kept elsewhere (``materializer.live``), which also reads with a
    ``fetch_max_wait_ms`` of its own (``LIVE_FETCH_MAX_WAIT_MS``)."""
    src = map_config.source
    reader = spark.readStream.format("kafka")
    starting = src.starting_offsets if starting_offsets is None else starting_offsets
    options = kafka_options(config, src.topics, starting, max_records, fetch_max_wait_ms)
    for key, value in options.items():
        reader = reader.option(key, value)
    raw = reader.load()
    return raw.select(*[raw[name].alias(alias) for name, alias in c.SOURCE_COLUMNS.items()])
