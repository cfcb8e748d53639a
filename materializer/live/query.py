"""The real-time query of a set of maps: each map's source, decoded and keyed as on the
micro-batch path, unioned into one query that Spark runs in Real-time Mode, written by the
JVM writer (``FoldWriter``)."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from materializer.clients.kafka import java
from materializer.config import AppConfig
from materializer.config.names import LIVE_GROUP
from materializer.contract.redis_layout import meta_key, physical_name
from materializer.errors import ConfigError
from materializer.job import map_fold, map_key_paths, records
from materializer.live.columns import writer_columns
from materializer.live.positions import LIVE_APP, starting_offsets
from materializer.redis.functions import LIVE, load_library
from materializer.redis.writer import Writer
from materializer.restore.automatic import ensure_whole

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

BATCH_DURATION = "5 minutes"
"""How often the real-time query checkpoints (Spark's default): not how fresh a map is,
which is one Redis call behind its records. A shorter one only repeats the query's
planning; a crash replays nothing twice either way (the watermark holds the positions)."""

WRITER = "io.materializer.live.FoldWriter"


def start_live(
    spark: SparkSession,
    config: AppConfig,
    map_names: Sequence[str],
    checkpoint: str,
    batch_duration: str = BATCH_DURATION,
) -> StreamingQuery:
    """Start the real-time query of ``map_names``, each from its watermark.

    ``checkpoint`` is the query's own folder, emptied first: the positions that count are
    the watermarks in Redis, so a query of another set of maps starts afresh.
    """
    if config.redis.cluster:
        raise ConfigError("", ["redis.cluster: the real-time path runs on one Redis server"])
    load_library(config.redis)
    parts: list[DataFrame] = []
    maps: list[dict[str, Any]] = []
    for index, name in enumerate(map_names):
        part, spec = _map_part(spark, config, name, index)
        parts.append(part)
        maps.append(spec)
    union = functools.reduce(lambda a, b: a.unionByName(b), parts)
    spec_json = orjson.dumps(
        {
            "redisUrl": config.redis.url,
            "appId": LIVE_APP,
            "producer": java(config.kafka),
            "maps": maps,
        }
    ).decode()
    shutil.rmtree(checkpoint, ignore_errors=True)
    jvm = spark._jvm
    assert jvm is not None, "a classic Spark session (py4j), not Spark Connect"
    writer = getattr(jvm, WRITER)(spec_json)
    trigger = jvm.org.apache.spark.sql.streaming.Trigger.RealTime(batch_duration)
    started = (
        union._jdf.writeStream()
        .queryName("live")
        .option("checkpointLocation", checkpoint)
        .outputMode("update")
        .foreach(writer)
        .trigger(trigger)
        .start()
    )
    from pyspark.sql.streaming.query import StreamingQuery

    return StreamingQuery(started)


def _map_part(
    spark: SparkSession, config: AppConfig, name: str, index: int
) -> tuple[DataFrame, dict[str, Any]]:
    """One map's records as the writer reads them, and its place in the writer's spec."""
    map_config = config.map(name)
    if map_config.fold.mode != "latest":
        raise ConfigError(
            "", [f"maps.{name}.fold.mode: the real-time path folds `latest` maps only so far"]
        )
    physical = physical_name(name, 0)
    fold = map_fold(config, name)
    ensure_whole(config, name, 0)
    group = LIVE_GROUP.replace("{map}", name)
    transactional_id = f"materializer.live.{physical}"
    starting = starting_offsets(config, name, physical, group, transactional_id)
    keyed = records(spark, config, name, starting_offsets=starting)
    with map_key_paths(name):
        events = fold.events(keyed)
    fixed = Writer(fold.target, 0).fixed_args()
    spec = {
        "name": name,
        "function": LIVE,
        "fixed": [arg.decode() for arg in fixed],
        "meta": meta_key(physical),
        "changelog": fold.target.changelog_topic,
        "deadLetters": fold.target.dead_letter_topic,
        "group": group,
        "transactionalId": transactional_id,
    }
    return writer_columns(fold, events, index, physical), spec
