"""The maps' figures, each measured on a daemon thread of its own beside the loop: their
fold state's size, how far they are behind their source logs, and their history."""

from __future__ import annotations

from collections.abc import Mapping

from materializer.config import AppConfig
from materializer.contract.redis_layout import physical_name
from materializer.contract.status import MapReport
from materializer.redis.state_size import StateSize, StateSizes
from materializer.run.supervised import InForce
from materializer.runtime.catch_up import CatchUpTracker, Followed, MapCatchUp
from materializer.runtime.history import HistoryRecorder
from materializer.runtime.metrics import BatchMetrics


class MapFigures:
    """Measures the run's maps and hands each figure to the map and to the metrics."""

    def __init__(self, config: AppConfig, run: InForce, metrics: BatchMetrics) -> None:
        """``config``: the file's (where the figures are kept and how often they are taken)."""
        self._run = run
        self._metrics = metrics
        self._sizes = StateSizes(
            config.redis,
            self._physical,
            self._measured,
            config.metrics.state_interval.total_seconds(),
        )
        self._catch_up = CatchUpTracker(config.kafka, config.redis, self._followed, self._caught_up)
        self._history: HistoryRecorder | None = None
        if config.metrics.history.max_len:
            self._history = HistoryRecorder(
                config.redis,
                metrics.intervals,
                config.metrics.history.interval.total_seconds(),
                config.metrics.history.max_len,
            )

    def start(self) -> None:
        """Start every measure's thread."""
        self._sizes.start()
        self._catch_up.start()
        if self._history is not None:
            self._history.start()

    def reported(self, reports: Mapping[str, MapReport]) -> None:
        """The maps' reports of this loop: the history samples them (enrichments have none)."""
        if self._history is not None:
            self._history.reported({n: r for n, r in reports.items() if n in self._run.config.maps})

    def forget(self, name: str) -> None:
        """A map deleted: its history gets no sample more (see ``HistoryRecorder.forget``)."""
        if self._history is not None:
            self._history.forget(name)

    def stop_sampling(self) -> None:
        """Stop the state sizes and the history (at the run's end, before the maps stop)."""
        self._sizes.stop()
        if self._history is not None:
            self._history.stop()

    def stop(self) -> None:
        """Stop the catch-up figures too: last, so that a look at a Kafka that does not
        answer never delays the maps' drain."""
        self.stop_sampling()
        self._catch_up.stop()

    def _physical(self) -> dict[str, str]:
        return {m.name: physical_name(m.name, m.generation) for m in list(self._run.maps.values())}

    def _measured(self, name: str, size: StateSize) -> None:
        m = self._run.maps.get(name)
        if m is not None:
            m.state_size = size
        self._metrics.state_size(name, size.keys, size.bytes)

    def _followed(self) -> dict[str, Followed]:
        """The maps whose fold runs here now (not enrichments), for the catch-up figures."""
        out = {}
        for m in list(self._run.maps.values()):
            definition = self._run.config.maps.get(m.name)
            if m.state == "running" and definition is not None:
                out[m.name] = Followed(
                    physical=physical_name(m.name, m.generation),
                    topics=tuple(definition.source.topics),
                    ready_lag=definition.catch_up.ready_lag,
                    from_latest=definition.source.starting_offsets == "latest",
                )
        return out

    def _caught_up(self, name: str, figures: MapCatchUp | None) -> None:
        m = self._run.maps.get(name)
        if m is not None:
            m.catch_up = figures
        self._metrics.catch_up(name, figures)
