"""What the pages read of the run's own records: history samples, reports, operations.

The charts and trend lines come from ``<map>:__history__``
(``materializer.contract.history``); enrichments, which have no AdminService
status, from their ``__status__`` report; a map's last operation from
``<map>:__operation__``. The pages call this only for maps the token was already
allowed to see through a servicer call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from materializer.clients.redis import AsyncClient
from materializer.contract.history import HistorySample, parse_history
from materializer.contract.operations import Operation
from materializer.contract.redis_layout import history_key, operation_key, status_key
from materializer.contract.status import MapReport

TREND_SAMPLES = 60
"""Samples behind an overview's trend line: the last five minutes at the default interval."""
CHART_SAMPLES = 3_600
"""At most this many samples per chart read: an hour at the shortest interval (1 s)."""

SERIES: dict[str, Callable[[HistorySample], float]] = {
    "input_rate": lambda s: s.input_rate,
    "fold_rate": lambda s: s.fold_rate,
    "freshness_p50_ms": lambda s: s.freshness_p50_ms,
    "freshness_p99_ms": lambda s: s.freshness_p99_ms,
    "freshness_max_ms": lambda s: s.freshness_max_ms,
    "lag_seconds": lambda s: s.lag_ms / 1000 if s.lag_ms >= 0 else -1,
    "batch_ms": lambda s: s.batch_ms,
    "phase_add_batch_ms": lambda s: s.add_batch_ms,
    "phase_latest_offset_ms": lambda s: s.latest_offset_ms,
    "phase_wal_commit_ms": lambda s: s.wal_commit_ms,
    "phase_commit_offsets_ms": lambda s: s.commit_offsets_ms,
    "state_keys": lambda s: s.state_keys,
    "state_bytes": lambda s: s.state_bytes,
    "delta_trailing": lambda s: s.delta_lag_ms / 1000 if s.delta_lag_ms >= 0 else -1,
    "records_left": lambda s: s.lag_records,
}
"""The series a map's charts draw, by the name its page asks for; -1 (unknown) is a gap."""


def chart_series(samples: Sequence[HistorySample]) -> dict[str, Any]:
    """The charts' data: sample times (epoch ms) and each series, ``None`` where unknown.

    Dead letters become a rate per minute over each sample's own interval, so a
    changed sampling interval does not change the chart's scale.
    """
    series: dict[str, list[float | None]] = {
        name: [_known(pick(s)) for s in samples] for name, pick in SERIES.items()
    }
    per_minute: list[float | None] = []
    for i, sample in enumerate(samples):
        span = sample.at_ms - samples[i - 1].at_ms if i else 0
        per_minute.append(sample.dead_letters * 60_000 / span if span > 0 else None)
    series["dead_letters_per_minute"] = per_minute
    return {"t": [s.at_ms for s in samples], "series": series}


class Trend(NamedTuple):
    """What the overview shows of a map's history: the last sample, and freshness p99 in
    seconds over the last samples (``None`` where unknown)."""

    last: HistorySample | None
    p99s: list[float | None]


def _p99(fields: Mapping[Any, Any]) -> float | None:
    raw = fields.get(b"freshness_p99_ms", fields.get("freshness_p99_ms"))
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return None if value < 0 else value / 1000


def _known(value: float) -> float | None:
    return None if value < 0 else value


class HistoryReader:
    """Reads samples, reports and operations on the query service's Redis client."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def recent(self, names: Sequence[str]) -> dict[str, Trend]:
        """Each map's last sample and its last ``TREND_SAMPLES`` freshness p99s (oldest
        first), in one round trip; only the last sample is parsed whole, as the overview of
        many maps shows no more."""
        if not names:
            return {}
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.xrevrange(history_key(name), count=TREND_SAMPLES)
        replies = await pipe.execute()
        trends = {}
        for name, entries in zip(names, replies, strict=True):
            last = parse_history(entries[:1])
            p99s = [_p99(fields) for _, fields in reversed(entries)]
            trends[name] = Trend(last[0] if last else None, p99s)
        return trends

    async def series(self, name: str, since_ms: int) -> dict[str, Any]:
        """The map's chart data since ``since_ms``: its newest ``CHART_SAMPLES`` samples
        when there are more (a short interval), so the charts always reach now."""
        entries: list[Any] = (
            await self._client.xrevrange(
                history_key(name), max="+", min=since_ms, count=CHART_SAMPLES
            )
            or []
        )
        return chart_series(parse_history(reversed(entries)))

    async def reports(self, names: Sequence[str]) -> dict[str, MapReport | None]:
        """The run's last report of each (an enrichment's state, worker and rates)."""
        if not names:
            return {}
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(status_key(name))
        replies = await pipe.execute()
        return {n: MapReport.from_hash(r) for n, r in zip(names, replies, strict=True)}

    async def operation(self, name: str) -> Operation | None:
        """The last operation asked of the map, as far as its run took it."""
        return Operation.from_hash(await self._client.hgetall(operation_key(name)))


def hour_ago_ms() -> int:
    """Where a map's charts start by default."""
    return int(time.time() * 1000) - 3_600_000
