"""The real-time path's shared Delta query as the run keeps it (``live.delta``): one for all
the path's maps, stopped and started again whenever a map joins or leaves any of the
shared folds (``run.live``) or it failed as a whole, and its batches reported as each
member's own Delta query's would be."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from materializer.checkpoints.running import Checkpoint
from materializer.config import AppConfig
from materializer.live.delta import DeltaMember, SharedDelta
from materializer.runtime.metrics import BatchMetrics, finished_at, partition_lags
from materializer.runtime.projector import report_rows_out
from materializer.runtime.query_group import FINISH_BATCH_TIMEOUT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

RESTARTS = 3
"""Failures in a row of the shared Delta query as a whole (a Kafka that does not answer,
say) it is started again after, from where the tables stand; the next fails its maps, as a
map's own Delta query failing fails its map."""
RETRY_S = 5.0
"""The pause before its first start again; each further one doubles it."""


class LiveDelta:
    """The shared Delta query of the maps on the path, one start after another.

    ``failed(map, error)``: a member's MERGE failed (from the query's thread).
    """

    def __init__(
        self,
        spark: SparkSession,
        config: AppConfig,
        checkpoint: str,
        failed: Callable[[str, str], None],
        metrics: BatchMetrics | None,
    ) -> None:
        self._spark = spark
        self._config = config
        self._checkpoint = checkpoint
        self._failed = failed
        self._metrics = metrics
        self._query: SharedDelta | None = None
        self._failures = 0
        """Failures as a whole since it last merged a batch."""
        self._retry_at: float | None = None
        """When it starts again after a failure; None: it runs, or is stopped."""
        self._reported: int | None = None
        """Its last batch whose figures went into the metrics."""
        self._started = False

    def start(self, members: list[DeltaMember]) -> None:
        """Start the query of ``members`` (one that cannot start counts as a failure)."""
        self._retry_at = None
        self._started = True
        try:
            query = SharedDelta(
                self._spark,
                self._config,
                members,
                self._checkpoint,
                self._failed,
                report_rows_out(self._metrics),
            )
            query.start()
        except Exception as exc:  # noqa: BLE001 - started again, or its maps fail
            self._down(f"could not start: {exc}")
            return
        self._query = query

    def stop(self, deadline: float | None = None) -> None:
        """Stop it once its batch in flight is done (a map leaving must find its table with
        no other writer); no start again until ``start``."""
        self._retry_at = None
        query, self._query = self._query, None
        if query is not None:
            query.stop(time.monotonic() + FINISH_BATCH_TIMEOUT if deadline is None else deadline)

    def noticed(self) -> str | None:
        """Take in a failure as a whole (it starts again after a pause, ``retry``) and report
        its last batch; the error its maps fail with, past ``RESTARTS``."""
        query = self._query
        if query is not None and query.query is not None:
            if not query.query.isActive:
                self._query = None
                query.stop(time.monotonic())
                return self._down(str(query.query.exception()))
            if query.query.lastProgress is not None:
                self._failures = 0  # it merged a batch since it started
        self._report()
        return None

    def retry(self, members: Callable[[], list[DeltaMember]]) -> None:
        """Start it again once the pause after its failure is over."""
        if self._retry_at is not None and time.monotonic() >= self._retry_at:
            self.start(members())

    def _down(self, error: str) -> str | None:
        self._failures += 1
        if self._failures > RESTARTS:
            self._retry_at = None
            return f"the shared Delta query failed: {error}"
        pause = RETRY_S * 2 ** (self._failures - 1)
        self._retry_at = time.monotonic() + pause
        log.warning("the shared Delta query failed; it starts again in %.0f s: %s", pause, error)
        return None

    def _report(self) -> None:
        """Each member's Delta batch, as its own Delta query's progress would report it."""
        query = self._query
        progress = None if query is None or query.query is None else query.query.lastProgress
        if self._metrics is None or query is None or progress is None:
            return
        if progress["batchId"] == self._reported:
            return
        self._reported = progress["batchId"]
        behind: dict[str, int] = {}
        for source in progress.get("sources", []):
            lags = partition_lags(source.get("endOffset"), source.get("latestOffset"))
            for (topic, _), lag in lags.items():
                behind[topic] = behind.get(topic, 0) + lag
        started_ms = round(finished_at(str(progress["timestamp"]), 0) * 1000)
        for name, changelog in query.changelogs().items():
            self._metrics.intervals.delta_batch(name, started_ms, behind.get(changelog, 0))

    def close(self) -> None:
        """The run's end: stopped, and its checkpoint gone (a start never reads it)."""
        self.stop()
        if self._started:
            Checkpoint(self._spark, self._checkpoint).discard()
