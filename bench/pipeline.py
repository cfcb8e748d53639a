"""Pipeline benchmark: each fold mode against the raw read of the same topic.

All in one run, on one broker, one Redis and one Spark session:

  produce     N JSON events (~200 bytes) over K keys into a 4-partition topic;
  baseline    Spark's batch ``kafka`` read + ``count()`` of the topic;
  floor_<q>   what Spark itself does with the same events (``floors.py``): the batch
              aggregation, the streaming one with state in RocksDB, the stateless decode;
  fold_<mode> the whole topic through decode, the fold (``latest``, ``merge``,
              ``aggregate``) and Redis, with the Delta query beside it as in a run:
              events/s until Redis holds the map, the ratio to the baseline and to
              each floor, and the time until the Delta table holds it too. Like the
              baseline, the line is the last of ``--rounds`` (a new map each): the
              first warms the JVM for the mode's plan; ``rounds_s`` lists them all;
  freshness   ``merge`` and ``aggregate`` maps, live and caught up, fed at a
              steady rate: produce-to-visible-in-Redis latency percentiles;
  redis_memory  Redis bytes per entity (``MEMORY USAGE``) against the entity's
              compact JSON, for each fold mode's map.

    .venv/bin/python bench/pipeline.py [--events N] [--keys K] [--rate R] [--seconds S]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from freshness import freshness
from harness import (
    PARTITIONS,
    baseline_read,
    batch_profile,
    emit,
    instrument,
    map_config,
    produce_bulk,
    services,
    setup_line,
)

from materializer import job
from materializer.contract.redis_layout import RESERVED_KEYS
from materializer.spark.session import build_spark_session
from materializer.testing import create_topic

AGGREGATES = {
    "events": {"fn": "count"},
    "score_total": {"fn": "sum", "field": "score"},
    "youngest": {"fn": "min", "field": "age"},
    "oldest": {"fn": "max", "field": "age"},
    "first_plan": {"fn": "first", "field": "plan"},
    "seq": {"fn": "last", "field": "seq"},
}
"""``last`` of ``seq`` lets the freshness probe see each event arrive."""

FOLDS: dict[str, dict[str, Any]] = {
    "latest": {"mode": "latest"},
    "merge": {"mode": "merge"},
    "aggregate": {"mode": "aggregate", "aggregates": AGGREGATES},
}


def entity_count(client: redis.Redis, map_name: str) -> int:
    return sum(
        1
        for k in client.scan_iter(match=f"{map_name}:*", count=10_000)
        if k.decode().split(":", 1)[1] not in RESERVED_KEYS
    )


def memory_per_entity(client: redis.Redis, map_name: str, samples: int) -> dict[str, Any]:
    """Mean ``MEMORY USAGE`` of sampled entity keys against their JSON value length."""
    rng = random.Random(5)
    keys = []
    for k in client.scan_iter(match=f"{map_name}:*", count=10_000):
        if k.decode().split(":", 1)[1] not in RESERVED_KEYS:
            keys.append(k)
    picked = rng.sample(keys, min(samples, len(keys)))
    pipe = client.pipeline(transaction=False)
    for k in picked:
        pipe.memory_usage(k, samples=0)
        pipe.strlen(k)
    answers = pipe.execute()
    usage = answers[0::2]
    json_bytes = answers[1::2]
    mean_usage = sum(usage) / len(usage)
    mean_json = sum(json_bytes) / len(json_bytes)
    return {
        "entities": len(keys),
        "sampled": len(picked),
        "redis_bytes_per_entity": round(mean_usage, 1),
        "json_bytes_per_entity": round(mean_json, 1),
        "overhead_ratio": round(mean_usage / mean_json, 3),
    }


def engine_floors(
    spark: Any, bootstrap: str, topic: str, work: Path, events: int, read_rate: float
) -> dict[str, float]:
    """What Spark itself does with the same events, as minimal queries (``floors.py``):
    seconds for the batch aggregation, the streaming one with state in RocksDB, and the
    stateless streaming decode; each emitted with its ratio to the raw read."""
    import functools

    from floors import aggregated, count_batch, run_stream, source, use_rocksdb

    started = time.perf_counter()
    aggregated(source(spark, bootstrap, topic, streaming=False)).count()
    floors = {"batch_agg": time.perf_counter() - started}
    counts: list[int] = []
    step = functools.partial(count_batch, counts)
    use_rocksdb(spark)
    frame = aggregated(source(spark, bootstrap, topic, streaming=True))
    floors["stream_agg"] = run_stream(frame, work, "floor_agg", step, output_mode="update")
    frame = source(spark, bootstrap, topic, streaming=True)
    floors["stateless"] = run_stream(frame, work, "floor_decode", step, output_mode="append")
    for name, seconds in floors.items():
        emit(
            name=f"floor_{name}",
            units="s, events/s",
            seconds=round(seconds, 2),
            events_per_s=round(events / seconds),
            ratio_to_spark_read=round(events / seconds / read_rate, 3),
        )
    return floors


def fold_once(
    spark: Any,
    bootstrap: str,
    redis_url: str,
    work: Path,
    args: argparse.Namespace,
    topic: str,
    mode: str,
    name: str,
) -> tuple[float, float, dict[str, Any], str]:
    """The whole topic folded by one map of ``mode``: seconds until Redis holds it, until
    the Delta table does too, the fold's batch profile, and the map's name."""
    cfg = map_config(bootstrap, redis_url, work, args.master, topic, name, FOLDS[mode])
    started = time.perf_counter()
    queries = job.start_map(spark, cfg, name)
    try:
        # Redis holds the map once the fold has taken everything; Delta follows.
        queries.fold.processAllAvailable()
        seconds = time.perf_counter() - started
        queries.process_all_available()
        with_delta = time.perf_counter() - started
        profile = batch_profile(queries.fold)
    finally:
        queries.stop()
    return seconds, with_delta, profile, name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=5_000, help="freshness: events/s offered")
    parser.add_argument("--seconds", type=float, default=30, help="freshness: how long")
    parser.add_argument("--sample-every", type=int, default=10, help="freshness: follow 1 in N")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--modes", default="latest,merge,aggregate")
    parser.add_argument(
        "--rounds", type=int, default=2, help="folds of each mode; the last one is its line"
    )
    args = parser.parse_args()
    modes = args.modes.split(",")

    instrument()
    work = Path(tempfile.mkdtemp(prefix="materializer-bench-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        bootstrap, redis_url = stack.enter_context(services())
        client = redis.Redis.from_url(redis_url)
        stack.callback(client.close)
        setup_line(args.master, args.events, args.keys)

        topic = create_topic(bootstrap, PARTITIONS)
        emit(name="produce", **produce_bulk(bootstrap, topic, args.events, args.keys))
        first = map_config(bootstrap, redis_url, work, args.master, topic, "bench_latest")
        spark = build_spark_session(first.spark)
        stack.callback(spark.stop)
        a = baseline_read(spark, bootstrap, topic, args.events)
        floors = engine_floors(spark, bootstrap, topic, work, args.events, a)

        for mode in modes:
            # As the raw read: the first round warms the JVM and the Python workers for
            # this mode's plan, the last one is the line (each round a map of its own).
            rounds = []
            for round_ in range(args.rounds):
                name = f"bench_{mode}_{round_}"
                rounds.append(fold_once(spark, bootstrap, redis_url, work, args, topic, mode, name))
            seconds, with_delta, profile, name = rounds[-1]
            entities = entity_count(client, name)
            expected = min(args.events, args.keys)
            if entities != expected:
                raise RuntimeError(f"{name}: {entities} entities in Redis, expected {expected}")
            emit(
                name=f"fold_{mode}",
                units="s, events/s",
                seconds=round(seconds, 2),
                events_per_s=round(args.events / seconds),
                ratio_to_spark_read=round(args.events / seconds / a, 3),
                **{
                    f"ratio_to_{name}": round(floor_s / seconds, 3)
                    for name, floor_s in floors.items()
                },
                entities_in_redis=entities,
                with_delta_seconds=round(with_delta, 2),
                with_delta_ratio_to_spark_read=round(args.events / with_delta / a, 3),
                rounds_s=[round(r[0], 2) for r in rounds],
            )
            emit(name=f"fold_{mode}_batches", units="s (sums over batches)", **profile)
            emit(name=f"redis_memory_{mode}", **memory_per_entity(client, name, 2_000))

        for mode in ("merge", "aggregate"):
            if mode not in modes:
                continue
            result, profile = freshness(
                bootstrap,
                redis_url,
                spark,
                work,
                args.master,
                args.rate,
                args.seconds,
                args.keys,
                args.sample_every,
                name=f"fresh_{mode}",
                fold=FOLDS[mode],
            )
            emit(name=f"freshness_{mode}", units="events/s, ms", **result)
            emit(name=f"freshness_{mode}_batches", units="s (sums over batches)", **profile)
        emit(name="done", loadavg_1m=round(os.getloadavg()[0], 2))


if __name__ == "__main__":
    main()
