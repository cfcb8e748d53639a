"""A map's state and lag as operators see it, from its report, watermark and Kafka's log ends.

Shared by ``materializer status`` and the query service's ``GetStatus``, so
both say the same thing of the same map.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from materializer.contract.redis_layout import MapReport, Watermark

FOLDING = ("running", "catching_up")
"""The states of a map whose fold runs: ``catching_up`` is ``running`` with more records
left in its source logs than its ``catch_up.ready_lag``, so read-your-writes callers wait."""

IN_HAND = ("running", "catching_up", "paused", "restoring", "rebuilding", "stopping")
"""The states of a map a materializer holds: its queries, or their return, are in hand."""

STALE_REPORT_MS = 15_000
"""A running materializer reports every half second; silence this long means it is gone."""


def effective_state(report: MapReport | None, now_ms: int) -> str:
    """``not_started``, or the reported state; a running, catching-up, paused or rebuilding
    map gone silent is ``stopped``.

    A killed materializer cannot say it stopped, so the report's age decides.
    """
    if report is None:
        return "not_started"
    live = (*FOLDING, "paused", "rebuilding")
    if report.state in live and now_ms - report.reported_at_ms > STALE_REPORT_MS:
        return "stopped"
    return report.state


@dataclass(frozen=True)
class PartitionLag:
    """How far one source partition is materialized; -1 where Kafka could not be asked.

    ``lag`` is the records left, measured by the viewer against the log end now; the
    rates and ETA are the run's, from its last report (``live_report``).
    """

    topic: str
    partition: int
    materialized_offset: int
    log_end_offset: int
    lag: int
    catch_up_rate: float = 0.0
    input_rate: float = 0.0
    eta_seconds: float = -1.0
    """-1: unknown (the map is not gaining on this partition, or its run reports nothing)."""

    def to_json(self) -> dict[str, object]:
        """The row for ``--json``: unknowns are null."""
        return {
            **dataclasses.asdict(self),
            "records_left": self.lag if self.lag >= 0 else None,
            "eta_seconds": self.eta_seconds if self.eta_seconds >= 0 else None,
        }


def live_report(report: MapReport | None, state: str) -> MapReport | None:
    """The report whose catch-up figures hold now: that of a map whose fold runs
    (``FOLDING``), by a materializer still reporting; None for any other."""
    return report if report is not None and state in FOLDING else None


def partition_lags(
    topics: Sequence[str],
    watermark: Watermark | None,
    ends: dict[str, dict[int, int]] | None,
    live: MapReport | None = None,
) -> list[PartitionLag]:
    """One row per partition the watermark or the log knows, in topic and partition order,
    with the catch-up figures of ``live`` (``live_report``) where it has them."""
    figures = {(p.topic, p.partition): p for p in live.catch_up_partitions} if live else {}
    rows = []
    for topic in sorted(topics):
        done = watermark.offsets.get(topic, {}) if watermark else {}
        known = ends.get(topic, {}) if ends is not None else {}
        for partition in sorted(set(done) | set(known)):
            materialized = done.get(partition, 0)
            end = known.get(partition, -1) if ends is not None else -1
            lag = max(0, end - materialized) if end >= 0 else -1
            row = PartitionLag(topic, partition, materialized, end, lag)
            measured = figures.get((topic, partition))
            if measured is not None:
                row = dataclasses.replace(
                    row,
                    catch_up_rate=measured.catch_up_rate,
                    input_rate=measured.input_rate,
                    eta_seconds=measured.eta_seconds,
                )
            rows.append(row)
    return rows


def total_lag(rows: Sequence[PartitionLag]) -> int:
    """The sum over partitions, or -1 when any partition's lag is unknown."""
    lags = [r.lag for r in rows]
    return -1 if -1 in lags else sum(lags)


@dataclass(frozen=True)
class MapView:
    """Everything ``materializer status`` shows of one map."""

    name: str
    state: str
    generation: int
    report: MapReport | None
    watermark: Watermark | None
    partitions: list[PartitionLag]
    total_lag: int
    """-1 when Kafka could not be asked."""
    freshness_ms: int | None
    """Age of the last batch written; with no lag, the map is this fresh or fresher."""
    catch_up_rate: float = 0.0
    """Records per second the watermark advanced, as the run last measured it; 0 for a map
    whose fold is not running."""
    input_rate: float = 0.0
    """Records per second its source logs grew, as the run last measured them."""
    eta_seconds: float = -1.0
    """Seconds until it catches up, as the run last estimated; -1: unknown."""

    def to_json(self) -> dict[str, object]:
        """A plain document for ``--json`` (scripts, monitoring checks)."""
        return {
            "map": self.name,
            "state": self.state,
            "generation": self.generation,
            "error": self.report.error if self.report else "",
            "last_batch_id": self.watermark.batch_id if self.watermark else None,
            "last_batch_at_ms": self.watermark.updated_at_ms if self.watermark else None,
            "freshness_ms": self.freshness_ms,
            "input_rows_per_second": self.report.input_rows_per_second if self.report else 0.0,
            "processed_rows_per_second": (
                self.report.processed_rows_per_second if self.report else 0.0
            ),
            "total_lag": self.total_lag,
            "records_left": self.total_lag if self.total_lag >= 0 else None,
            "catch_up_rate": self.catch_up_rate,
            "input_rate": self.input_rate,
            "eta_seconds": self.eta_seconds if self.eta_seconds >= 0 else None,
            "state_keys": self.report.state_keys if self.report else -1,
            "state_bytes": self.report.state_bytes if self.report else -1,
            "worker_id": self.report.worker if self.report else "",
            "partitions": [p.to_json() for p in self.partitions],
        }


def map_view(
    name: str,
    topics: Sequence[str],
    generation: int,
    report: MapReport | None,
    watermark: Watermark | None,
    ends: dict[str, dict[int, int]] | None,
    now_ms: int,
) -> MapView:
    """Combine what Redis and Kafka say of one map."""
    state = effective_state(report, now_ms)
    live = live_report(report, state)
    rows = partition_lags(topics, watermark, ends, live)
    return MapView(
        name=name,
        state=state,
        generation=generation,
        report=report,
        watermark=watermark,
        partitions=rows,
        total_lag=-1 if ends is None else total_lag(rows),
        freshness_ms=now_ms - watermark.updated_at_ms if watermark else None,
        catch_up_rate=live.catch_up_rate if live else 0.0,
        input_rate=live.input_rate if live else 0.0,
        eta_seconds=live.eta_seconds if live else -1.0,
    )
