"""Spike: where a large ``latest`` batch's time goes on the executors, and which plan keeps
the most of Spark's raw read.

One run, one broker, one Redis, one Spark session; N JSON events over K keys in
a 4-partition topic, read as one batch through the map's own decode, transforms
and keys. Each line forces a plan with Spark's ``noop`` writer (nothing reaches
Redis) and reports seconds and the ratio to the raw read of the same run:

  read_warm     the raw read again, once the JVM has run it four more times;
  events        the map's events (decode, keys, order), nothing else;
  payload       and every record's entity as JSON (the columns Python takes);
  observed      the same with Spark's ``observe`` of the metrics' newest timestamp and
                dead letters, as ``materializer run`` computed them before the fold
                counted them on its own Arrow rows;
  repartition   and shuffled by key, as the fold does for a field key;
  winners       each key's winner picked by Spark (``max_by`` over a struct), then JSON;
  handover      shuffled by key and handed to Python workers, which only count the rows;
  apply_*       the whole fold into Redis and the changelog, per plan (a new map each
                round, so the last rounds run warm).

    .venv/bin/python bench/latest_bulk_spike.py [--events N] [--keys K]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import (
    baseline_read,
    emit,
    map_config,
    produce_bulk,
    services,
    setup_line,
    spark_read_count,
)

from materializer import record_columns as c
from materializer.contract.markers import mark_whole
from materializer.job import assign_keys
from materializer.redis.fold import _AUX as AUX
from materializer.redis.fold import (
    ORDER,
    RedisFold,
    _apply_partition,
    producer_settings,
)
from materializer.redis.functions import FoldTarget, load_library
from materializer.redis.watermark import client_for
from materializer.source.decode import decode
from materializer.source.kafka import kafka_options
from materializer.source.transforms import apply_transforms
from materializer.spark.session import build_spark_session
from materializer.testing import create_topic


def winners(events: Any) -> Any:
    """The candidate: ``latest``'s events reduced by Spark to each key's record with the
    greatest order (combined before the shuffle), and every failed record as its own
    group, so that only winners become JSON and cross to Python."""
    from pyspark.sql import functions as F

    folds = F.col(ORDER).isNotNull()
    kept = [c.KEY, ORDER, c.ENTITY, AUX, c.DELETED, c.ERROR_STAGE, c.ERROR_MESSAGE]
    kept += [c.TOPIC, c.PARTITION, c.OFFSET]
    record = F.struct(
        *[F.col(name) for name in kept],
        *[F.when(~folds, F.col(name)).alias(name) for name in (c.KAFKA_KEY, c.VALUE, c.HEADERS)],
    )
    failed = F.when(~folds, F.struct(F.col(c.TOPIC), F.col(c.PARTITION), F.col(c.OFFSET)))
    picked = F.max_by(record, F.coalesce(F.col(ORDER), F.lit("")))
    return (
        events.groupBy(F.when(folds, F.col(c.KEY)).alias("__group"), failed.alias("__failed"))
        .agg(picked.alias("__winner"))
        .select("__winner.*")
    )


def batch_events(
    spark: Any, cfg: Any, name: str, fold: RedisFold, *, observed: bool = False
) -> Any:
    """The map's events as ``RedisFold.events`` computes them, from a batch read; with
    ``observed``, through the fold's metrics observation as ``job`` adds it."""
    map_config_ = cfg.map(name)
    reader = spark.read.format("kafka")
    options = kafka_options(cfg, map_config_.source.topics, "earliest")
    for key, value in options.items():
        reader = reader.option(key, value)
    raw = reader.load()
    raw = raw.select(*[raw[n].alias(a) for n, a in c.SOURCE_COLUMNS.items()])
    keyed = assign_keys(apply_transforms(decode(raw, map_config_), []), map_config_)
    return fold.events(observe(keyed) if observed else keyed)


def observe(records: Any) -> Any:
    """The metrics' two observations as the fold's query carried them: the newest Kafka
    timestamp of the records that fold, and how many fail."""
    from pyspark.sql import functions as F

    folds = F.col(c.ERROR_STAGE).isNull()
    newest = F.max(F.when(folds, F.unix_micros(F.col(c.TIMESTAMP)))).alias("newest")
    failed = F.count(F.when(~folds, F.lit(1))).alias("records")
    return records.observe("fold_input", newest).observe("dead_letters", failed)


