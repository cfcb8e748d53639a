"""Ingest benchmark: the foundation slice against raw reads of the same topic.

All in one run, on one broker, one Redis and one Spark session:

  produce  N JSON events (~200 bytes) over K keys into a 4-partition topic;
  (a)      Spark's batch ``kafka`` read + ``count()`` of the topic (the baseline);
  (b)      a plain confluent-kafka consume of the topic;
  (c)      the slice end to end: decode, ``latest`` fold in the state store,
           Redis writes, Delta MERGE, until everything is materialized;
  ratios   c/a and c/b;
  freshness  a second map, live and caught up, fed at a steady rate; every
           10th event is followed until Redis holds it (its ``seq`` or a later
           one): produce-to-visible latency percentiles.

Prints one JSON object per line on stdout. Each micro-batch of the slice is
timed per step (fold, Redis, Delta) by wrapping the sinks here, in the
benchmark only, so a reader can see where a batch's time goes.

    .venv/bin/python bench/ingest.py [--events N] [--keys K] [--rate R] [--seconds S]

``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` point it at running services
instead of starting its own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from harness import (
    PARTITIONS,
    baseline_read,
    batch_profile,
    confluent_consume,
    emit,
    entities_in_redis,
    freshness,
    instrument,
    map_config,
    produce_bulk,
    services,
    setup_line,
)

from materializer import job
from materializer.spark.session import build_spark_session
from materializer.testing import create_topic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=5_000, help="freshness: events/s offered")
    parser.add_argument("--seconds", type=float, default=30, help="freshness: how long")
    parser.add_argument("--sample-every", type=int, default=10, help="freshness: follow 1 in N")
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()

    instrument()
    work = Path(tempfile.mkdtemp(prefix="materializer-bench-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        bootstrap, redis_url = stack.enter_context(services())
        setup_line(args.master, args.events, args.keys)

        topic = create_topic(bootstrap, PARTITIONS)
        emit(
            name="produce",
            units="events, s, events/s, bytes, MB/s",
            **produce_bulk(bootstrap, topic, args.events, args.keys),
        )

        cfg = map_config(bootstrap, redis_url, work, args.master, topic, "ingest")
        spark = build_spark_session(cfg.spark)
        stack.callback(spark.stop)

        a = baseline_read(spark, bootstrap, topic, args.events)

        # (b)
        b_seconds = confluent_consume(bootstrap, topic, args.events)
        b = args.events / b_seconds
        emit(
            name="b_confluent_consume",
            units="s, events/s",
            seconds=round(b_seconds, 2),
            events_per_s=round(b),
        )

        # (c)
        started = time.perf_counter()
        queries = job.start_map(spark, cfg, "ingest")
        try:
            queries.process_all_available()
            c_seconds = time.perf_counter() - started
            profile = batch_profile(queries.fold)
        finally:
            queries.stop()
        c = args.events / c_seconds
        entities = entities_in_redis(redis_url, "ingest")
        delta_rows = spark.read.format("delta").load(job.table_path(cfg, "ingest")).count()
        emit(
            name="c_slice_end_to_end",
            units="s, events/s",
            seconds=round(c_seconds, 2),
            events_per_s=round(c),
            entities_in_redis=entities,
            rows_in_delta=delta_rows,
            expected_entities=min(args.events, args.keys),
        )
        emit(name="c_batches", units="s (sums over the query's batches)", **profile)
        emit(
            name="ratios",
            c_over_a=round(c / a, 3),
            c_over_b=round(c / b, 3),
            target_c_over_a=0.5,
            meets_target=c / a >= 0.5,
        )

        result, fresh_profile = freshness(
            bootstrap,
            redis_url,
            spark,
            work,
            args.master,
            args.rate,
            args.seconds,
            args.keys,
            args.sample_every,
        )
        emit(
            name="freshness",
            units="events/s, ms",
            **result,
            meets_target=result["p99_ms"] <= 1000 and result["unresolved"] == 0,
        )
        emit(name="freshness_batches", units="s (sums over the query's batches)", **fresh_profile)
        emit(name="done", loadavg_1m=round(os.getloadavg()[0], 2))


if __name__ == "__main__":
    main()
