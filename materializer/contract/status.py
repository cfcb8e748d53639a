"""A map's state and lag as operators see it, from its report, watermark and Kafka's log ends.

Shared by ``materializer status`` and the query service's ``GetStatus``, so
both say the same thing of the same map.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from materializer.contract.redis_layout import MapReport, Watermark

IN_HAND = ("running", "paused", "restoring", "rebuilding", "stopping")
"""The states of a map a materializer holds: its queries, or their return, are in hand."""

STALE_REPORT_MS = 15_000
"""A running materializer reports every half second; silence this long means it is gone."""


def effective_state(report: MapReport | None, now_ms: int) -> str:
    """``not_started``, or the reported state; a running, paused or rebuilding map gone silent
    is ``stopped``.

    A killed materializer cannot say it stopped, so the report's age decides.
    """
    if report is None:
        return "not_started"
    live = ("running", "paused", "rebuilding")
    if report.state in live and now_ms - report.reported_at_ms > STALE_REPORT_MS:
        return "stopped"
    return report.state


@dataclass(frozen=True)
class PartitionLag:
    """How far one source partition is materialized; -1 where Kafka could not be asked."""

    topic: str
    partition: int
    materialized_offset: int
    log_end_offset: int
    lag: int


def partition_lags(
    topics: Sequence[str],
    watermark: Watermark | None,
    ends: dict[str, dict[int, int]] | None,
) -> list[PartitionLag]:
    """One row per partition the watermark or the log knows, in topic and partition order."""
    rows = []
    for topic in sorted(topics):
        done = watermark.offsets.get(topic, {}) if watermark else {}
        known = ends.get(topic, {}) if ends is not None else {}
        for partition in sorted(set(done) | set(known)):
            materialized = done.get(partition, 0)
            end = known.get(partition, -1) if ends is not None else -1
            lag = max(0, end - materialized) if end >= 0 else -1
            rows.append(PartitionLag(topic, partition, materialized, end, lag))
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
            "state_keys": self.report.state_keys if self.report else -1,
            "state_bytes": self.report.state_bytes if self.report else -1,
            "worker_id": self.report.worker if self.report else "",
            "partitions": [dataclasses.asdict(p) for p in self.partitions],
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
    rows = partition_lags(topics, watermark, ends)
    return MapView(
        name=name,
        state=effective_state(report, now_ms),
        generation=generation,
        report=report,
        watermark=watermark,
        partitions=rows,
        total_lag=-1 if ends is None else total_lag(rows),
        freshness_ms=now_ms - watermark.updated_at_ms if watermark else None,
    )
