"""Catch-up pacing: what a map does once its opening batch ran, and how a map catching up
beside live ones follows their pace (``runtime.pacing.CatchUpPace``).

A map that opened far behind (more than its ``catch_up.ready_lag``) while another map
of the run folds live, and whose config bounds its batches, catches up at a pace; it
runs as usual once within its ready lag, or once no other map folds live.
"""

from __future__ import annotations

import logging

from materializer.run.lifecycle import MapLifecycle
from materializer.run.rebuilds import Rebuilds
from materializer.run.supervised import InForce, SupervisedMap
from materializer.runtime.metrics import BatchMetrics, records_behind
from materializer.runtime.pacing import CatchUpPace

log = logging.getLogger(__name__)


class CatchUpPacing:
    """Starts opened maps at a pace or as usual, and keeps each paced map's pace."""

    def __init__(
        self,
        run: InForce,
        lifecycle: MapLifecycle,
        rebuilds: Rebuilds,
        metrics: BatchMetrics | None,
    ) -> None:
        self._run = run
        self._lifecycle = lifecycle
        self._rebuilds = rebuilds
        self._metrics = metrics

    def opened(self, m: SupervisedMap) -> None:
        """The map's opening batch ran: start its queries, at a pace if it paces."""
        if m.queries is None:
            return
        behind = records_behind(m.queries.fold.lastProgress)
        m.queries.stop()  # between batches: its trigger waits a day
        paced = behind is not None and self._paces(m, behind)
        self._lifecycle.start(m, opening=False, pace=CatchUpPace(m.name) if paced else None)

    def _paces(self, m: SupervisedMap, behind: int) -> bool:
        """Whether a map that opened ``behind`` records behind catches up at a pace: another
        map of the run folds live, and its config bounds its batches."""
        settings = self._rebuilds.config_for(m).map(m.name).catch_up
        if settings.max_records_per_batch is None or behind <= settings.ready_lag:
            return False
        return bool(self._run.live_besides(m))

    def follow(self, m: SupervisedMap) -> None:
        """A paced catch-up: slower while the live maps' batches run long; once within its
        ready lag, or once no other map folds live, it runs as usual."""
        if m.pace is None or m.queries is None:
            return
        ready = self._rebuilds.config_for(m).map(m.name).catch_up.ready_lag
        behind = records_behind(m.queries.fold.lastProgress)
        live = self._run.live_besides(m)
        if behind is not None and (behind <= ready or not live):
            log.info(
                "map %s: %s, running as usual",
                m.name,
                "caught up" if behind <= ready else "no other map folds live",
            )
            m.queries.stop_after_batch()
            self._lifecycle.start(m, opening=False)
        else:
            m.pace.follow(_last_batches_ms(live))
        if self._metrics is not None:
            self._metrics.paced(m.name, None if m.pace is None else m.pace.paced_seconds)


def _last_batches_ms(maps: list[SupervisedMap]) -> list[int]:
    """The durations of the maps' last batches (a map with none yet has none)."""
    durations = []
    for m in maps:
        progress = None if m.queries is None else m.queries.fold.lastProgress
        if progress is not None:
            durations.append(int(progress.get("batchDuration") or 0))
    return durations
