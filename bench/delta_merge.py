"""Delta benchmark: the Delta sink's MERGE per batch, Delta's default snapshot parallelism
against the map's.

All in one run, one Spark session, no Kafka or Redis: a table of N entities,
then batches of K changed entities (updates, deletes, and inserts of keys
deleted before) merged by ``DeltaSink.write``, as the map's Delta query does.

  baseline   ``spark.databricks.delta.snapshotPartitions`` at Delta's default (50):
             each MERGE rebuilds the table's snapshot from its log in 50 tasks;
  map        the setting Materializer gives every session: the map's
             ``spark.shuffle_partitions``.

The two alternate batch by batch on the same table, so both see the same log
length; ``ratio`` is the baseline's median MERGE time over the map's.

    .venv/bin/python bench/delta_merge.py [--entities N] [--changes K] [--batches B]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import emit, machine

from materializer import record_columns as c
from materializer.batch import Batch
from materializer.config import SparkConfig
from materializer.delta.sink import DeltaSink
from materializer.spark.session import build_spark_session

SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
DELTA_DEFAULT = "50"
SHUFFLE_PARTITIONS = 4  # the config's default


def changes(spark: Any, start: int, n: int, keys: int, batch: int) -> Any:
    """``n`` folded rows as the fold hands them to the sinks, ids ``start`` on over ``keys`` keys.

    Batch 0 loads every key. Later batches update; on the first pass over the
    keys one id in ten deletes its key, and on the next pass that key comes
    back: each MERGE updates, deletes and, once the ids wrap, inserts.
    """
    from pyspark.sql import functions as F

    ids = F.col("id")
    key = F.concat(F.lit("u"), (ids % keys).cast("string"))
    deleted = (ids % 10 == 0) & ((ids / keys).cast("long") % 2 == 0) & F.lit(batch > 0)
    return spark.range(start, start + n).select(
        key.alias(c.KEY),
        deleted.alias(c.DELETED),
        F.struct(
            key.alias("id"),
            F.concat(F.lit("name "), F.lit(batch).cast("string")).alias("name"),
            (ids % 90).cast("long").alias("age"),
        ).alias(c.ENTITY),
    )


def live_keys(keys: int, per_batch: int, batches: int) -> int:
    """How many keys the batches before ``batches`` leave, folded in plain Python."""
    live = set(range(keys))
    for i in range(per_batch, batches * per_batch):
        if i % 10 == 0 and (i // keys) % 2 == 0:
            live.discard(i % keys)
        else:
            live.add(i % keys)
    return len(live)


def delta_bench(
    doc: str, name: str, changes: int, batches: int, per: str
) -> tuple[argparse.Namespace, Path, Any]:
    """The Delta benches' arguments (``--entities``, ``--changes``, ``--batches``), a scratch
    folder and a Spark session with the map's default shuffle partitions."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--changes", type=int, default=changes)
    parser.add_argument("--batches", type=int, default=batches, help=per)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    spark = build_spark_session(
        SparkConfig(
            master="local[*]",
            checkpoint_root=str(root / "checkpoints"),
            shuffle_partitions=SHUFFLE_PARTITIONS,
        ),
        app_name=f"bench-{name}",
    )
    return args, root, spark


def main() -> None:
    args, root, spark = delta_bench(__doc__, "delta-merge", 2_000, 30, "per setting")
    emit(
        name="setup",
        **machine(),
        entities=args.entities,
        changes_per_batch=args.changes,
        batches_per_setting=args.batches,
        shuffle_partitions=SHUFFLE_PARTITIONS,
    )
    sink = DeltaSink(str(root / "table"), engine="spark")
    sink.write(Batch(changes(spark, 0, args.entities, args.entities, 0), 0, "bench"))

    settings = {"baseline": DELTA_DEFAULT, "map": str(SHUFFLE_PARTITIONS)}
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    batch_id = 1
    for _ in range(args.batches):
        for name, partitions in settings.items():
            spark.conf.set(SNAPSHOT_PARTITIONS, partitions)
            rows = changes(spark, batch_id * args.changes, args.changes, args.entities, batch_id)
            started = time.perf_counter()
            sink.write(Batch(rows, batch_id, "bench"))
            seconds[name].append(time.perf_counter() - started)
            batch_id += 1
    for name, partitions in settings.items():
        runs = seconds[name][3:]  # the first batches warm the JVM up
        emit(
            name=f"merge_{name}",
            units="s per batch",
            snapshot_partitions=int(partitions),
            batches=len(runs),
            median_s=round(statistics.median(runs), 3),
            p90_s=round(statistics.quantiles(runs, n=10)[-1], 3),
        )
    ratio = statistics.median(seconds["baseline"][3:]) / statistics.median(seconds["map"][3:])
    live = spark.read.format("delta").load(str(root / "table")).count()
    expected = live_keys(args.entities, args.changes, batch_id)
    if live != expected:
        raise RuntimeError(f"the table holds {live} rows, the batches leave {expected} keys")
    emit(name="ratio", baseline_over_map=round(ratio, 2), table_rows=live)
    emit(name="done", loadavg_1m=round(os.getloadavg()[0], 2))
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
