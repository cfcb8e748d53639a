"""``materializer run``: every map's queries in one Spark session, until told to stop.

A map whose query fails is reported and the others keep running. A stop
request lets each query finish the batch it is in before stopping it; a batch
cut short anyway (a second signal, a timeout) is replayed on the next start
and changes nothing twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from materializer.config import AppConfig
from materializer.pipeline.job import MapQueries, start_map
from materializer.pipeline.progress import BatchLog
from materializer.spark.session import build_spark_session

log = logging.getLogger(__name__)

FINISH_BATCH_TIMEOUT = 120.0


def _finish_and_stop(queries: MapQueries) -> None:
    for query in queries.queries:
        deadline = time.monotonic() + FINISH_BATCH_TIMEOUT
        while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.05)
        query.stop()


def run_maps(config: AppConfig, names: Sequence[str], stop: threading.Event) -> list[str]:
    """Run the named maps until ``stop`` is set or all have failed; returns the failed maps."""
    spark = build_spark_session(config.spark)
    batch_log = BatchLog()
    spark.streams.addListener(batch_log)
    running: dict[str, MapQueries] = {}
    failed: list[str] = []
    try:
        for name in names:
            running[name] = start_map(spark, config, name, batch_log)
        while not stop.is_set() and running:
            for name, queries in list(running.items()):
                broken = [q for q in queries.queries if not q.isActive]
                if broken:
                    error = broken[0].exception()
                    log.error("map %s failed, the others keep running: %s", name, error)
                    queries.stop()
                    del running[name]
                    failed.append(name)
            stop.wait(0.5)
    finally:
        for queries in running.values():
            _finish_and_stop(queries)
        spark.stop()
    return failed
