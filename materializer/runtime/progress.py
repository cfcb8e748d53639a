"""One log line per micro-batch: batch id, rows in and out, duration, lag, and where the
duration went.

Spark reports progress after a batch commits; rows out are counted by the
projector inside the batch. The listener joins the two by (query, batch id).
The phases are Spark's own (``durationMs``: ``addBatch`` is the sink's work,
``walCommit`` and ``commitOffsets`` the checkpoint's two log writes,
``queryPlanning``, ``latestOffset``, ``getBatch``), so a slow batch says whether the
fold or the engine around it took the time.
"""

from __future__ import annotations

import logging
import threading

from materializer.runtime.listener import Progress, QueryListener
from materializer.runtime.metrics import records_behind

log = logging.getLogger("materializer.batches")


class BatchLog(QueryListener):
    """Logs each batch of every query in the session; the projector adds rows out."""

    def __init__(self) -> None:
        self._rows_out: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def rows_out(self, query_name: str, batch_id: int, count: int) -> None:
        """Called by the projector from inside the batch."""
        with self._lock:
            self._rows_out[(query_name, batch_id)] = count

    def started(self, name: str | None, query_id: str) -> None:
        """Log the start with the query's id, stable across restarts of one checkpoint."""
        log.info("query=%s started id=%s", name, query_id, extra={"query": name})

    def progress(self, progress: Progress) -> None:
        """One line per batch."""
        name, batch_id = progress["name"], progress["batchId"]
        with self._lock:
            out = self._rows_out.pop((name, batch_id), None)
        lag = records_behind(progress) or 0
        fields = {
            "query": name,
            "batch": batch_id,
            "rows_in": progress.get("numInputRows", 0),
            "rows_out": out,
            "duration_ms": progress.get("batchDuration", 0),
            "lag": lag,
        }
        phases = {
            k: v for k, v in progress.get("durationMs", {}).items() if k != "triggerExecution"
        }
        log.info(
            "query=%s batch=%d rows_in=%d rows_out=%s duration_ms=%d lag=%d phases_ms=%s",
            *(("-" if value is None else value) for value in fields.values()),
            ",".join(f"{k}:{v}" for k, v in phases.items()) or "-",
            extra={**fields, "phases_ms": phases},
        )

    def terminated(self, query_id: str, error: str | None) -> None:
        """Log how the query ended; a failure carries Spark's error text."""
        if error:
            log.error("query id=%s failed: %s", query_id, error)
        else:
            log.info("query id=%s stopped", query_id)
