"""The pipeline on a Spark standalone cluster gives exactly what local mode gives.

One topic is folded twice: in local mode in this process, and by ``materializer
run`` against a master with two workers, so that large batches are applied to
Redis from executors' Python workers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
import yaml

from materializer.contract.table_layout import table_path
from materializer.job import start_map
from materializer.spark import slots
from materializer.spark.slots import cluster_live_slots
from materializer.testing import free_port, produce
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import fold_latest
from materializer.testing.spark_cluster import SparkStandalone, get_json
from materializer.testing.waiting import wait_until
from tests.helpers.slices import (
    FIELDS,
    config,
    delta_map_rs,
    delta_map_spark,
    end_offsets,
    redis_map,
    slice_config,
    user_events,
    watermark,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# Several batches per run, so that each fold state is loaded back from its checkpoint.
MAX_OFFSETS_PER_TRIGGER = 400


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    # A work dir pytest keeps: the daemons' and executors' logs outlive a failure.
    workdir = tmp_path_factory.mktemp("spark-standalone")
    with SparkStandalone(
        workers=2, cores_per_worker=1, memory_per_worker="1g", workdir=workdir
    ) as c:
        yield c


def _wait_running(proc: ManagedProcess, what: str, condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` while the run is up; a store not written yet counts as not yet."""

    def alive() -> bool:
        assert proc.alive(), f"materializer run exited while waiting for {what}:\n{proc.tail()}"
        return True

    wait_until(what, condition, 600, alive, retry_errors=True)


def _executor_tasks(ui_port: int, app_id: str) -> dict[str, int]:
    """Completed tasks per executor id, from the driver's REST API (the driver excluded)."""
    url = f"http://127.0.0.1:{ui_port}/api/v1/applications/{app_id}/executors"
    return {e["id"]: e["completedTasks"] for e in get_json(url) if e["id"] != "driver"}


@pytest.mark.timeout(1500)  # a local run beside a cluster of four JVMs: slow on a busy machine
def test_standalone_cluster_matches_local_mode_and_reference(
    spark: SparkSession,
    cluster: SparkStandalone,
    kafka_bootstrap: str,
    redis_url: str,
    redis_client: redis.Redis,
    new_topic: Callable[[int], str],
    tmp_path: Path,
) -> None:
    topic = new_topic(4)
    records = user_events(900, 120, seed=21)
    records += [(f"u{i}".encode(), None) for i in range(0, 120, 7)]  # tombstones of live keys
    positions = produce(kafka_bootstrap, topic, records)
    events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
    reference = fold_latest(events, "id", FIELDS)
    ends = {topic: end_offsets(positions)}
    assert len(ends[topic]) == 4 and "u0" not in reference

    limits = {"max_offsets_per_trigger": MAX_OFFSETS_PER_TRIGGER}
    local_cfg = config(
        slice_config(tmp_path, kafka_bootstrap, redis_url, topic, "local_users", spark=limits)
    )
    ui_port = free_port()
    cluster_doc = slice_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        "cluster_users",
        spark={
            **limits,
            "master": cluster.master_url,
            # As the chart runs executors: the jars at the same paths on every executor,
            # on their class paths, nothing copied from the driver.
            "jars": "installed",
            "conf": {
                "spark.driver.memory": "1g",
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.memory": "512m",
                "spark.executor.cores": "1",
                "spark.cores.max": "2",
                # The driver's REST API tells which executors ran tasks.
                "spark.ui.enabled": "true",
                "spark.ui.port": str(ui_port),
            },
        },
    )
    cluster_cfg = config(cluster_doc)
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(cluster_doc))

    # The cluster run's JVMs start while this process folds the topic in local mode.
    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    proc = ManagedProcess(args, tmp_path / "run.log")
    try:
        local = start_map(spark, local_cfg, "local_users")
        try:
            local.process_all_available()
        finally:
            local.stop()

        cluster_table = Path(table_path(cluster_cfg, "cluster_users"))
        _wait_running(
            proc,
            "the cluster run's watermark at the topic's end",
            lambda: (
                (w := watermark(redis_client, "cluster_users")) is not None and w.offsets == ends
            ),
        )
        # The table trails Redis by its own query's trigger: wait for it while the run is up.
        _wait_running(
            proc, "the cluster run's Delta table", lambda: delta_map_rs(cluster_table) == reference
        )

        # The work ran on the cluster: one application, an executor on each worker, and
        # every one of those executors completed tasks of this run.
        apps = cluster.state()["activeapps"]
        assert [a["name"] for a in apps] == ["materializer"], apps
        app_id = apps[0]["id"]
        by_worker = cluster.executors_by_worker(app_id)
        assert len(by_worker) == 2 and all(len(ids) == 1 for ids in by_worker.values()), by_worker
        tasks = _executor_tasks(ui_port, app_id)
        assert sorted(tasks) == sorted(ids[0] for ids in by_worker.values()), (tasks, by_worker)
        assert all(done > 0 for done in tasks.values()), tasks
        # The executors loaded Kafka's and Delta's classes from their class paths: no jar
        # was copied to them.
        files = cluster.executor_files(app_id)
        assert any(f.name == "stderr" for f in files), files
        assert not [f for f in files if f.suffix == ".jar"], files
    finally:
        proc.stop()
    assert proc.proc.returncode == 0, proc.tail()

    local_table = Path(table_path(local_cfg, "local_users"))
    cluster_map = redis_map(redis_client, "cluster_users")
    assert cluster_map == redis_map(redis_client, "local_users")
    assert cluster_map == reference
    cluster_rows: dict[str, Any] = delta_map_rs(cluster_table)
    assert cluster_rows == delta_map_rs(local_table) == reference
    assert delta_map_spark(spark, cluster_table) == reference

    local_mark = watermark(redis_client, "local_users")
    cluster_mark = watermark(redis_client, "cluster_users")
    assert local_mark is not None and cluster_mark is not None
    assert local_mark.offsets == cluster_mark.offsets == ends
    # Each run took several batches: its later batches folded onto state it had stored.
    assert local_mark.batch_id > 0 and cluster_mark.batch_id > 0


def test_the_real_time_path_counts_the_tasks_spark_runs_at_once(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cluster a map joins the real-time path only if its partitions fit the slots
    Spark says its executors have, less the micro-batches' two; local[2] runs two tasks."""
    assert spark.sparkContext.master == "local[2]"
    assert cluster_live_slots(spark) == 0
    monkeypatch.setattr(slots, "CLUSTER_KEPT_SLOTS", 0)
    assert cluster_live_slots(spark) == 2
