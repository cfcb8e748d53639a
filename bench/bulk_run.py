"""A backlog folded through ``materializer run``, as users run it, against the raw read.

``bench/pipeline.py`` folds its backlog in the benchmark's own Spark session
(a warm JVM, one query at a time). This one measures what a user sees: N
JSON events over K keys in a 4-partition topic, then per fold mode a
``materializer run`` process of its own with every setting at its default
(dead letters on, the Delta query beside the fold), started once the topic
holds them all. Spark's raw read of the same topic (``baseline_read``, in
this process, before any run) is the ratio's denominator.

  start_s    launch to the fold query's start (the JVM, the session, the topics);
  fold_s     the fold query's start to the map's watermark at the topic's end, every
             record folded into Redis; ``ratio_to_spark_read`` is the raw read's
             seconds over these;
  delta_s    the fold query's start to the Delta table holding every key.

The run's JVM is cold, as at a user's start, where ``pipeline.py``'s line is
its second round: the gap between the two lines is the JIT's share.

    .venv/bin/python bench/bulk_run.py [--events N] [--keys K] [--modes latest,merge]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
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

from materializer.contract.redis_layout import Watermark, meta_key
from materializer.spark.session import build_spark_session
from materializer.testing import create_topic
from materializer.testing.process import ManagedProcess


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
            emit(
                name=f"bulk_run_{mode}",
                units="s, events/s",
                events=args.events,
                keys=args.keys,
                start_s=round(started - launched, 2),
                fold_s=round(fold_s, 2),
                events_per_s=round(args.events / fold_s),
                ratio_to_spark_read=round(read_s / fold_s, 3),
                delta_s=round(in_delta - started, 2),
                entities_in_redis=entities,
                spark_conf=spark_conf or "default",
            )
        emit(name="done", loadavg_1m=round(os.getloadavg()[0], 2))


if __name__ == "__main__":
    main()
