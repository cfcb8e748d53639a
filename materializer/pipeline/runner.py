"""``materializer run``: every map's and enrichment's queries in one Spark session.

Enrichments are supervised as maps are (``<enrichment>:__control__`` and
``__status__`` work the same), in the same loop, until told to stop.

A supervisor loop watches each map: a map whose query fails is reported and
the others keep running; operators' requests in ``<map>:__control__`` (pause,
resume, restart) are obeyed within one loop, and each map's state and rates
go to ``<map>:__status__``. Pausing stops a map's queries after the batch in
flight, so its offsets stay put; resuming starts them again from their
checkpoints, so nothing is lost or folded twice. A stop request lets each
query finish the batch it is in before stopping it; a batch cut short anyway
(a second signal, a timeout) is replayed on the next start and changes
nothing twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from materializer.config import AppConfig
from materializer.enrichment.job import start_enrichment
from materializer.errors import MaterializerError
from materializer.layout import Control, MapReport
from materializer.pipeline.control import ControlChannel
from materializer.pipeline.job import MapQueries, start_map
from materializer.pipeline.metrics import BatchMetrics, serve_metrics
from materializer.pipeline.progress import BatchLog
from materializer.spark.session import build_spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

LOOP_SECONDS = 0.5


@dataclass
class _Map:
    """One map under supervision."""

    name: str
    state: str = "stopped"
    queries: MapQueries | None = None
    error: str = ""
    restart_id: str = ""

    def report(self) -> MapReport:
        """The map's state and its fold's latest rates."""
        rates = (0.0, 0.0)
        if self.queries is not None and self.state == "running":
            progress: dict[str, Any] = self.queries.fold.lastProgress or {}
            rates = (
                float(progress.get("inputRowsPerSecond") or 0.0),
                float(progress.get("processedRowsPerSecond") or 0.0),
            )
        return MapReport(
            state=self.state,
            error=self.error,
            input_rows_per_second=rates[0],
            processed_rows_per_second=rates[1],
        )


class Supervisor:
    """Starts, pauses, resumes, restarts and watches the maps of one run."""

    def __init__(
        self,
        spark: SparkSession,
        config: AppConfig,
        batch_log: BatchLog,
        generation: Callable[[str], int] = lambda _: 0,
        metrics: BatchMetrics | None = None,
    ) -> None:
        self._spark = spark
        self._config = config
        self._batch_log = batch_log
        self._generation = generation
        self._metrics = metrics

    def start(self, m: _Map) -> None:
        """Start a map's queries on its current generation; a start that fails marks it failed.

        The generation is read at every start, so a map a rebuild switched over
        while paused resumes on the new copy of its data.
        """
        try:
            if m.name in self._config.enrichments:
                m.queries = start_enrichment(
                    self._spark, self._config, m.name, self._batch_log, metrics=self._metrics
                )
            else:
                m.queries = start_map(
                    self._spark,
                    self._config,
                    m.name,
                    self._batch_log,
                    generation=self._generation(m.name),
                    metrics=self._metrics,
                )
        except MaterializerError:
            raise  # the configuration: no restart can mend it, so the run reports it and ends
        except Exception as exc:  # Spark's own errors while building the queries
            self.fail(m, f"could not start: {exc}")
            return
        m.state, m.error = "running", ""
        log.info("map %s running", m.name)

    def stop(self, m: _Map, state: str) -> None:
        """Stop a map's queries after their batch in flight."""
        if m.queries is not None:
            m.queries.stop_after_batch()
            m.queries = None
        m.state = state
        log.info("map %s %s", m.name, state)

    def fail(self, m: _Map, error: str) -> None:
        """Record a failure; the other maps keep running."""
        log.error("map %s failed, the others keep running: %s", m.name, error)
        if m.queries is not None:
            m.queries.stop()
            m.queries = None
        m.state, m.error = "failed", error

    def step(self, m: _Map, request: Control) -> None:
        """Bring one map to what is asked of it, and notice a failed query."""
        if m.state == "running" and m.queries is not None:
            broken = [q for q in m.queries.queries if not q.isActive]
            if broken:
                self.fail(m, str(broken[0].exception()))
        if request.restart_id != m.restart_id:
            m.restart_id = request.restart_id
            log.info("map %s: restart requested", m.name)
            self.stop(m, "stopped")
            if request.desired == "running":
                self.start(m)
            else:
                m.state = "paused"
            return
        if request.desired == "paused" and m.state == "running":
            self.stop(m, "paused")
        elif request.desired == "running" and m.state == "paused":
            self.start(m)


def run_maps(config: AppConfig, names: Sequence[str], stop: threading.Event) -> list[str]:
    """Run the named maps until ``stop`` is set, or until none is running or paused.

    Returns the maps that failed. A map paused before the run starts stays
    paused until resumed.
    """
    metrics = BatchMetrics()
    # Before the JVM starts, so that a port already taken ends the run at once.
    metrics_server = serve_metrics(config.metrics, metrics.registry)
    spark = build_spark_session(config.spark)
    batch_log = BatchLog()
    spark.streams.addListener(batch_log)
    spark.streams.addListener(metrics)
    channel = ControlChannel(config.redis, names)
    supervisor = Supervisor(spark, config, batch_log, channel.generation, metrics)
    maps = {name: _Map(name) for name in names}
    try:
        requests = channel.requests()
        for m in maps.values():
            m.restart_id = requests[m.name].restart_id
            if requests[m.name].desired == "paused":
                m.state = "paused"
                log.info("map %s paused (as requested before this run)", m.name)
            else:
                supervisor.start(m)
        while not stop.is_set() and any(m.state in ("running", "paused") for m in maps.values()):
            requests = channel.requests()
            for m in maps.values():
                supervisor.step(m, requests[m.name])
            channel.report({m.name: m.report() for m in maps.values()})
            stop.wait(LOOP_SECONDS)
    finally:
        for m in maps.values():
            if m.state == "running":
                supervisor.stop(m, "stopped")
        channel.report({m.name: m.report() for m in maps.values()})
        channel.close()
        spark.stop()
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
    return [m.name for m in maps.values() if m.state == "failed"]
