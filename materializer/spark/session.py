"""The one place a SparkSession is built: local jars, Delta, RocksDB state."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from materializer.config import SparkConfig
from materializer.jvm import jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def spark_conf(config: SparkConfig) -> dict[str, str]:
    """The settings every Materializer session carries; ``config.conf`` wins over them."""
    conf = {
        "spark.jars": ",".join(str(p) for p in jars("spark")),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        # A state-store fold commits a batch's changed keys only, not a RocksDB snapshot
        # per batch: 1.7x the bulk rate in bench/fold_spike.py.
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Each map's fold runs its jobs in a pool of its own (job.FOLD_POOL), so a batch
        # never queues behind all the tasks of a Delta MERGE submitted just before it.
        "spark.scheduler.mode": "FAIR",
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        # Each MERGE first rebuilds the table's snapshot from its log, by default in 50
        # tasks: far more than a map's table needs, and a per-batch cost on few cores.
        "spark.databricks.delta.snapshotPartitions": str(config.shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # Writes must stay readable by delta-rs in the query service: no deletion vectors.
        "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
    }
    conf.update(config.conf)
    return conf


def build_spark_session(config: SparkConfig, app_name: str = "materializer") -> SparkSession:
    """Get or create the process's session with Materializer's settings."""
    from pyspark.sql import SparkSession

    # Python workers must import the same packages as the driver (redis for the
    # Redis sink), so they run this interpreter unless the deployment says otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(config.master).appName(app_name)
    for key, value in spark_conf(config).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
