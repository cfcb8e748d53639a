"""The real-time query of a set of maps: each map's source, decoded and keyed as on the
micro-batch path, unioned into one query that Spark runs in Real-time Mode, written by the
JVM writer (``FoldWriter``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from materializer import record_columns as c
from materializer.checkpoints.running import Checkpoint
from materializer.clients.group_positions import COORDINATOR_WAIT_S
from materializer.clients.kafka import fence_transactional_ids, java
from materializer.clients.kafka_offsets import admin_client, partition_ids
from materializer.config import AppConfig
from materializer.config.maps import realtime_problems, realtime_refusal
from materializer.contract.redis_layout import (
    RESERVED_KEYS,
    live_freshness_key,
    meta_key,
    physical_name,
)
from materializer.errors import ConfigError
from materializer.fold.aggregate import AggregateFolder
from materializer.fold.base import orders_are_digits
from materializer.fold.merge import MergeFolder
from materializer.group.fencing import Ownership
from materializer.job import map_fold, map_key_paths, records
from materializer.live.columns import writer_columns
from materializer.live.freshness import writer_spec
from materializer.live.positions import (
    LIVE_APP,
    live_group,
    starting_offsets,
    transactional_ids,
    transactional_prefix,
)
from materializer.redis.functions import LIVE, TRUNCATE, load_library
from materializer.redis.sink import RedisFold
from materializer.redis.writer import Writer
from materializer.restore.automatic import ensure_whole
from materializer.source.kafka import LIVE_FETCH_MAX_WAIT_MS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

PREPARED_AT_ONCE = 8
"""Maps whose positions a start reads at once: each asks its group's coordinator, and
a hundred maps asked one by one spent half their start waiting on Kafka."""

BATCH_DURATION = "5 minutes"
"""How often the real-time query checkpoints (Spark's default): not how fresh a map is,
which is one Redis call behind its records. A shorter one only repeats the query's
planning; a crash replays nothing twice either way (the watermark holds the positions)."""

WRITER = "io.materializer.live.FoldWriter"
QUERY_NAME = "live"
"""What the real-time queries' names start with: ``live-<n>``, one per group of maps."""


def query_name(index: int, start: int) -> str:
    """The name of the run's real-time query of group ``index`` (``run.live``) at its
    ``start``-th start."""
    return f"{QUERY_NAME}-{index}.{start}"


@dataclass(frozen=True)
class LiveMap:
    """A map the real-time query folds: its copy (``generation``) and, in a worker group,
    the ownership its writes carry (``group.fencing``)."""

    name: str
    generation: int = 0
    owner: Ownership | None = None
    config: AppConfig | None = None
    """The config the map runs on (None: the query's): a rebuild pins a map's old one."""
    fold: RedisFold | None = None
    """Its fold (``job.map_fold``) when built already: its topics are ready then."""


def start_live(
    spark: SparkSession,
    config: AppConfig,
    maps: Sequence[LiveMap],
    checkpoint: str,
    batch_duration: str = BATCH_DURATION,
    name: str = QUERY_NAME,
) -> StreamingQuery:
    """Start the real-time query of ``maps``, named ``name``, each map from its position
    (``live.positions``).

    ``checkpoint`` is the query's own folder, emptied first: the positions that count are
    the maps' own, so a query of another set of maps starts afresh. The writers any earlier
    query of the maps may have left are fenced first, all at once: a writer counted as
    ended may still hold a transaction its close gave up on.
    """
    if config.redis.cluster:
        raise ConfigError("", ["redis.cluster: the real-time path runs on one Redis server"])
    load_library(config.redis)
    sources = {m.name: (m.config or config).map(m.name).source.topics for m in maps}
    partitions = partition_ids(admin_client(config.kafka), sorted(set().union(*sources.values())))
    topics = {name: {t: partitions[t] for t in ts} for name, ts in sources.items()}
    fence_transactional_ids(
        config.kafka,
        [
            tid
            for m in maps
            for tid in transactional_ids(
                transactional_prefix(physical_name(m.name, m.generation)), topics[m.name]
            )
        ],
        COORDINATOR_WAIT_S,
    )
    with ThreadPoolExecutor(PREPARED_AT_ONCE, thread_name_prefix="live-start") as pool:
        prepared = list(pool.map(lambda m: _prepared(config, m, topics[m.name]), maps))
    parts: list[DataFrame] = []
    specs: list[dict[str, Any]] = []
    for index, (member, (fold, starting)) in enumerate(zip(maps, prepared, strict=True)):
        part, spec = _map_part(spark, config, member, index, fold, starting)
        parts.append(part)
        specs.append(spec)
    spec_json = orjson.dumps(
        {
            "query": name,
            "redisUrl": config.redis.url,
            "appId": LIVE_APP,
            "producer": java(config.kafka),
            "maps": specs,
            "commitEveryMs": round(config.spark.live_commit_interval.total_seconds() * 1000),
            **writer_spec(),
        }
    ).decode()
    Checkpoint(spark, checkpoint).discard()
    jvm = spark._jvm
    assert jvm is not None, "a classic Spark session (py4j), not Spark Connect"
    writer = getattr(jvm, WRITER)(spec_json)
    trigger = jvm.org.apache.spark.sql.streaming.Trigger.RealTime(batch_duration)
    started = (
        _union(parts)
        ._jdf.writeStream()
        .queryName(name)
        .option("checkpointLocation", checkpoint)
        .outputMode("update")
        .foreach(writer)
        .trigger(trigger)
        .start()
    )
    from pyspark.sql.streaming.query import StreamingQuery

    return StreamingQuery(started)


def _union(parts: list[DataFrame]) -> DataFrame:
    """The maps' parts as one, unioned in pairs: each union analyses the plans under it,
    so a chain of a hundred would analyse its growing plan a hundred times over."""
    while len(parts) > 1:
        pairs = zip(parts[::2], parts[1::2], strict=False)
        parts = [a.unionByName(b) for a, b in pairs] + parts[len(parts) - len(parts) % 2 :]
    return parts[0]


def _prepared(
    config: AppConfig, member: LiveMap, topics: dict[str, list[int]]
) -> tuple[RedisFold, str]:
    """A map's fold and where its source starts, its copy checked whole: Redis and Kafka
    calls, made for several maps at once (``PREPARED_AT_ONCE``). ``topics``: the partitions
    of its sources, whose writers are fenced already."""
    name = member.name
    config = member.config or config
    problems = realtime_problems(config.map(name))
    if problems:
        raise ConfigError("", [f"maps.{name}.{realtime_refusal(problems)}"])
    physical = physical_name(name, member.generation)
    fold = member.fold or map_fold(config, name, member.generation, owner=member.owner)
    ensure_whole(config, name, member.generation)
    return fold, starting_offsets(config, name, physical, topics)


def _map_part(
    spark: SparkSession,
    config: AppConfig,
    member: LiveMap,
    index: int,
    fold: RedisFold,
    starting: str,
) -> tuple[DataFrame, dict[str, Any]]:
    """One map's records as the writer reads them, from ``starting``, and its place in the
    writer's spec."""
    name = member.name
    config = member.config or config
    physical = physical_name(name, member.generation)
    # A real-time batch is bounded by its duration: Spark refuses maxOffsetsPerTrigger there.
    unbounded = config.model_copy(
        update={"spark": config.spark.model_copy(update={"max_offsets_per_trigger": None})}
    )
    keyed = records(
        spark, unbounded, name, starting_offsets=starting, fetch_max_wait_ms=LIVE_FETCH_MAX_WAIT_MS
    )
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
        "group": live_group(name),
        "transactionalId": transactional_prefix(physical),
        "freshness": live_freshness_key(name),
        "fold": function_fold(fold, keyed),
        "batchInOrder": fold.mode.batch_in_order,
        "truncate": {
            "function": TRUNCATE,
            "key": c.TRUNCATE_KEY,
            "map": physical,
            "reserved": sorted(RESERVED_KEYS),
        },
    }
    return writer_columns(fold, events, index, physical), spec


