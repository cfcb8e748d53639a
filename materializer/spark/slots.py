"""The task slots the real-time path's queries may hold: each holds one per source partition
of its maps for as long as it runs (docs/decisions/0032-the-live-path-in-real-time-mode.md),
and a query that cannot have them all leaves partitions unread."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CLUSTER_KEPT_SLOTS = 2
"""On a cluster, the executors' task slots left to micro-batches (a catch-up, the Delta
queries)."""


def local_live_slots(master: str) -> int | None:
    """The task slots a local master leaves the real-time query beyond the cores' worth the
    other queries use (``spark.live_slots`` adds them); None on a cluster, whose slots are
    known once its executors have registered (``cluster_live_slots``)."""
    found = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", master)
    if found is None:
        return 0 if master == "local" else None
    return max(0, int(found.group(1)) - (os.cpu_count() or 1))


def cluster_live_slots(spark: SparkSession) -> int:
    """The tasks the registered executors run at once (their cores over ``spark.task.cpus``,
    Spark's own count: its default parallelism is whatever a config sets), less
    ``CLUSTER_KEPT_SLOTS``."""
    sc = spark.sparkContext._jsc.sc()
    slots = int(sc.maxNumConcurrentTasks(sc.resourceProfileManager().defaultResourceProfile()))
    return max(0, slots - CLUSTER_KEPT_SLOTS)
