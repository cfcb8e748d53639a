"""Spike: what the ``merge`` fold's explicit-null search (``aux``) costs in Spark.

A JSON merge patch tells a member set to ``null`` from one left out; the
decoded record cannot, so ``merge`` looks the members up in the raw JSON
(``json_object_keys``). One run, one broker, one Spark session: N JSON events
over K keys read as one batch through each mode's own decode and columns (what
the fold hands to Python), forced with Spark's ``noop`` writer, in seconds and
as a ratio to the raw read of the same run:

  columns_<mode>        each fold mode's columns as the fold computes them;
  merge_aux_per_field   ``merge``'s columns with the member names looked up once per
                        field, inside one projection (Spark computes an expression once
                        per use there: the raw JSON parsed once per field);
  merge_without_aux     ``merge``'s columns without the search at all.

    .venv/bin/python bench/merge_aux_spike.py [--events N] [--keys K] [--rounds R]
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from harness import baseline_read, emit, map_config
from latest_bulk_spike import batch_events, bulk_topic, timed
from pipeline import FOLDS

from materializer.fold.merge import _flat, _members, _value, fields_of
from materializer.redis.fold import _AUX, ORDER, RedisFold, producer_settings
from materializer.redis.functions import FoldTarget
from materializer.spark.session import build_spark_session


def aux_per_field(records: Any, entity: Any) -> Any:
    """``merge``'s null search with each field's parent looked up where the field is."""
    from pyspark.sql import functions as F

    nulls = []
    for i, f in enumerate(_flat(fields_of(entity))):
        names = _members(f.path[:-1])
        if names is None:
            continue
        present = F.coalesce(F.array_contains(names, f.name), F.lit(False))
        nulls.append(F.when(present & _value(f.path).isNull(), F.lit(str(i))))
    return F.concat_ws(",", *nulls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2, help="the first one warms the JVM")
    args = parser.parse_args()
    from pyspark.sql import functions as F

    with contextlib.ExitStack() as stack:
        bootstrap, redis_url, topic, work = stack.enter_context(bulk_topic(args.events, args.keys))
        configs = {
            mode: map_config(bootstrap, redis_url, work, "local[*]", topic, mode, FOLDS[mode])
            for mode in FOLDS
        }
        spark = build_spark_session(configs["latest"].spark)
        stack.callback(spark.stop)
        read = baseline_read(spark, bootstrap, topic, args.events)

        def line(name: str, seconds: float) -> None:
            ratio = round(args.events / seconds / read, 3)
            emit(name=name, seconds=round(seconds, 2), ratio_to_read=ratio)

        for _ in range(args.rounds):
            for mode, cfg in configs.items():
                target = FoldTarget(
                    redis=cfg.redis,
                    map_name=mode,
                    changelog_topic=f"{topic}.changelog",
                    producer=producer_settings(cfg.kafka, 1_000_000),
                    dead_letter_topic=None,
                    ttl_ms=None,
                    changes_max_len=100_000,
                    deleted_retention_ms=86_400_000,
                )
                fold = RedisFold(target, cfg.map(mode).fold)
                events = batch_events(spark, cfg, mode, fold)
                columns = fold.arrow_columns(events)
                line(f"columns_{mode}", timed(columns))
                if mode != "merge":
                    continue
                line("merge_without_aux", timed(columns.drop(_AUX)))
                folds = F.col(ORDER).isNotNull()
                entity = fold.entity_type(events)
                per_field = F.when(folds, aux_per_field(events, entity)).alias(_AUX)
                old = fold.arrow_columns(events.drop(_AUX).select("*", per_field))
                line("merge_aux_per_field", timed(old))


if __name__ == "__main__":
    main()
