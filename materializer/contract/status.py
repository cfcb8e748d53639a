"""A map's status: the run's report of it, and its state and lag as operators see them.

The run that holds a map writes its report (``MapReport``) to ``<map>:__status__``
(``redis_layout.status_key``) while it runs; ``materializer status``, the query
service's ``GetStatus``, its health and the console read it back with the map's
watermark and Kafka's log ends, and this module says what all of them make of it, so
each says the same thing of the same map (docs/redis-layout.md, *Status and control*).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from materializer.contract.redis_layout import text_fields
from materializer.contract.watermark import Watermark

FOLDING = ("running", "catching_up")
"""The states of a map whose fold runs: ``catching_up`` is ``running`` with more records
left in its source logs than its ``catch_up.ready_lag``, so read-your-writes callers wait."""

IN_HAND = ("running", "catching_up", "paused", "restoring", "rebuilding", "stopping")
"""The states of a map a materializer holds: its queries, or their return, are in hand."""

STALE_REPORT_MS = 15_000
"""A running materializer reports every half second; silence this long means it is gone."""


@dataclass(frozen=True)
class PartitionCatchUp:
    """How fast one source partition of a running map is being caught up, as the run
    measured it over its last half minute or so (``materializer.runtime.catch_up``)."""

    topic: str
    partition: int
    records_left: int
    """Records in the log beyond the map's watermark; -1: unknown."""
    catch_up_rate: float
    """Records per second the map's watermark advanced."""
    input_rate: float
    """Records per second the partition's log grew (what producers add)."""
    eta_seconds: float
    """``records_left / (catch_up_rate - input_rate)`` when that gap is positive (0 when
    nothing is left); -1: unknown, the map is not gaining on its log."""

    def to_json(self) -> dict[str, object]:
        """One entry of the report's ``catch_up_partitions``."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "records_left": self.records_left,
            "catch_up_rate": self.catch_up_rate,
            "input_rate": self.input_rate,
            "eta_seconds": self.eta_seconds,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PartitionCatchUp:
        """Parse one entry of ``catch_up_partitions``."""
        return cls(
            topic=str(doc["topic"]),
            partition=int(doc["partition"]),
            records_left=int(doc.get("records_left", -1)),
            catch_up_rate=float(doc.get("catch_up_rate", 0.0)),
            input_rate=float(doc.get("input_rate", 0.0)),
            eta_seconds=float(doc.get("eta_seconds", -1.0)),
        )


@dataclass(frozen=True)
class MapReport:
    """A map's state as the materializer last reported it, every second or so while it runs.

    A report older than a few intervals means the materializer is gone (killed,
    not stopped cleanly), whatever ``state`` says.
    """

    state: str
    error: str = ""
    reported_at_ms: int = 0
    input_rows_per_second: float = 0.0
    processed_rows_per_second: float = 0.0
    state_keys: int = -1
    """The fold's state keys when last measured (about once a minute); -1: not yet."""
    state_bytes: int = -1
    """Their Redis memory, estimated from a sample; -1: not yet."""
    worker: str = ""
    """The worker running the map (``worker.id``; ``""``: a run outside a worker group)."""
    records_left: int = -1
    """Records in the source logs beyond the map's watermark, as the run last measured them
    (about every second, while the map runs); -1: not measured (a map not running, Kafka
    not answering, or a report of a materializer from before these figures)."""
    catch_up_rate: float = 0.0
    """Records per second the watermark advanced over the last half minute or so."""
    input_rate: float = 0.0
    """Records per second the source logs grew over the same span."""
    eta_seconds: float = -1.0
    """When the map should have caught up, in seconds from the report: ``records_left /
    (catch_up_rate - input_rate)``, 0 with nothing left; -1: unknown."""
    catch_up_partitions: tuple[PartitionCatchUp, ...] = ()
    """The same figures per source partition."""
    fold_path: str = ""
    """How its fold runs now: ``microbatch``, or ``realtime`` in the run's shared real-time
    query; ``""``: not folding (or a report of a materializer from before the paths)."""

    def to_hash(self) -> dict[str, str]:
        """The fields of ``<map>:__status__``."""
        partitions = [p.to_json() for p in self.catch_up_partitions]
        return {
            "state": self.state,
            "error": self.error,
            "reported_at_ms": str(self.reported_at_ms),
            "input_rows_per_second": repr(self.input_rows_per_second),
            "processed_rows_per_second": repr(self.processed_rows_per_second),
            "state_keys": str(self.state_keys),
            "state_bytes": str(self.state_bytes),
            "worker": self.worker,
            "records_left": str(self.records_left),
            "catch_up_rate": repr(self.catch_up_rate),
            "input_rate": repr(self.input_rate),
            "eta_seconds": repr(self.eta_seconds),
            "catch_up_partitions": orjson.dumps(partitions).decode(),
            "fold_path": self.fold_path,
        }

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> MapReport | None:
        """Parse ``HGETALL <map>:__status__``; ``None`` when nothing was reported yet."""
        fields = text_fields(raw)
        if "state" not in fields:
            return None
        return cls(
            state=fields["state"],
            error=fields.get("error", ""),
            reported_at_ms=int(fields.get("reported_at_ms", "0")),
            input_rows_per_second=float(fields.get("input_rows_per_second", "0")),
            processed_rows_per_second=float(fields.get("processed_rows_per_second", "0")),
            state_keys=int(fields.get("state_keys", "-1")),
            state_bytes=int(fields.get("state_bytes", "-1")),
            worker=fields.get("worker", ""),
            records_left=int(fields.get("records_left", "-1")),
            catch_up_rate=float(fields.get("catch_up_rate", "0")),
            input_rate=float(fields.get("input_rate", "0")),
            eta_seconds=float(fields.get("eta_seconds", "-1")),
            catch_up_partitions=tuple(
                PartitionCatchUp.from_json(p)
                for p in orjson.loads(fields.get("catch_up_partitions", "[]"))
            ),
            fold_path=fields.get("fold_path", ""),
        )


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
            "fold_path": self.report.fold_path if self.report and self.state in FOLDING else "",
            # Lookups a restoring map's Redis copy cannot answer yet read its Delta table.
            "serves_from_table": self.state == "restoring",
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
