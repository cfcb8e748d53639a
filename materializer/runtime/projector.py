"""The ``foreachBatch`` callback of a map's queries: each micro-batch handed to the sinks in
order, counted, logged and measured, with the crash drill's faults between them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from materializer.batch import Batch, Sink
from materializer.checkpoints.running import Checkpoint
from materializer.runtime.crash import CrashDrill
from materializer.runtime.metrics import BatchMetrics
from materializer.runtime.progress import BatchLog

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


FOLD_POOL, DELTA_POOL, CATCH_UP_POOL = "fold", "delta", "catch_up"
"""The FAIR scheduler pools of the folds' jobs, of the Delta queries' jobs, and of the fold
of a map catching up beside live ones (``runtime.pacing``)."""


class Projector:
    """The ``foreachBatch`` callback: runs on the driver, once per micro-batch (and per replay)."""

    def __init__(
        self,
        map_name: str,
        sinks: list[Sink],
        checkpoint: Checkpoint,
        on_rows_out: Callable[[str, int, int], None] | None = None,
        query: str = "fold",
        prepare: Callable[[DataFrame], DataFrame] | None = None,
        keep_records: bool = False,
        pool: str = FOLD_POOL,
        persist: bool = True,
        count: bool = True,
        pace: Callable[[], None] | None = None,
    ) -> None:
        """``prepare`` turns the query's rows into the rows to project. With
        ``keep_records`` the query's rows are records, not folded rows: the sinks get
        them as ``Batch.records`` too, and the first sink to report ``rows_out`` (the
        fold in Redis) gives the batch's count. ``persist=False`` for a batch that only
        one sink reads. ``count=False``: the batch is not counted before the sinks run; the
        first sink to report ``rows_out`` gives its count (a sink that collects the rows).
        ``pace`` is called before each batch and may wait (``runtime.pacing``)."""
        self.map_name = map_name
        self.sinks = sinks
        self.checkpoint = checkpoint
        self.query = query
        self._prepare = prepare
        self._keep_records = keep_records
        self._pool = pool
        self._persist = persist
        self._count = count
        self._on_rows_out = on_rows_out
        self._pace = pace
        self._app_id: str | None = None
        self._drill = CrashDrill()

    def app_id(self) -> str:
        """The streaming query id plus the map name: new with every new checkpoint."""
        if self._app_id is None:
            self._app_id = f"{self.checkpoint.query_id()}:{self.map_name}"
        return self._app_id

    def close(self) -> None:
        """Release the sinks' clients; the query has stopped."""
        for sink in self.sinks:
            sink.close()

    def __call__(self, rows: DataFrame, batch_id: int, collected: pa.Table | None = None) -> None:
        """Project one batch into every sink, in order. ``collected``: the rows already
        collected in Arrow (``Batch.collected``), which are then neither cached nor counted."""
        if self._pace is not None:
            self._pace()
        started = time.monotonic()
        # The jobs this callback submits run in the query's pool (set per thread).
        rows.sparkSession.sparkContext.setLocalProperty("spark.scheduler.pool", self._pool)
        records = rows if self._keep_records else None
        if self._prepare is not None:
            rows = self._prepare(rows)
        # The batch is read by each sink; caching it reads and computes it once.
        persist = self._persist and collected is None
        if persist:
            rows.persist()
        try:
            # With the records kept, the first sink makes the rows out and counts them.
            counted = records is None and self._count and collected is None
            count = rows.count() if counted else None
            batch = Batch(
                rows=rows,
                batch_id=batch_id,
                app_id=self.app_id(),
                records=records,
                count=count,
                collected=collected,
            )
            self._drill.batch_started()
            for sink in self.sinks:
                sink.write(batch)
                self._drill.sink_written(sink.name)
                if count is None:
                    count = sink.rows_out()
        finally:
            if persist:
                rows.unpersist()
        count = count or 0
        if self._on_rows_out is not None:
            self._on_rows_out(f"{self.map_name}.{self.query}", batch_id, count)
        log.debug(
            "query=%s.%s batch=%d rows_out=%d projected_ms=%d",
            self.map_name,
            self.query,
            batch_id,
            count,
            (time.monotonic() - started) * 1000,
        )


def report_rows_out(
    *listeners: BatchLog | BatchMetrics | None,
) -> Callable[[str, int, int], None] | None:
    """The projector's one count of a batch's rows out, for the log line and the metrics."""
    targets = [listener.rows_out for listener in listeners if listener is not None]
    if not targets:
        return None

    def report(query: str, batch_id: int, count: int) -> None:
        for target in targets:
            target(query, batch_id, count)

    return report
