"""One log line per micro-batch: batch id, rows in and out, duration, lag.

Spark reports progress after a batch commits; rows out are counted by the
projector inside the batch. The listener joins the two by (query, batch id).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import orjson
from pyspark.sql.streaming.listener import StreamingQueryListener

log = logging.getLogger("materializer.batches")


def offsets_lag(end: str | None, latest: str | None) -> int:
    """Records available but not yet read: latest minus end offsets, over all partitions."""
    if not end or not latest:
        return 0
    try:
        ends, latests = orjson.loads(end), orjson.loads(latest)
    except orjson.JSONDecodeError:
        return 0  # a source that reports no offsets (yet), e.g. while it restarts
    if not isinstance(ends, dict) or not isinstance(latests, dict):
        return 0
    lag = 0
    for topic, partitions in latests.items():
        for partition, offset in partitions.items():
            lag += max(0, int(offset) - int(ends.get(topic, {}).get(partition, 0)))
    return lag


class BatchLog(StreamingQueryListener):
    """Logs each batch of every query in the session; the projector adds rows out."""

    def __init__(self) -> None:
        self._rows_out: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def rows_out(self, query_name: str, batch_id: int, count: int) -> None:
        """Called by the projector from inside the batch."""
        with self._lock:
            self._rows_out[(query_name, batch_id)] = count

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's listener API
        """Log the start with the query's id, stable across restarts of one checkpoint."""
        log.info("query=%s started id=%s", event.name, event.id, extra={"query": event.name})

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        """One line per batch."""
        progress = event.progress
        with self._lock:
            out = self._rows_out.pop((progress.name, progress.batchId), None)
        lag = sum(offsets_lag(s.endOffset, s.latestOffset) for s in progress.sources)
        fields = {
            "query": progress.name,
            "batch": progress.batchId,
            "rows_in": progress.numInputRows,
            "rows_out": out,
            "duration_ms": progress.batchDuration,
            "lag": lag,
        }
        log.info(
            "query=%s batch=%d rows_in=%d rows_out=%s duration_ms=%d lag=%d",
            *(("-" if value is None else value) for value in fields.values()),
            extra=fields,
        )

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        """Nothing to log: an idle query is caught up."""

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        """Log how the query ended; a failure carries Spark's error text."""
        if event.exception:
            log.error("query id=%s failed: %s", event.id, event.exception)
        else:
            log.info("query id=%s stopped", event.id)
