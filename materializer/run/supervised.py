"""A map as the run supervises it, and what every room of the run reads: the config in
force and the run's maps, with the one rule for which of them fold live."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from materializer.config import AppConfig
from materializer.contract.status import MapReport
from materializer.group.fencing import Ownership
from materializer.live.query import QUERY_NAME as LIVE_QUERY
from materializer.redis.state_size import StateSize
from materializer.runtime.catch_up import MapCatchUp
from materializer.runtime.pacing import CatchUpPace
from materializer.runtime.query_group import QueryGroup


@dataclass
class SupervisedMap:
    """One map (or enrichment) under supervision: its state, its queries, and its last
    figures, each measured on a thread of its own."""

    name: str
    state: str = "stopped"
    queries: QueryGroup | None = None
    error: str = ""
    restart_id: str = ""
    generation: int = 0
    """The generation its queries last started on."""
    state_size: StateSize | None = None
    """Its fold state as last measured (``StateSizes``)."""
    worker: str = ""
    """The worker of the group running it (``""``: a run outside a group)."""
    owner: Ownership | None = None
    """In a worker group, its ownership since the group gave it to this worker: claimed
    once per assignment, so no restart of it on a worker that lost it claims it back."""
    pace: CatchUpPace | None = None
    """While it catches up beside live maps (``run.pacing``): its pace; None otherwise."""
    catch_up: MapCatchUp | None = None
    """How far it is behind its source logs, as last measured while it ran (``CatchUpTracker``,
    on a thread of its own); None: not measured since it started."""

    def report(self) -> MapReport:
        """The map's state, its fold's latest rates and its catch-up figures.

        A running map with more records left than its ``catch_up.ready_lag``
        reports ``catching_up``; every other state (paused, restoring,
        rebuilding, ...) wins over it, and has no catch-up figures.
        """
        rates = (0.0, 0.0)
        if self.queries is not None and self.state == "running":
            progress: dict[str, Any] = self.queries.fold.lastProgress or {}
            rates = (
                float(progress.get("inputRowsPerSecond") or 0.0),
                float(progress.get("processedRowsPerSecond") or 0.0),
            )
        figures = self.catch_up if self.state == "running" else None
        if rates == (0.0, 0.0) and figures is not None and not figures.catching_up:
            # A real-time fold reports no batches: a map caught up folds what comes in.
            rates = (figures.input_rate, figures.input_rate)
        size = self.state_size
        return MapReport(
            state="catching_up" if figures is not None and figures.catching_up else self.state,
            error=self.error,
            input_rows_per_second=rates[0],
            processed_rows_per_second=rates[1],
            state_keys=-1 if size is None else size.keys,
            state_bytes=-1 if size is None else size.bytes,
            worker=self.worker,
            records_left=-1 if figures is None else figures.records_left,
            catch_up_rate=0.0 if figures is None else figures.catch_up_rate,
            input_rate=0.0 if figures is None else figures.input_rate,
            eta_seconds=-1.0 if figures is None else figures.eta_seconds,
            catch_up_partitions=() if figures is None else figures.partitions,
            fold_path=self._fold_path(),
        )

    def _fold_path(self) -> str:
        """How its fold runs now (``MapReport.fold_path``)."""
        if self.state != "running" or self.queries is None or self.queries.opening:
            return ""
        return "realtime" if self.queries.fold.name == LIVE_QUERY else "microbatch"


@dataclass
class InForce:
    """The config in force and the run's maps: what each room of the run reads. The
    catalog's changes replace ``config`` (``take``); the loop, the catalog's changes and
    the group's share add and remove ``maps``."""

    config: AppConfig
    from_file: frozenset[str] = frozenset()
    """The maps and enrichments of the configuration file (the others are the catalog's)."""
    maps: dict[str, SupervisedMap] = field(default_factory=dict)

    def take(self, config: AppConfig) -> AppConfig:
        """Put ``config`` in force; returns the one it replaces."""
        before, self.config = self.config, config
        return before

    def enrichment(self, name: str) -> bool:
        """Whether ``name`` is an enrichment (supervised as a map is, but with no fold)."""
        return name in self.config.enrichments

    def folds_live(self, m: SupervisedMap) -> bool:
        """Whether a map folds live: a map (not an enrichment) running at full pace, its
        opening batch included (it folds live next). A map catching up paces itself by
        these alone, and by nothing else."""
        return (
            m.state == "running"
            and m.queries is not None
            and m.pace is None
            and not self.enrichment(m.name)
        )

    def live_besides(self, m: SupervisedMap) -> list[SupervisedMap]:
        """The run's other maps that fold live."""
        return [o for o in list(self.maps.values()) if o is not m and self.folds_live(o)]
