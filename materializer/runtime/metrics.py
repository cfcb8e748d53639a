"""The materializer's Prometheus metrics, served over HTTP by ``materializer run``.

They come from Spark's progress events (one per committed batch, per query),
except rows out, which the projector counts inside the fold's and the Delta
query's batches (the same count the batch log line shows, not a second one),
and two numbers Spark does not have, which the fold counts on the rows it
applies (``fold_applied``): the newest Kafka timestamp it folded, how old each
record it folded was when Redis held it (``runtime.freshness``), and the dead
letters it sent. How far each running map is behind its source logs, and how
fast it gains, comes from the run's own look at Kafka's log ends
(``materializer.runtime.catch_up``, ``catch_up``), which Spark's progress
cannot tell.

Queries are named ``<map>.<query>`` (``users.fold``); map names may hold dots,
query names do not.

The same batches feed each map's history (``runtime.history``): ``intervals``
adds them up between two of its samples.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.registry import Collector

from materializer.config import MetricsConfig
from materializer.contract.redis_layout import GENERATION_MARK
from materializer.errors import SetupError
from materializer.runtime.freshness import PROMETHEUS_BUCKETS_S, Freshness
from materializer.runtime.history import Intervals
from materializer.runtime.listener import Progress, QueryListener

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from materializer.runtime.catch_up import MapCatchUp


log = logging.getLogger(__name__)

FOLD, DEAD_LETTER, DELTA = "fold", "dead_letter", "delta"


def split_query_name(name: str | None) -> tuple[str, str] | None:
    """``(map, query)`` of a query this package started, None for any other query."""
    if not name or "." not in name:
        return None
    map_name, query = name.rsplit(".", 1)
    # A rebuilt generation (``<map>~<n>``) is still the same map to whoever watches it.
    return map_name.split(GENERATION_MARK, 1)[0], query


def records_behind(progress: Mapping[str, Any] | None) -> int | None:
    """Records a query's last batch left in its sources (latest minus end offsets, summed):
    what a read limit left for the next batches; None before its first progress."""
    if progress is None:
        return None
    return sum(
        sum(partition_lags(s.get("endOffset"), s.get("latestOffset")).values())
        for s in progress.get("sources", [])
    )


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


class FreshnessHistogram(Collector):
    """``materializer_event_freshness_seconds{map}``: one observation per record folded (its
    age when the batch's Redis writes landed), fed a batch's bucket counts at a time.

    Prometheus's own ``Histogram`` takes one observation a call: a Python call per
    record. This collector keeps each map's running sums of ``Freshness`` and writes
    them out as a histogram when scraped.
    """

    NAME = "materializer_event_freshness_seconds"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: dict[str, Freshness] = {}

    def add(self, map_name: str, freshness: Freshness) -> None:
        """Count a batch's records; called on the batch's thread."""
        with self._lock:
            before = self._maps.get(map_name)
            self._maps[map_name] = freshness if before is None else before + freshness

    def collect(self) -> Iterator[HistogramMetricFamily]:
        """The histogram of every map that folded a record since the run started."""
        family = HistogramMetricFamily(
            self.NAME,
            "Age of each folded record (from its Kafka timestamp) when Redis held its batch.",
            labels=["map"],
        )
        with self._lock:
            maps = dict(self._maps)
        for name, f in sorted(maps.items()):
            bounds = [*(repr(b) for b in PROMETHEUS_BUCKETS_S), "+Inf"]
            buckets = list(zip(bounds, (float(n) for n in f.prometheus_buckets()), strict=True))
            family.add_metric([name], buckets, f.sum_us / 1_000_000)
        yield family


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
            "Records the query read from its topics (for the fold query:"
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
            "How old the newest folded record (Kafka timestamp) was when Redis held its batch.",
            ["map"],
            registry=r,
        )
        self._event_freshness = FreshnessHistogram()
        r.register(self._event_freshness)
        self.intervals = Intervals()
        """Each map's batches since its last history sample (``runtime.history``)."""
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
        self._records_left = Gauge(
            "materializer_records_left",
            "Records in the source partition beyond the map's watermark, against the log end"
            " Kafka reports (about every second while the map runs).",
            ["map", "topic", "partition"],
            registry=r,
        )
        self._catch_up_rate = Gauge(
            "materializer_catch_up_rate",
            "Records per second the map's watermark advanced over the last half minute.",
            ["map"],
            registry=r,
        )
        self._input_rate = Gauge(
            "materializer_input_rate",
            "Records per second the map's source partitions grew over the last half minute.",
            ["map"],
            registry=r,
        )
        self._eta = Gauge(
            "materializer_catch_up_eta_seconds",
            "Seconds until the map has caught up with its source logs at the current rates;"
            " -1 when unknown (it does not gain on them).",
            ["map"],
            registry=r,
        )
        self._catching_up = Gauge(
            "materializer_catching_up",
            "1 while the map has more records left than its catch_up.ready_lag (its health is"
            " NOT_SERVING), else 0.",
            ["map"],
            registry=r,
        )
        self._paced = Gauge(
            "materializer_catch_up_paced_seconds",
            "The wait before each batch of a map catching up beside live maps, while their"
            " batches run long (runtime.pacing); 0: full pace.",
            ["map"],
            registry=r,
        )
        self._left_partitions: dict[str, set[tuple[str, str]]] = {}
        self._last_batch = Gauge(
            "materializer_last_batch_timestamp_seconds",
            "When the query's last batch finished, in seconds since the epoch.",
            ["map", "query"],
            registry=r,
        )

        self._worker_maps = Gauge(
            "materializer_worker_map",
            "1 for each map this worker of a group runs (its worker.id); a map that moved to"
            " another worker is no longer listed here.",
            ["worker", "map"],
            registry=r,
        )
        self._rebalances = Counter(
            "materializer_worker_rebalances",
            "Rebalances of the worker group that gave this worker slots or took them away.",
            ["worker"],
            registry=r,
        )

    def worker_maps(self, worker: str, names: Iterable[str], rebalanced: bool) -> None:
        """The maps this worker of a group runs now; ``rebalanced``: the group moved some."""
        self._worker_maps.clear()
        for name in names:
            self._worker_maps.labels(worker, name).set(1)
        if rebalanced:
            self._rebalances.labels(worker).inc()

    def paced(self, map_name: str, seconds: float | None) -> None:
        """A catching-up map's wait between batches (``runtime.pacing``); None: not paced."""
        if seconds is None:
            with contextlib.suppress(KeyError):
                self._paced.remove(map_name)
        else:
            self._paced.labels(map_name).set(seconds)

    def catch_up(self, map_name: str, figures: MapCatchUp | None) -> None:
        """A running map's catch-up figures as last measured (``runtime.catch_up``); ``None``
        for a map no longer running here, whose series go (its figures are unknown)."""
        gone = self._left_partitions.pop(map_name, set())
        if figures is None:
            for topic, partition in gone:
                self._records_left.remove(map_name, topic, partition)
            for gauge in (self._catch_up_rate, self._input_rate, self._eta, self._catching_up):
                with contextlib.suppress(KeyError):
                    gauge.remove(map_name)
            return
        seen = set()
        for p in figures.partitions:
            labels = (p.topic, str(p.partition))
            if p.records_left >= 0:
                self._records_left.labels(map_name, *labels).set(p.records_left)
                seen.add(labels)
        for topic, partition in gone - seen:
            self._records_left.remove(map_name, topic, partition)
        self._left_partitions[map_name] = seen
        self._catch_up_rate.labels(map_name).set(figures.catch_up_rate)
        self._input_rate.labels(map_name).set(figures.input_rate)
        self._eta.labels(map_name).set(figures.eta_seconds)
        self._catching_up.labels(map_name).set(1 if figures.catching_up else 0)

    def state_size(self, map_name: str, keys: int, size_bytes: int) -> None:
        """A map's fold state as last measured (``redis.state_size``)."""
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
        if query == DELTA:
            started_ms = round(finished_at(str(progress["timestamp"]), 0) * 1000)
            self.intervals.delta_batch(map_name, started_ms, records_behind(progress))
        if query == FOLD:
            self.intervals.fold_batch(map_name, progress.get("durationMs") or {})
            for source in progress.get("sources", []):
                lags = partition_lags(source.get("endOffset"), source.get("latestOffset"))
                for (topic, partition), lag in lags.items():
                    self._lag.labels(map_name, topic, partition).set(lag)

    def fold_applied(
        self,
        map_name: str,
        newest_timestamp_us: int | None,
        dead_letters: int,
        freshness: Freshness | None = None,
    ) -> None:
        """What one fold batch did, from inside it once Redis holds it: the newest Kafka
        timestamp it folded (microseconds; None: nothing folded), the dead letters it
        sent, and how old its folded records were (None: none folded). Called on the
        batch's thread, as ``rows_out``."""
        self.intervals.fold_applied(map_name, newest_timestamp_us, dead_letters, freshness)
        if freshness is not None:
            self._event_freshness.add(map_name, freshness)
        if newest_timestamp_us is not None:
            # Clocks of producers and of this machine may disagree a little; age is never < 0.
            age = time.time() - newest_timestamp_us / 1_000_000
            self._freshness.labels(map_name).set(max(0.0, age))
        if dead_letters:
            self._dead_letters.labels(map_name).inc(dead_letters)
            self._rows_out.labels(map_name, DEAD_LETTER).inc(dead_letters)


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