def function_fold(fold: RedisFold, records: DataFrame) -> str:
    """The map's fold as the real-time function reads it: '' for ``latest`` (Redis compares
    orders), else the mode's spec as JSON (``merge.lua``, ``aggregate.lua``). ``records``:
    the map's records before the fold, whose event time says how its orders compare."""
    folder = fold.target.folder
    if isinstance(folder, MergeFolder):
        digits = orders_are_digits(records, fold.mode.fold.event_time)
        return orjson.dumps({"merge": folder.lua_spec(), "digits": digits}).decode()
    if isinstance(folder, AggregateFolder):
        return orjson.dumps({"aggregate": folder.lua_spec()}).decode()
    if folder is not None:
        raise TypeError(f"the real-time path has no fold of {type(folder).__name__}")
    return ""


WRITERS_DRAIN_S = 75.0
"""How long a stop waits for the writers of the stopped query (each waits up to a minute
for its calls and transactions, ``FoldWriter.DRAIN_MS``)."""


def stop_live(spark: SparkSession, query: StreamingQuery, name: str = QUERY_NAME) -> bool:
    """Stop the real-time query named ``name``, then wait until its writers have committed
    what they applied: Spark ends a stopped query before its tasks, and the next query's
    fencing would abort their last transactions (the next start would fold those records
    again, once, but a stop is meant to leave nothing behind). The writers of the run's
    other real-time queries go on. False when the wait ran out."""
    query.stop()
    jvm = spark._jvm
    assert jvm is not None, "a classic Spark session (py4j), not Spark Connect"
    writers = getattr(jvm, WRITER)
    deadline = time.monotonic() + WRITERS_DRAIN_S
    while writers.openWriters(name) > 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
