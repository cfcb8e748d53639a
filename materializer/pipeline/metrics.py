"""The materializer's Prometheus metrics, served over HTTP by ``materializer run``.

They come from Spark's progress events (one per committed batch, per query),
except rows out, which the projector counts inside the fold's and the Delta
query's batches (the same count the batch log line shows, not a second one).
Two numbers Spark does not have are measured with ``DataFrame.observe`` and
arrive with the progress: the newest Kafka timestamp the fold takes in, and the
dead letters a batch sends, since the ``kafka`` sink of the dead-letter query
reports every record it reads as input, good or bad. The observations are
declared here, next to the listener that reads them, and applied by
``pipeline.job``.

Queries are named ``<map>.<query>`` (``users.fold``); map names may hold dots,
query names do not.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from materializer import record_columns as c
from materializer.config import MetricsConfig
from materializer.contract.redis_layout import GENERATION_MARK
from materializer.errors import SetupError
from materializer.pipeline.listener import Progress, QueryListener

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

FOLD_INPUT = "materializer_fold_input"
"""The observation on the fold's input: the newest Kafka timestamp of the batch."""
NEWEST_TIMESTAMP_US = "newest_timestamp_us"
DEAD_LETTERS = "materializer_dead_letters"
"""The observation on the dead-letter query's records: how many the batch sent."""
RECORDS = "records"

FOLD, DEAD_LETTER = "fold", "dead_letter"


def observe_fold_input(records: DataFrame, dead_letters: bool = False) -> DataFrame:
    """``records`` (what the fold takes in) reporting the newest Kafka timestamp of each batch.

    Microseconds since the epoch, so that the value is the same number in
    every session time zone; null for a batch with nothing to fold. With
    ``dead_letters`` (a map whose one query also sends them), the records
    also report how many of them failed.
    """
    from pyspark.sql import functions as F

    # Records not yet split by the error policy: only those that fold count as folded.
    folds = F.col(c.ERROR_STAGE).isNull() if c.ERROR_STAGE in records.columns else F.lit(True)
    newest = F.max(F.when(folds, F.unix_micros(F.col(c.TIMESTAMP)))).alias(NEWEST_TIMESTAMP_US)
    observed = records.observe(FOLD_INPUT, newest)
    if dead_letters:
        failed = F.count(F.when(~folds, F.lit(1))).alias(RECORDS)
        observed = observed.observe(DEAD_LETTERS, failed)
    return observed


def observe_dead_letters(letters: DataFrame) -> DataFrame:
    """``letters`` (the dead-letter query's records) reporting how many each batch sends."""
    from pyspark.sql import functions as F

    return letters.observe(DEAD_LETTERS, F.count(F.lit(1)).alias(RECORDS))


def split_query_name(name: str | None) -> tuple[str, str] | None:
    """``(map, query)`` of a query this package started, None for any other query."""
    if not name or "." not in name:
        return None
    map_name, query = name.rsplit(".", 1)
    # A rebuilt generation (``<map>~<n>``) is still the same map to whoever watches it.
    return map_name.split(GENERATION_MARK, 1)[0], query


def partition_lags(end: Any, latest: Any) -> dict[tuple[str, str], int]:
    """Per (topic, partition), records available but not yet read: latest minus end offset.

    Spark's Kafka source reports both as JSON objects (``{"topic": {"0": 42}}``), parsed
    or as text; a source that has no offsets to report yet (a restart), or offsets of
    another shape (not Kafka), gives no lags rather than an error.
    """
    try:
        ends, latests = (
            orjson.loads(v or "null") if isinstance(v, str | bytes | None) else v
            for v in (end, latest)
        )
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(ends, dict) or not isinstance(latests, dict):
        return {}
    lags: dict[tuple[str, str], int] = {}
    for topic, partitions in latests.items():
        done = ends.get(topic)
        if not isinstance(partitions, dict) or not isinstance(done, dict | None):
            return {}
        for partition, offset in partitions.items():
            lags[(topic, str(partition))] = max(
                0, int(offset) - int((done or {}).get(partition, 0))
            )
    return lags


def finished_at(timestamp: str, duration_ms: int) -> float:
    """When a batch finished, in seconds since the epoch, from its progress report.

    Spark reports the batch's trigger time (ISO 8601, UTC) and how long it took.
    """
    started = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return started.timestamp() + duration_ms / 1000


def _observed(progress: Progress, observation: str, metric: str) -> Any:
    row = (progress.get("observedMetrics") or {}).get(observation)
    return None if row is None else row.get(metric)


