"""Each map's figures over time in ``<map>:__history__``, for the web console's charts.

Two halves:

- ``Intervals`` adds up what each map's batches did since its last sample, as they
  commit: records folded, their freshness and the dead letters, from inside each fold
  batch once Redis holds it (``BatchMetrics.fold_applied``); the longest fold batch and
  its phases, and the Delta query's last batch, from Spark's progress
  (``BatchMetrics.progress``);
- ``HistoryRecorder`` samples every map the run reports on, every
  ``metrics.history.interval``, on a daemon thread of its own: the interval's
  figures beside the levels the run last reported (state, catch-up figures, state
  size), one ``XADD ... MAXLEN ~`` per map, all in one round trip.

The format of a sample is the contract's (``materializer.contract.history``). A
Redis that does not answer loses the samples of its silence; it never delays the
supervisor's loop nor a batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from materializer.clients.redis import connect
from materializer.config import RedisConfig
from materializer.contract.history import PHASES, HistorySample
from materializer.contract.redis_layout import history_key
from materializer.contract.status import MapReport
from materializer.runtime.daemon import DaemonLoop
from materializer.runtime.freshness import Freshness
from materializer.runtime.freshness import add as add_freshness

log = logging.getLogger(__name__)


@dataclass
class Interval:
    """What one map's batches did since its last sample (``Intervals.take``)."""

    folded: int = 0
    dead_letters: int = 0
    batches: int = 0
    freshness: Freshness | None = None
    batch_ms: int = -1
    """The longest fold batch's ``triggerExecution``; -1: no batch."""
    phases: dict[str, int] = field(default_factory=dict)
    """That batch's ``durationMs``."""
    newest_timestamp_us: int | None = None
    """The newest Kafka timestamp folded so far (this interval or before)."""
    changed_at_ms: int | None = None
    """When the last fold batch that sent changes to the changelog had them in Redis."""
    delta_started_ms: int | None = None
    """When the Delta query's last batch started (it reads the changelog as of then)."""
    delta_behind: int | None = None
    """Changelog records that batch left for later."""

    def carried(self) -> Interval:
        """The next interval: nothing done yet, the levels as they stand."""
        return Interval(
            newest_timestamp_us=self.newest_timestamp_us,
            changed_at_ms=self.changed_at_ms,
            delta_started_ms=self.delta_started_ms,
            delta_behind=self.delta_behind,
        )


class Intervals:
    """Every map's ``Interval`` in progress, fed by the batches' threads and Spark's
    listener thread, taken by the recorder's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: dict[str, Interval] = {}

    def fold_applied(
        self,
        map_name: str,
        newest_timestamp_us: int | None,
        dead_letters: int,
        freshness: Freshness | None,
    ) -> None:
        """A fold batch Redis now holds (``BatchMetrics.fold_applied``)."""
        with self._lock:
            i = self._maps.setdefault(map_name, Interval())
            i.dead_letters += dead_letters
            if freshness is not None:
                i.folded += freshness.count
                i.freshness = add_freshness(i.freshness, freshness)
                # Every folded record sends its key's state to the changelog, even on a replay.
                i.changed_at_ms = int(time.time() * 1000)
            if newest_timestamp_us is not None:
                i.newest_timestamp_us = max(newest_timestamp_us, i.newest_timestamp_us or 0)

    def fold_batch(self, map_name: str, durations: Mapping[str, int]) -> None:
        """A fold batch committed; ``durations``: its progress's ``durationMs``."""
        total = int(durations.get("triggerExecution", -1))
        with self._lock:
            i = self._maps.setdefault(map_name, Interval())
            i.batches += 1
            if total > i.batch_ms:
                i.batch_ms, i.phases = total, {k: int(v) for k, v in durations.items()}

    def delta_batch(self, map_name: str, started_ms: int, behind: int | None) -> None:
        """A Delta batch committed: it started at ``started_ms`` and left ``behind``."""
        with self._lock:
            i = self._maps.setdefault(map_name, Interval())
            i.delta_started_ms, i.delta_behind = started_ms, behind

    def take(self, map_name: str) -> Interval:
        """The map's interval so far; the next one starts now."""
        with self._lock:
            current = self._maps.get(map_name) or Interval()
            self._maps[map_name] = current.carried()
            return current


