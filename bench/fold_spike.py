"""Spike: where the fold's time goes, and which design gets a map live.

One run, one broker, one Redis, one Spark session; the same N JSON events
over K keys in a 4-partition topic. Minimal queries, each timed in bulk
(the whole topic, ``availableNow``) and live (fed at ``--rate`` events/s, one
micro-batch after another):

  read          batch ``kafka`` read + count (the baseline: ratio 1);
  batch_agg     batch ``from_json`` + ``groupBy(key).agg(max_by(...))`` + count;
  stream_agg    the same aggregation streaming, state in RocksDB, ``foreachBatch(count)``;
  stream_agg_changelog  the same with RocksDB changelog checkpointing;
  stateless     streaming ``from_json`` + ``foreachBatch(count)``: no state, no sink;
  redis_fold_driver     the map's own stateless decode, then its records pre-folded per
                key and applied by the ``latest`` Redis Function (``FCALL``), the
                changelog written: on the driver after one Arrow collect;
  redis_fold_executors  the same on the executors (``mapInArrow``), in parallel.

Live lines report micro-batch durations; ``redis_fold`` also produce-to-visible latency.

    .venv/bin/python bench/fold_spike.py [--events N] [--keys K] [--rate R] [--seconds S]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import Producer
from harness import (
    PARTITIONS,
    SCHEMA,
    Follower,
    baseline_read,
    emit,
    map_config,
    produce_at_rate,
    produce_bulk,
    services,
    setup_line,
)

from materializer import record_columns as c
from materializer.config import KafkaConfig
from materializer.job import records
from materializer.redis.fold import DRIVER_ROWS, RedisFold, producer_settings
from materializer.redis.functions import FoldTarget, load_library
from materializer.spark.session import build_spark_session
from materializer.testing import create_topic

CHANGELOG_CKPT = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


def source(spark: Any, bootstrap: str, topic: str, streaming: bool) -> Any:
    from pyspark.sql import functions as F

    reader = spark.readStream if streaming else spark.read
    raw = (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    return raw.select(
        F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"),
        F.col("partition").alias(c.PARTITION),
        F.col("offset").alias(c.OFFSET),
    ).select("e.*", c.PARTITION, c.OFFSET)


def aggregated(records: Any) -> Any:
    from pyspark.sql import functions as F

    entity = F.struct(*[F.col(n) for n in records.columns if not n.startswith("__")])
    last = F.max_by(entity, F.struct(F.col(c.PARTITION), F.col(c.OFFSET)))
    return records.groupBy("id").agg(last.alias("e"))


def count_batch(counts: list[int], rows: Any, _batch_id: int) -> None:
    counts.append(rows.count())


def redis_fold_step(fold: RedisFold, counts: list[int], where: str) -> Any:
    """The production fold step, forced onto the driver or the executors."""

    def step(records: Any, batch_id: int) -> None:
        # As the map's query does: one sink reads the batch, so it is not cached.
        rows = 0 if where == "driver" else None
        counts.append(fold.apply(records, batch_id, "spike", rows).keys)

    return step


def redis_fold(cfg: Any, name: str, bootstrap: str) -> RedisFold:
    topic = f"{name}.changelog"
    create_topic(bootstrap, PARTITIONS, name=topic)
    target = FoldTarget(
        redis=cfg.redis,
        map_name=name,
        changelog_topic=topic,
        producer=producer_settings(KafkaConfig(bootstrap_servers=bootstrap), 1_048_576),
    )
    return RedisFold(target, cfg.map(name).fold)


def run_stream(
    spark: Any,
    frame: Any,
    work: Path,
    name: str,
    step: Callable[[Any, int], None],
    *,
    output_mode: str,
    live: Callable[[Any], dict[str, Any]] | None = None,
) -> tuple[float, Any]:
    writer = (
        frame.writeStream.queryName(name)
        .outputMode(output_mode)
        .option("checkpointLocation", str(work / "ck" / name))
        .foreachBatch(step)
    )
    started = time.perf_counter()
    if live is None:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        return time.perf_counter() - started, query
    query = writer.trigger(processingTime="0 seconds").start()
    try:
        return time.perf_counter() - started, live(query)
    finally:
        query.stop()


def nearest_rank(ordered: list[float], pct: int) -> float:
    """The pct-th percentile of sorted values by nearest rank: never beyond the largest."""
    return ordered[max(0, -(-pct * len(ordered) // 100) - 1)]


def batch_durations(query: Any, since: int) -> dict[str, Any]:
    progress = [p for p in query.recentProgress if p["batchId"] >= since and p["numInputRows"] > 0]
    seconds = sorted(p["durationMs"]["triggerExecution"] / 1000 for p in progress)
    rows = [p["numInputRows"] for p in progress]
    if not seconds:
        return {"batches": 0}
    return {
        "batches": len(seconds),
        "rows_per_batch_mean": round(statistics.mean(rows)),
        "batch_s_p50": round(statistics.median(seconds), 3),
        "batch_s_p99": round(nearest_rank(seconds, 99), 3),
        "batch_s_max": round(seconds[-1], 3),
    }


class LiveFeed:
    """Produce at ``rate`` into ``topic`` for ``seconds``; a sampled event to ``follower``."""

    def __init__(self, bootstrap: str, topic: str, rate: int, seconds: float, keys: int) -> None:
        self.bootstrap, self.topic, self.rate, self.seconds, self.keys = (
            bootstrap,
            topic,
            rate,
            seconds,
            keys,
        )
        self.seq = 10_000_000

    def __call__(self, query: Any, follower: Follower | None = None) -> dict[str, Any]:
        # Let the query take its backlog and settle first.
        query.processAllAvailable()
        since = (query.lastProgress or {"batchId": -1})["batchId"] + 1
        prod = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})

        def sampled(key: bytes, seq: int, sent_at: float) -> None:
            if follower is not None and seq % 10 == 0:
                follower.samples.put((key, seq, sent_at))

        achieved = produce_at_rate(
            prod,
            self.topic,
            self.rate,
            self.seconds,
            self.keys,
            self.seq,
            sampled,
            random.Random(3),
        )
        self.seq += int(self.rate * self.seconds)
        out: dict[str, Any] = {"achieved_events_per_s": achieved}
        if follower is not None:
            out["unresolved"] = follower.finish(drain_seconds=60)
            ms = sorted(x * 1000 for x in follower.latencies)
            out.update(
                fresh_p50_ms=round(nearest_rank(ms, 50), 1),
                fresh_p99_ms=round(nearest_rank(ms, 99), 1),
            )
        query.processAllAvailable()
        out.update(batch_durations(query, since))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=5_000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--only", default="", help="comma-separated candidates to run")
    args = parser.parse_args()
    only = set(args.only.split(",")) - {""}

    work = Path(tempfile.mkdtemp(prefix="materializer-spike-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        bootstrap, redis_url = stack.enter_context(services())
        setup_line("local[*]", args.events, args.keys)
        topic = create_topic(bootstrap, PARTITIONS)
        emit(name="produce", **produce_bulk(bootstrap, topic, args.events, args.keys))
        cfg = map_config(bootstrap, redis_url, work, "local[*]", topic, "spike")
        spark = build_spark_session(cfg.spark)
        stack.callback(spark.stop)
        read_rate = baseline_read(spark, bootstrap, topic, args.events)
        load_library(cfg.redis)
        client = redis.Redis.from_url(redis_url)

        def bulk(name: str, seconds: float, rows: int) -> None:
            rate = args.events / seconds
            emit(
                name=f"bulk_{name}",
                units="s, events/s",
                seconds=round(seconds, 2),
                events_per_s=round(rate),
                ratio_to_read=round(rate / read_rate, 3),
                rows_out=rows,
            )

        def want(name: str) -> bool:
            return not only or name in only

        if want("batch_agg"):
            started = time.perf_counter()
            n = aggregated(source(spark, bootstrap, topic, streaming=False)).count()
            bulk("batch_agg", time.perf_counter() - started, n)

        live_topic = create_topic(bootstrap, PARTITIONS)
        feed = LiveFeed(bootstrap, live_topic, args.rate, args.seconds, args.keys)
        for changelog in (False, True):
            name = "stream_agg_changelog" if changelog else "stream_agg"
            if not want(name):
                continue
            spark.conf.set(CHANGELOG_CKPT, str(changelog).lower())
            counts: list[int] = []
            frame = aggregated(source(spark, bootstrap, topic, streaming=True))
            step = functools.partial(count_batch, counts)
            seconds, _ = run_stream(spark, frame, work, name, step, output_mode="update")
            bulk(name, seconds, sum(counts))
            frame = aggregated(source(spark, bootstrap, live_topic, streaming=True))
            _, live = run_stream(
                spark, frame, work, f"{name}_live", step, output_mode="update", live=feed
            )
            emit(name=f"live_{name}", **live)
        spark.conf.set(CHANGELOG_CKPT, "false")

        if want("stateless"):
            counts = []
            step = functools.partial(count_batch, counts)
            frame = source(spark, bootstrap, topic, streaming=True)
            seconds, _ = run_stream(spark, frame, work, "stateless", step, output_mode="append")
            bulk("stateless", seconds, sum(counts))
            frame = source(spark, bootstrap, live_topic, streaming=True)
            _, live = run_stream(
                spark, frame, work, "stateless_live", step, output_mode="append", live=feed
            )
            emit(name="live_stateless", **live)

        for where in ("driver", "executors"):
            name = f"redis_fold_{where}"
            if not want(name):
                continue
            counts = []
            bulk_map, live_map = f"{name}_bulk", f"{name}_live"
            # The driver takes batches up to DRIVER_ROWS only: its bulk run is cut to them.
            limit = DRIVER_ROWS if where == "driver" else None
            cfg = map_config(
                bootstrap, redis_url, work, "local[*]", topic, bulk_map, max_offsets=limit
            )
            fold = redis_fold(cfg, bulk_map, bootstrap)
            step = redis_fold_step(fold, counts, where)
            frame = fold.events(records(spark, cfg, bulk_map))
            seconds, _ = run_stream(spark, frame, work, name, step, output_mode="append")
            entities = sum(1 for _ in client.scan_iter(match=f"{bulk_map}:*", count=10_000))
            bulk(name, seconds, entities)
            cfg = map_config(bootstrap, redis_url, work, "local[*]", live_topic, live_map)
            fold = redis_fold(cfg, live_map, bootstrap)
            step = redis_fold_step(fold, counts, where)
            frame = fold.events(records(spark, cfg, live_map))
            follower = Follower(redis_url, live_map)
            follower.thread.start()
            _, live = run_stream(
                spark,
                frame,
                work,
                f"{name}_live",
                step,
                output_mode="append",
                live=functools.partial(feed, follower=follower),
            )
            emit(name=f"live_{name}", **live)
        client.close()


if __name__ == "__main__":
    main()
