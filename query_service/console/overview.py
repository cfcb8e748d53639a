"""The console's front page: every map the token may see, the enrichments and the workers.

The table is also a fragment that htmx fetches again every few seconds; the trend
line beside each map is drawn on the server from the map's recent history samples.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from query_service.console import figures
from query_service.console.page import Page, records_left, state_name
from query_service.console.sessions import SESSION, Session


def _seconds(ms: int) -> float | None:
    """A sample's milliseconds as seconds; None for its -1 (unknown)."""
    return None if ms < 0 else ms / 1000


class Overview(Page):
    """The overview page and its table."""

    async def overview(self, request: web.Request) -> web.Response:
        """Every map the token may see, its state, lag, freshness and rates; the workers."""
        return self.render(request, "overview.html", **await self._overview(request))

    async def overview_rows(self, request: web.Request) -> web.Response:
        """The overview's table alone, for htmx to swap in every few seconds."""
        return self.render(request, "overview_rows.html", **await self._overview(request))

    async def _overview(self, request: web.Request) -> dict[str, Any]:
        session: Session = request[SESSION]
        statuses = await self._calls.status(request, session.grant)
        names = [s.map for s in statuses]
        enrichments = sorted(
            name
            for name in self._live.config.enrichments
            if session.grant is None or session.grant.allows_map(name)
        )
        reports = await self._history.reports(enrichments)
        trends = await self._history.recent(names)
        rows = []
        workers: dict[str, list[str]] = {}
        for status in statuses:
            trend = trends.get(status.map)
            last = trend.last if trend else None
            rows.append(
                {
                    "name": status.map,
                    "state": state_name(status),
                    "error": status.error,
                    "worker": status.worker_id,
                    "lag": status.total_lag,
                    "lag_seconds": _seconds(last.lag_ms) if last else None,
                    "p50": _seconds(last.freshness_p50_ms) if last else None,
                    "p99": _seconds(last.freshness_p99_ms) if last else None,
                    "input_rate": status.input_rate or status.input_rows_per_second,
                    "fold_rate": status.output_rows_per_second,
                    "records_left": records_left(status),
                    "eta": status.eta_seconds,
                    "trend": figures.sparkline(trend.p99s if trend else []),
                }
            )
            if status.worker_id:
                workers.setdefault(status.worker_id, []).append(status.map)
        return {
            "maps": rows,
            "enrichments": [(name, reports.get(name)) for name in enrichments],
            "workers": sorted(workers.items()),
        }