def count_rows(batches: Iterator[Any]) -> Iterator[Any]:
    """A Python worker that takes its partition's Arrow batches and only counts them."""
    import pyarrow as pa

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"keys": [rows], "dead_letters": [0]})


def timed(frame: Any) -> float:
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


@contextlib.contextmanager
def bulk_topic(events: int, keys: int) -> Iterator[tuple[str, str, str, Path]]:
    """A broker, a Redis and a work folder, and a 4-partition topic of ``events`` JSON
    events over ``keys``: (bootstrap servers, Redis URL, topic, folder)."""
    work = Path(tempfile.mkdtemp(prefix="materializer-spike-"))
    try:
        with services() as (bootstrap, redis_url):
            setup_line("local[*]", events, keys)
            topic = create_topic(bootstrap, 4)
            produce_bulk(bootstrap, topic, events, keys)
            yield bootstrap, redis_url, topic, work
    finally:
        shutil.rmtree(work, True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2, help="of the Spark-only lines")
    args = parser.parse_args()
    from pyspark.sql import functions as F

    with contextlib.ExitStack() as stack:
        bootstrap, redis_url, topic, work = stack.enter_context(bulk_topic(args.events, args.keys))
        cfg = map_config(bootstrap, redis_url, work, "local[*]", topic, "spike")
        spark = build_spark_session(cfg.spark)
        stack.callback(spark.stop)
        read = baseline_read(spark, bootstrap, topic, args.events)
        warm = [spark_read_count(spark, bootstrap, topic)[0] for _ in range(4)]
        emit(name="read_warm", seconds=round(min(warm), 2), runs_s=[round(s, 2) for s in warm])
        load_library(cfg.redis)
        changelog = f"{topic}.changelog"
        create_topic(bootstrap, 4, name=changelog)
        target = FoldTarget(
            redis=cfg.redis,
            map_name="spike",
            changelog_topic=changelog,
            producer=producer_settings(cfg.kafka, 1_000_000),
            dead_letter_topic=None,
            ttl_ms=None,
            changes_max_len=100_000,
            deleted_retention_ms=86_400_000,
        )
        fold = RedisFold(target, cfg.map("spike").fold)
        events = batch_events(spark, cfg, "spike", fold)

        def line(name: str, seconds: float) -> None:
            ratio = round(args.events / seconds / read, 3)
            emit(name=name, seconds=round(seconds, 2), ratio_to_read=ratio)

        observed = batch_events(spark, cfg, "spike", fold, observed=True)
        counted = "keys long, dead_letters long"
        applied = counted + ", newest_timestamp_us long"  # the apply's row (``Applied``)
        for _ in range(args.rounds):
            line("events", timed(events))
            line("payload", timed(fold.arrow_columns(events)))
            line("observed", timed(fold.arrow_columns(observed)))
            line("repartition", timed(fold.arrow_columns(events).repartition(F.col(c.KEY))))
            line("winners", timed(fold.arrow_columns(winners(events))))
            started = time.perf_counter()
            shuffled = fold.arrow_columns(events).repartition(F.col(c.KEY))
            shuffled.mapInArrow(count_rows, counted).collect()
            line("handover", time.perf_counter() - started)
        for round_ in range(args.rounds):
            for plan in ("repartition", "winners"):
                name = f"spike_{plan}_{round_}"
                planned = RedisFold(replace(target, map_name=name), cfg.map("spike").fold)
                mark_whole(client_for(cfg.redis), name)
                planned_events = batch_events(spark, cfg, "spike", planned)
                started = time.perf_counter()
                if plan == "winners":
                    columns = planned.arrow_columns(winners(planned_events))
                else:
                    columns = planned.arrow_columns(planned_events).repartition(F.col(c.KEY))
                step = functools.partial(_apply_partition, planned.target, 1, "spike", None)
                columns.mapInArrow(step, applied).collect()
                line(f"apply_{plan}", time.perf_counter() - started)


if __name__ == "__main__":
    main()
