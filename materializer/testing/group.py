"""A worker group seen from outside, as tests and benchmarks watch it move maps."""

from __future__ import annotations

from typing import Any

from materializer.contract.redis_layout import status_key
from materializer.contract.status import FOLDING, MapReport


def running_workers(client: Any, names: list[str]) -> dict[str, str]:
    """Each map's worker as its status says, for the maps that report running (or catching
    up: running, still behind its source logs)."""
    out = {}
    for name in names:
        report = MapReport.from_hash(client.hgetall(status_key(name)))
        if report is not None and report.state in FOLDING:
            out[name] = report.worker
    return out
