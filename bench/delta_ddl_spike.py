"""Who creates a map's Delta table: Spark's ``CREATE`` on the run's JVM, or delta-rs.

A run's Delta query creates its table in its first batch, beside the fold's
first batch. This times each candidate on a session just started, as a run
has it: wall seconds, and the CPU seconds the driver's JVM spent meanwhile
(its JIT and class loading included, which the fold's batch waits for on
two cores).

  spark_cold   ``DeltaTable.createIfNotExists`` on a JVM that ran no Delta code yet;
  spark_warm   the same for a second table;
  delta_rs     ``deltalake.DeltaTable.create`` of the same schema.

    .venv/bin/python bench/delta_ddl_spike.py
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import emit

from materializer.config import parse_config
from materializer.spark.session import build_spark_session

SCHEMA = (
    "_key STRING NOT NULL, id STRING, name STRING, age INT, plan STRING, score DOUBLE, "
    "seq BIGINT, address STRUCT<city: STRING, zip: STRING>, tags ARRAY<STRING>"
)


def jvm_cpu_s(spark: Any) -> float:
    """CPU seconds the session's JVM has used (user + system), from /proc."""
    pid = spark.sparkContext._gateway.proc.pid
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    from deltalake import DeltaTable as RsTable
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    work = Path(tempfile.mkdtemp(prefix="materializer-ddl-"))
    try:
        config = parse_config(
            {
                "kafka": {"bootstrap_servers": "localhost:9092"},
                "redis": {"url": "redis://localhost:6379"},
                "delta": {"root": str(work / "warehouse")},
                "spark": {"checkpoint_root": str(work / "checkpoints")},
                "maps": {},
            }
        )
        started = time.perf_counter()
        spark = build_spark_session(config.spark)
        emit(name="session", units="s", seconds=round(time.perf_counter() - started, 2))
        schema = T._parse_datatype_string(SCHEMA)
        assert isinstance(schema, T.StructType)
        from delta.tables import DeltaTable

        for name in ("spark_cold", "spark_warm"):
            cpu, wall = jvm_cpu_s(spark), time.perf_counter()
            path = str(work / name)
            DeltaTable.createIfNotExists(spark).location(path).addColumns(schema).execute()
            DeltaTable.forPath(spark, path).toDF().columns  # noqa: B018 - as the sink reads them
            emit(
                name=name,
                units="s",
                seconds=round(time.perf_counter() - wall, 3),
                jvm_cpu_s=round(jvm_cpu_s(spark) - cpu, 2),
            )
        cpu, wall = jvm_cpu_s(spark), time.perf_counter()
        proc = time.process_time()
        path = str(work / "delta_rs")
        table = RsTable.create(path, to_arrow_schema(schema, timezone="UTC"))
        [f.name for f in table.schema().fields]  # noqa: B018 - as the sink reads them
        emit(
            name="delta_rs",
            units="s",
            seconds=round(time.perf_counter() - wall, 3),
            jvm_cpu_s=round(jvm_cpu_s(spark) - cpu, 2),
            python_cpu_s=round(time.process_time() - proc, 3),
        )
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
