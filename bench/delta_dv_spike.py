"""Spike: the Delta sink's MERGE with deletion vectors against without, and whether the
query service's reader (delta-rs) reads a table that has them.

All in one run, one Spark session: two tables of N entities, then batches of
K changed entities (updates, deletes, re-inserts; ``bench/delta_merge.py``'s
``changes``) merged by ``DeltaSink.write`` into each, alternately, so both
see the same work. A map at 5,000 events/s over 100k keys changes ~20k keys
per 5-second Delta trigger. Then delta-rs reads each table (latest and an
older version) and must find what Spark finds.

    .venv/bin/python bench/delta_dv_spike.py [--entities N] [--changes K] [--batches B]
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from typing import Any

from delta_merge import changes, delta_bench
from harness import emit, machine

from materializer.batch import Batch
from materializer.delta.sink import DeltaSink

DV_DEFAULT = "spark.databricks.delta.properties.defaults.enableDeletionVectors"


def rows_spark(spark: Any, path: str, version: int | None = None) -> set[tuple[Any, ...]]:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return {tuple(r) for r in reader.load(path).select("_key", "id", "name", "age").collect()}


def rows_rs(path: str, version: int | None = None) -> set[tuple[Any, ...]]:
    from deltalake import DeltaTable

    table = DeltaTable(path, version=version).to_pyarrow_table(
        columns=["_key", "id", "name", "age"]
    )
    return set(zip(*(table[c].to_pylist() for c in table.column_names), strict=True))


def _same(path: str, version: int | None, expected: set[tuple[Any, ...]]) -> bool | str:
    """Whether delta-rs reads what Spark reads, or why it cannot read the table."""
    from deltalake.exceptions import DeltaProtocolError

    try:
        return rows_rs(path, version) == expected
    except DeltaProtocolError as exc:
        return f"unreadable: {exc}"


def main() -> None:
    args, root, spark = delta_bench(__doc__, "delta-dv", 20_000, 8, "per table")
    emit(
        name="setup",
        **machine(),
        entities=args.entities,
        changes_per_batch=args.changes,
        batches_per_table=args.batches,
    )
    tables = {"without_dv": "false", "with_dv": "true"}
    sinks = {}
    for name, dv in tables.items():
        spark.conf.set(DV_DEFAULT, dv)
        sinks[name] = DeltaSink(str(root / name), engine="spark")
        rows = changes(spark, 0, args.entities, args.entities, 0)
        sinks[name].write(Batch(rows, 0, "bench", count=args.entities))
    seconds: dict[str, list[float]] = {name: [] for name in tables}
    for batch_id in range(1, args.batches + 1):
        for name in tables:
            rows = changes(spark, batch_id * args.changes, args.changes, args.entities, batch_id)
            rows.persist()
            rows.count()
            started = time.perf_counter()
            sinks[name].write(Batch(rows, batch_id, "bench", count=args.changes))
            seconds[name].append(time.perf_counter() - started)
            rows.unpersist()
    for name in tables:
        path = str(root / name)
        runs = seconds[name][1:]
        older = args.batches // 2
        same = _same(path, None, rows_spark(spark, path))
        same_older = _same(path, older, rows_spark(spark, path, older))
        emit(
            name=f"merge_{name}",
            units="s per batch",
            batches=len(runs),
            median_s=round(statistics.median(runs), 3),
            max_s=round(max(runs), 3),
            delta_rs_reads_latest_as_spark=same,
            delta_rs_reads_older_version_as_spark=same_older,
        )
    ratio = statistics.median(seconds["without_dv"][1:]) / statistics.median(seconds["with_dv"][1:])
    emit(name="ratio", without_over_with_dv=round(ratio, 2))
    emit(name="done", loadavg_1m=round(os.getloadavg()[0], 2))
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
