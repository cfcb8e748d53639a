"""The one place a SparkSession is built: local jars, Delta, the scheduler's pools.

No map keeps state in Spark (the fold's state lives in Redis), so no state store is set up."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from materializer.clients.logs import spark_log4j2
from materializer.clients.object_store import hadoop_conf
from materializer.config import ObjectStoreConfig, SparkConfig
from materializer.jvm import jars, session_jars
from materializer.spark.class_archive import java_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

POOLS = """<?xml version="1.0"?>
<allocations>
  <pool name="fold">
    <schedulingMode>FIFO</schedulingMode><weight>10</weight><minShare>2</minShare>
  </pool>
  <pool name="delta">
    <schedulingMode>FIFO</schedulingMode><weight>1</weight><minShare>0</minShare>
  </pool>
  <pool name="catch_up">
    <schedulingMode>FIFO</schedulingMode><weight>1</weight><minShare>0</minShare>
  </pool>
</allocations>
"""
"""Spark's FAIR pools (``runtime.projector.FOLD_POOL``, ``DELTA_POOL``, ``CATCH_UP_POOL``):
below its minimum share a pool gets the next free slot, so the live folds' tasks go before
the Delta queries' and a catching-up map's."""


def conf_file(name: str, content: str) -> Path:
    """``content`` as a file the JVM reads, written once per machine and content.

    ``name`` is the file's name; a digest of the content goes before its suffix, so two
    versions of the product on one machine never read each other's file.
    """
    stem, _, suffix = name.rpartition(".")
    digest = hashlib.sha256(content.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"{stem}-{digest}.{suffix}"
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(content)
        partial.replace(path)
    return path


LOCAL_FS = {
    "spark.hadoop.fs.file.impl": "io.materializer.localfs.NioLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "io.materializer.localfs.NioRawLocalFs",
}
"""Hadoop's local file systems (``jvm/localfs``) with permissions set in the JVM: Hadoop's own
set those of each file and folder they create by running chmod in a child process, which a
stop signal to the run's whole process group kills under a checkpoint or a Delta commit
(the write fails, and the run with it), and a fork a file on every batch."""

IDLE_HEAP = [
    "-XX:G1PeriodicGCInterval=10000",
    "-XX:MaxHeapFreeRatio=30",
    "-XX:MinHeapFreeRatio=10",
]
"""The driver's heap given back while the run is idle: a collection every 10 s without
one, after which the heap keeps at most 30% of itself free. Starting many maps grows the
heap to its bound on plans that are garbage soon after; without these G1 keeps it all.
A hundred idle real-time maps' run held 244 MiB less (decision 0032); a busy run collects
often anyway, and no periodic collection comes then."""

HUGE_METHODS = "-XX:-DontCompileHugeMethods"
"""Generated code the JIT compiles whatever its size. HotSpot leaves a method of over 8,000
bytes of bytecode to the interpreter, and a stage that projects a wide row (a Debezium
envelope's columns read into their types: 14,231 bytes) is one such method. Decoding 300k
envelopes took 5.78 s interpreted, 3.52 s compiled, 3.88 s with Spark's own way out
(``hugeMethodLimit`` 8,000, which gives up whole-stage code generation for the stage);
through ``materializer run`` both plain JSON and envelope maps folded 7% faster
(decision 0035)."""

CLASS_PATHS = ("spark.driver.extraClassPath", "spark.executor.extraClassPath")
"""The class paths ``spark.jars: installed`` sets, which a config's own entries extend."""


def spark_conf(
    config: SparkConfig, object_store: ObjectStoreConfig | None = None
) -> dict[str, str]:
    """The settings every Materializer session carries; ``config.conf`` wins over them.

    With ``object_store``, hadoop-aws and its AWS SDK join the jars (only then: a session
    without one has no use for them) and the S3A client gets its endpoint and credentials.
    """
    local_jars = session_jars() + (jars("s3") if object_store is not None else [])
    conf = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # The folds' jobs run in a pool that takes every free task slot first, so a live
        # batch waits for the Delta MERGE's running tasks at most, never its queued ones.
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": str(conf_file("materializer-pools.xml", POOLS)),
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        # Each MERGE first rebuilds the table's snapshot from its log, by default in 50
        # tasks: far more than a map's table needs, and a per-batch cost on few cores.
        "spark.databricks.delta.snapshotPartitions": str(config.shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # Kafka credentials in the source and writer options (a JAAS line, a PEM key) stay
        # out of logged plans and event logs.
        "spark.redaction.regex": "(?i)secret|password|token|access[.]key|keystore[.]key|jaas",
        "spark.sql.redaction.options.regex": "(?i)url|secret|password|keystore[.]key|jaas",
        # Streaming checkpoints (offsets and commits logs: two small files a batch) go
        # through Hadoop's FileContext; on a local disk, without a checksum file beside
        # each, the two cost every batch less, a fixed cost that counts in the freshness
        # (docs/decisions/0011-checkpoint-logs-without-checksum-files.md). Only the
        # FileContext API: Delta and Parquet write through FileSystem, checksummed still.
        "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
        # Writes must stay readable by delta-rs in the query service: no deletion vectors.
        "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
    }
    if config.jars == "installed" or config.master.startswith("local"):
        # Where the jars are on the class path as Hadoop starts (shipped ones come later).
        conf.update(LOCAL_FS)
    classpath = ":".join(str(p) for p in local_jars)
    # The driver always has the jars: on its class path they are read as its JVM starts,
    # where its class data archive can hold them (``class_archive``). A local master's
    # executors are that JVM; other executors get them copied, or find them installed.
    conf["spark.driver.extraClassPath"] = classpath
    if config.jars == "installed":
        conf["spark.executor.extraClassPath"] = classpath
    elif not config.master.startswith("local"):
        conf["spark.jars"] = ",".join(str(p) for p in local_jars)
    if object_store is not None:
        conf.update(hadoop_conf(object_store))
    own_paths = {k: conf[k] for k in CLASS_PATHS if k in conf}
    conf.update(config.conf)
    for key, path in own_paths.items():
        # A class path the config adds goes after the product's jars, not instead of them.
        extra = config.conf.get(key)
        if extra and extra != path:
            conf[key] = f"{path}:{extra}"
    # Read as the driver's JVM starts. An option the config sets comes after ours and wins.
    options: list[str] = []
    log4j2 = spark_log4j2()
    if log4j2 is not None:
        log4j2_file = conf_file("materializer-log4j2.properties", log4j2)
        options.append(f"-Dlog4j2.configurationFile=file:{log4j2_file}")
    options += java_options(local_jars)
    options += [*IDLE_HEAP, HUGE_METHODS]
    own = conf.get("spark.driver.extraJavaOptions")
    conf["spark.driver.extraJavaOptions"] = " ".join([*options, *([own] if own else [])])
    # A cluster's executors run the generated code too.
    own = conf.get("spark.executor.extraJavaOptions")
    conf["spark.executor.extraJavaOptions"] = " ".join([HUGE_METHODS, *([own] if own else [])])
    return conf


def build_spark_session(
    config: SparkConfig,
    app_name: str = "materializer",
    object_store: ObjectStoreConfig | None = None,
) -> SparkSession:
    """Get or create the process's session with Materializer's settings."""
    from pyspark.sql import SparkSession

    # Python workers must import the same packages as the driver (redis for the
    # Redis sink), so they run this interpreter unless the deployment says otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = spark_conf(config, object_store)
    master = config.master
    if master == "local[*]":
        # Slots for the real-time query's tasks; every other job keeps the cores' parallelism.
        cores = os.cpu_count() or 1
        master = f"local[{cores + config.live_slots}]"
        conf.setdefault("spark.default.parallelism", str(cores))
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
