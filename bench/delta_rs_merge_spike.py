"""Spike: the map's Delta MERGE done by Spark (the Delta sink) against done by delta-rs
from the batch's Arrow rows, in wall time and in the machine's CPU.

All in one run, one Spark session: two tables of N entities created the way
the Delta sink creates them, then batches of K changed entities (updates,
deletes, re-inserts; ``bench/delta_merge.py``'s ``changes``). Each batch goes
into one table through ``DeltaSink.write`` and into the other through
``toArrow()`` and delta-rs's ``merge`` with the same clauses and the batch's
app transaction, alternately, so both see the same work. A map at 5,000
events/s over 100k keys changes ~20k keys per 5-second Delta trigger.

``cpu_core_s`` is the busy time of every core of the machine over the call
(from ``/proc/stat``): Spark's work runs in its JVM, delta-rs's in this
process's threads. At the end both tables must hold the same rows, read by
Spark, and delta-rs's must answer the batch's transaction version.

    .venv/bin/python bench/delta_rs_merge_spike.py [--entities N] [--changes K] [--batches B]
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from typing import Any

from delta_merge import changes, delta_bench
from harness import emit, machine

from materializer import record_columns as c
from materializer.batch import Batch
from materializer.delta.sink import DeltaSink

APP_ID = "bench"


def busy_seconds() -> float:
    """Busy core-seconds of the whole machine since boot."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def merge_rs(path: str, rows: Any, batch_id: int) -> None:
    """The Delta sink's MERGE, by delta-rs from the batch's Arrow rows."""
    from deltalake import CommitProperties, DeltaTable, Transaction

    table = DeltaTable(path)
    done = table.transaction_version(APP_ID)
    if done is not None and done >= batch_id:
        return
    entity = rows.schema[c.ENTITY].dataType
    fields = [f.name for f in entity.fields]
    source = rows.select(
        rows[c.KEY].alias(c.TABLE_KEY),
        rows[c.DELETED].alias("__deleted"),
        *[rows[c.ENTITY].getField(f).alias(f) for f in fields],
    ).toArrow()
    assignments = {f: f"s.`{f}`" for f in [c.TABLE_KEY, *fields]}
    (
        table.merge(
            source,
            predicate=f"t.{c.TABLE_KEY} = s.{c.TABLE_KEY}",
            source_alias="s",
            target_alias="t",
            commit_properties=CommitProperties(app_transactions=[Transaction(APP_ID, batch_id)]),
        )
        .when_matched_delete(predicate="s.__deleted")
        .when_matched_update(updates=assignments, predicate="NOT s.__deleted")
        .when_not_matched_insert(updates=assignments, predicate="NOT s.__deleted")
        .execute()
    )


def main() -> None:
    args, root, spark = delta_bench(__doc__, "delta-rs-merge", 20_000, 10, "per writer")
    emit(
        name="setup",
        **machine(),
        entities=args.entities,
        changes_per_batch=args.changes,
        batches_per_writer=args.batches,
    )
    paths = {"spark": str(root / "spark"), "delta_rs": str(root / "delta_rs")}
    sinks = {name: DeltaSink(path, engine="spark") for name, path in paths.items()}
    for sink in sinks.values():
        sink.write(Batch(changes(spark, 0, args.entities, args.entities, 0), 0, APP_ID))

    wall: dict[str, list[float]] = {name: [] for name in paths}
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    batch_id = 1
    for _ in range(args.batches):
        rows = changes(spark, batch_id * args.changes, args.changes, args.entities, batch_id)
        for name in paths:
            started, busy = time.perf_counter(), busy_seconds()
            if name == "spark":
                sinks[name].write(Batch(rows, batch_id, APP_ID))
            else:
                merge_rs(paths[name], rows, batch_id)
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(busy_seconds() - busy)
        batch_id += 1
    for name in paths:
        runs, cores = wall[name][2:], cpu[name][2:]  # the first batches warm up
        emit(
            name=f"merge_{name}",
            units="s per batch",
            batches=len(runs),
            median_s=round(statistics.median(runs), 3),
            max_s=round(max(runs), 3),
            cpu_core_s_median=round(statistics.median(cores), 3),
        )

    def rows_of(path: str) -> set[tuple[Any, ...]]:
        table = spark.read.format("delta").load(path).select(c.TABLE_KEY, "id", "name", "age")
        return {tuple(r) for r in table.collect()}

    from deltalake import DeltaTable

    same = rows_of(paths["spark"]) == rows_of(paths["delta_rs"])
    replayed = DeltaTable(paths["delta_rs"]).version()
    merge_rs(paths["delta_rs"], changes(spark, 0, 10, args.entities, 1), batch_id - 1)
    emit(
        name="ratio",
        spark_over_delta_rs_wall=round(
            statistics.median(wall["spark"][2:]) / statistics.median(wall["delta_rs"][2:]), 2
        ),
        spark_over_delta_rs_cpu=round(
            statistics.median(cpu["spark"][2:]) / statistics.median(cpu["delta_rs"][2:]), 2
        ),
        same_rows=same,
        txn_version=DeltaTable(paths["delta_rs"]).transaction_version(APP_ID),
        replay_committed_nothing=DeltaTable(paths["delta_rs"]).version() == replayed,
    )
    emit(name="done", loadavg_1m=round(os.getloadavg()[0], 2))
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
