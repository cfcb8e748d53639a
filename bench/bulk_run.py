"""A backlog folded through ``materializer run``, as users run it, against a minimal PySpark
job launched the same way.

N JSON events over K keys in a 4-partition topic; then, per fold mode, two cold
processes one after the other: a minimal PySpark job that only reads and counts
the topic (``RAW_JOB``: the product's Kafka jars, nothing else), and a
``materializer run`` of one map with every setting at its default (dead letters
on, the Delta query beside the fold). Both are timed from launch, so both pay
for their JVM's first minute, as a user's start does.

  first_entity_s  launch to the first entity visible in Redis;
  all_s           launch to every key showing its last value (the map's watermark
                  at the topic's end); ``ratio_cold`` is the minimal job's seconds
                  from launch to its count over these;
  start_s         launch to the fold query's start (the JVM, the session, the topics);
  fold_s          the fold query's start to every key, against Spark's warm read of
                  the same topic in this process (``baseline_read``): ``ratio_warm``;
  delta_s         the fold query's start to the Delta table holding every key.

    .venv/bin/python bench/bulk_run.py [--events N] [--keys K] [--modes latest,merge]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from confluent_kafka import Consumer, TopicPartition
from harness import PARTITIONS, baseline_read, emit, map_config, produce_bulk, services, setup_line
from live import (
    add_spark_conf,
    delta_rows,
    entity_count,
    spark_settings,
    wait_for,
    write_config,
)

from materializer.contract.redis_layout import meta_key
from materializer.contract.watermark import Watermark
from materializer.spark.session import build_spark_session
from materializer.testing import create_topic
from materializer.testing.process import ManagedProcess

RAW_JOB = """
import sys, time
from pyspark.sql import SparkSession
from materializer.jvm import jars
spark = (SparkSession.builder.master("local[*]")
         .config("spark.jars", ",".join(str(p) for p in jars("spark")))
         .config("spark.ui.enabled", "false").getOrCreate())
count = (spark.read.format("kafka").option("kafka.bootstrap.servers", sys.argv[1])
         .option("subscribe", sys.argv[2]).load().count())
print(count, flush=True)
"""
"""The minimal PySpark job: a session with the Kafka jars, a batch read, a count."""


def cold_raw_read(bootstrap: str, topic: str, events: int) -> float:
    """Seconds from the minimal job's launch to its count (its shutdown is not counted)."""
    launched = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", RAW_JOB, bootstrap, topic],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    seconds = time.perf_counter() - launched
    proc.wait(120)
    if line != str(events):
        raise RuntimeError(f"the minimal job counted {line!r}, expected {events}")
    return seconds


def any_entity(client: redis.Redis, map_name: str) -> bool:
    """Whether Redis shows an entity of the map (the first one appears before the watermark)."""
    return any(True for _ in client.scan_iter(match=f"{map_name}:user-*", count=1_000))


def topic_end(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's next offset: where a watermark stands once it has every record."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-bulk-run"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def folded_to(client: redis.Redis, map_name: str, topic: str, end: dict[int, int]) -> bool:
    """Whether the map's watermark has reached ``end`` in every partition."""
    mark = Watermark.from_hash(client.hgetall(meta_key(map_name)))
    if mark is None:
        return False
    offsets = mark.offsets.get(topic, {})
    return all(offsets.get(p, -1) >= o for p, o in end.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--modes", default="latest,merge,aggregate")
    parser.add_argument("--keep-logs", help="copy each run's log into this folder")
    add_spark_conf(parser)
    args = parser.parse_args()
    spark_conf = spark_settings(args)

    work = Path(tempfile.mkdtemp(prefix="materializer-bulk-run-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        bootstrap, redis_url = stack.enter_context(services())
        client = redis.Redis.from_url(redis_url)
        stack.callback(client.close)
        setup_line("local[*]", args.events, args.keys)
        topic = create_topic(bootstrap, PARTITIONS)
        emit(name="produce", **produce_bulk(bootstrap, topic, args.events, args.keys))
        end = topic_end(bootstrap, topic)
        if sum(end.values()) != args.events:
            raise RuntimeError(f"the topic holds {sum(end.values())} records, not {args.events}")

        # The raw read in a session of this process, stopped before the runs: two JVMs
        # must not share the two cores while one of them is measured.
        spark = build_spark_session(
            map_config(bootstrap, redis_url, work, "local[*]", topic, "x").spark
        )
        try:
            read_rate = baseline_read(spark, bootstrap, topic, args.events)
        finally:
            spark.stop()
        read_s = args.events / read_rate

        for mode in args.modes.split(","):
            run_dir = work / mode
            run_dir.mkdir()
            client.flushall()
            config = write_config(run_dir, bootstrap, redis_url, topic, mode, spark_conf=spark_conf)
            log = run_dir / f"{mode}.log"
            raw_cold_s = cold_raw_read(bootstrap, topic, args.events)
            launched = time.perf_counter()
            proc = ManagedProcess(
                [sys.executable, "-m", "materializer", "run", "-c", str(config)], log
            )
            try:
                started_line = f"query={mode}.fold started"
                wait_for(
                    "the fold query's start",
                    lambda line=started_line, path=log: line in path.read_text(errors="replace"),
                    600,
                    proc,
                )
                started = time.perf_counter()
                wait_for("the first entity", lambda m=mode: any_entity(client, m), 600, proc, 0.05)
                first = time.perf_counter()
                wait_for(
                    "every record folded",
                    lambda m=mode: folded_to(client, m, topic, end),
                    1800,
                    proc,
                )
                folded = time.perf_counter()
                entities = entity_count(client, mode)
                if entities != min(args.events, args.keys):
                    raise RuntimeError(
                        f"{mode}: {entities} entities in Redis, expected {args.keys}"
                    )
                wait_for(
                    "the Delta table",
                    lambda d=run_dir / "warehouse" / mode: delta_rows(d) >= args.keys,
                    1800,
                    proc,
                )
                in_delta = time.perf_counter()
            finally:
                proc.stop()
                if args.keep_logs:
                    Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                    shutil.copy(log, Path(args.keep_logs) / f"bulk-{mode}.log")
            fold_s = folded - started
            all_s = folded - launched
            emit(
                name=f"bulk_run_{mode}",
                units="s, events/s",
                events=args.events,
                keys=args.keys,
                first_entity_s=round(first - launched, 2),
                all_s=round(all_s, 2),
                raw_cold_s=round(raw_cold_s, 2),
                ratio_cold=round(raw_cold_s / all_s, 3),
                start_s=round(started - launched, 2),
                fold_s=round(fold_s, 2),
                events_per_s=round(args.events / fold_s),
                ratio_warm=round(read_s / fold_s, 3),
                delta_s=round(in_delta - started, 2),
                entities_in_redis=entities,
                spark_conf=spark_conf or "default",
            )
        emit(name="done", loadavg_1m=round(os.getloadavg()[0], 2))


if __name__ == "__main__":
    main()