def sample_of(
    report: MapReport, interval: Interval, elapsed_s: float, now_ms: int
) -> HistorySample:
    """A map's sample: ``interval``'s figures over ``elapsed_s`` seconds, beside the levels
    of its last ``report``, taken at ``now_ms``."""
    measured = report.records_left >= 0  # the catch-up figures are known
    f = interval.freshness
    lag_ms = -1
    if report.records_left == 0:
        lag_ms = 0
    elif measured and interval.newest_timestamp_us is not None:
        lag_ms = max(0, now_ms - interval.newest_timestamp_us // 1000)
    delta_lag_ms = -1
    if interval.delta_started_ms is not None:
        changed = interval.changed_at_ms or 0
        delta_lag_ms = max(0, changed - interval.delta_started_ms)
    return HistorySample(
        at_ms=now_ms,
        state=report.state,
        input_rate=report.input_rate if measured else -1.0,
        fold_rate=interval.folded / elapsed_s if elapsed_s > 0 else -1.0,
        batches=interval.batches,
        batch_ms=interval.batch_ms,
        **{name: interval.phases.get(spark, -1) for name, spark in PHASES},
        freshness_p50_ms=-1 if f is None else round(f.quantile_ms(0.5)),
        freshness_p99_ms=-1 if f is None else round(f.quantile_ms(0.99)),
        freshness_max_ms=-1 if f is None else round(f.max_us / 1000),
        lag_records=report.records_left,
        lag_ms=lag_ms,
        dead_letters=interval.dead_letters,
        state_keys=report.state_keys,
        state_bytes=report.state_bytes,
        delta_lag_ms=delta_lag_ms,
        delta_lag_records=-1 if interval.delta_behind is None else interval.delta_behind,
        catch_up_rate=report.catch_up_rate if measured else -1.0,
        eta_seconds=report.eta_seconds,
    )


class HistoryRecorder(DaemonLoop):
    """Appends a sample of every map ``reported`` names to its history every ``interval_s``,
    on a daemon thread, the first one interval after it starts; each history keeps about
    ``max_len`` samples."""

    transient = (redis.RedisError,)
    failing = "history samples not written"
    while_away = "(lost until Redis answers)"
    recovered = "history samples written again"

    def __init__(
        self, redis_config: RedisConfig, intervals: Intervals, interval_s: float, max_len: int
    ) -> None:
        super().__init__("history", interval_s, first_at_once=False)
        self._redis = redis_config
        self._intervals = intervals
        self._max_len = max_len
        self._reports: Mapping[str, MapReport] = {}
        self._last: dict[str, float] = {}
        self._started = time.monotonic()
        self._sampling = threading.Lock()
        """Held while a round samples the maps, so that ``forget`` returns after it."""
        self._client = connect(redis_config, socket_timeout=2.0, socket_connect_timeout=2.0)
        """A client of the recorder's own whose calls end within seconds: a round holds
        ``_sampling`` through its write, and ``forget`` waits on the supervisor's loop."""

    def reported(self, reports: Mapping[str, MapReport]) -> None:
        """The maps' last reports (the supervisor's loop): the maps to sample, as they stand."""
        self._reports = dict(reports)

    def stop(self) -> None:
        """Stop after the round under way, and close the recorder's client."""
        super().stop()
        self._client.close()

    def forget(self, name: str) -> None:
        """Sample the map no more, from a round under way too: once this returns nothing
        writes its history (a deleted map's purge may come at once, and a sample after it
        would leave the key behind)."""
        with self._sampling:
            self._reports = {n: r for n, r in self._reports.items() if n != name}
            self._last.pop(name, None)

    def start(self) -> None:
        """The first samples one interval from now, then one every interval."""
        self._started = time.monotonic()
        super().start()

    def round(self) -> None:
        """One sample of every reported map (``record``)."""
        self.record()

    def record(self) -> None:
        """One sample of every reported map, in one round trip."""
        with self._sampling:
            self._record()

    def _record(self) -> None:
        now, now_ms = time.monotonic(), int(time.time() * 1000)
        samples = []
        for name, report in self._reports.items():
            elapsed = now - self._last.get(name, self._started)
            self._last[name] = now
            samples.append((name, sample_of(report, self._intervals.take(name), elapsed, now_ms)))
        if not samples:
            return
        with self._client.pipeline(transaction=False) as pipe:
            for name, sample in samples:
                fields: dict[Any, Any] = sample.to_fields()
                pipe.xadd(history_key(name), fields, maxlen=self._max_len, approximate=True)
            pipe.execute()