class BatchMetrics(QueryListener):
    """Per map and query metrics of every batch of the session, in a registry of their own.

    Progress events arrive on Spark's listener thread after each batch
    commits; ``rows_out`` is called by the projector from inside the batch.
    A replayed batch counts again, as it was processed again.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._batch_duration = Histogram(
            "materializer_batch_duration_seconds",
            "Time each batch took, from its trigger to its commit.",
            ["map", "query"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self._rows_in = Counter(
            "materializer_rows_in",
            "Records the query read from its topics (for the fold and the dead-letter query:"
            " every source record, good or bad).",
            ["map", "query"],
            registry=r,
        )
        self._rows_out = Counter(
            "materializer_rows_out",
            "Rows the query wrote: entity changes (fold), table rows (delta), dead letters.",
            ["map", "query"],
            registry=r,
        )
        self._dead_letters = Counter(
            "materializer_dead_letters",
            "Records sent to the map's dead-letter topic.",
            ["map"],
            registry=r,
        )
        self._lag = Gauge(
            "materializer_lag_records",
            "Records in the partition the fold has not read, as of its last batch.",
            ["map", "topic", "partition"],
            registry=r,
        )
        self._freshness = Gauge(
            "materializer_freshness_seconds",
            "How old the newest folded record (Kafka timestamp) was when its batch finished.",
            ["map"],
            registry=r,
        )
        self._state_keys = Gauge(
            "materializer_state_keys",
            "Keys of the map's fold state in Redis (live entities and recently deleted ones),"
            " measured about once a minute.",
            ["map"],
            registry=r,
        )
        self._state_bytes = Gauge(
            "materializer_state_bytes",
            "Redis memory of the map's fold state, estimated from a sample of its keys.",
            ["map"],
            registry=r,
        )
        self._last_batch = Gauge(
            "materializer_last_batch_timestamp_seconds",
            "When the query's last batch finished, in seconds since the epoch.",
            ["map", "query"],
            registry=r,
        )

    def state_size(self, map_name: str, keys: int, size_bytes: int) -> None:
        """A map's fold state as last measured (``pipeline.state_size``)."""
        self._state_keys.labels(map_name).set(keys)
        self._state_bytes.labels(map_name).set(size_bytes)

    def rows_out(self, query_name: str, batch_id: int, count: int) -> None:
        """The projector's count of a batch's rows out (the same the batch log line shows)."""
        names = split_query_name(query_name)
        if names is not None:
            self._rows_out.labels(*names).inc(count)

    def progress(self, progress: Progress) -> None:
        """Record one committed batch."""
        names = split_query_name(progress["name"])
        if names is None:
            return
        map_name, query = names
        duration = int(progress.get("batchDuration", 0))
        done = finished_at(str(progress["timestamp"]), duration)
        self._batch_duration.labels(map_name, query).observe(duration / 1000)
        self._rows_in.labels(map_name, query).inc(int(progress.get("numInputRows", 0)))
        self._last_batch.labels(map_name, query).set(done)
        if query == FOLD:
            for source in progress.get("sources", []):
                lags = partition_lags(source.get("endOffset"), source.get("latestOffset"))
                for (topic, partition), lag in lags.items():
                    self._lag.labels(map_name, topic, partition).set(lag)
            newest = _observed(progress, FOLD_INPUT, NEWEST_TIMESTAMP_US)
            if newest is not None:
                # Clocks of producers and of this machine may disagree a little; age is never < 0.
                self._freshness.labels(map_name).set(max(0.0, done - int(newest) / 1_000_000))
        if query in (FOLD, DEAD_LETTER):
            # The dead-letter query's, or the fold's when its one query sends them.
            letters = _observed(progress, DEAD_LETTERS, RECORDS)
            if letters is not None:
                self._dead_letters.labels(map_name).inc(int(letters))
                self._rows_out.labels(map_name, DEAD_LETTER).inc(int(letters))


def serve_metrics(config: MetricsConfig, registry: CollectorRegistry) -> WSGIServer | None:
    """Serve ``/metrics`` of ``registry`` on a daemon thread; None when ``port`` is 0."""
    if config.port == 0:
        return None
    try:
        server, _ = start_http_server(config.port, addr=config.host, registry=registry)
    except OSError as exc:
        raise SetupError(
            f"metrics: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}"
        ) from None
    log.info("metrics on http://%s:%d/metrics", config.host, config.port)
    return server
