"""The supervisor: one step of each map per loop, tying its rooms together (the map's
lifecycle, its catch-up pacing, the rebuilds under way, the real-time path) and obeying
operators."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from materializer.config import AppConfig
from materializer.contract.control import Control
from materializer.contract.status import MapReport
from materializer.group.worker import Worker
from materializer.redis.indexes import IndexBuilds
from materializer.run.lifecycle import MapLifecycle
from materializer.run.live import LivePath
from materializer.run.pacing import CatchUpPacing
from materializer.run.rebuilds import Rebuilds
from materializer.run.supervised import InForce, SupervisedMap
from materializer.runtime.metrics import BatchMetrics
from materializer.runtime.pacing import CatchUpPace
from materializer.runtime.progress import BatchLog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class Supervisor:
    """Starts, pauses, resumes, restarts and watches the maps of one run."""

    def __init__(
        self,
        spark: SparkSession,
        config: AppConfig,
        batch_log: BatchLog,
        generation: Callable[[str], int] = lambda _: 0,
        metrics: BatchMetrics | None = None,
        report: Callable[[dict[str, MapReport]], None] = lambda _: None,
        worker: Worker | None = None,
        from_file: frozenset[str] | None = None,
    ) -> None:
        """``report`` writes maps' states at once, for a state the loop would report late.
        ``worker``: this run's place in its worker group (None: it runs every map).
        ``from_file``: the maps and enrichments of the configuration file, when ``config``
        holds the catalog's maps too (None: every one of ``config``)."""
        if from_file is None:
            from_file = frozenset(config.maps) | frozenset(config.enrichments)
        self.run = InForce(config, from_file)
        self.rebuilds = Rebuilds(spark, self.run, generation)
        self.indexes = IndexBuilds()
        self.lifecycle = MapLifecycle(
            spark,
            self.run,
            self.rebuilds,
            batch_log,
            generation,
            metrics,
            report,
            in_group=worker is not None,
            indexes=self.indexes,
        )
        self.pacing = CatchUpPacing(self.run, self.lifecycle, self.rebuilds, metrics)
        worker_id = config.worker.worker_id() if worker is None else worker.id
        self.live = LivePath(spark, self.run, self.rebuilds.config_for, worker_id, metrics)

    @property
    def config(self) -> AppConfig:
        """The config in force; a map a rebuild has not yet moved keeps the one it runs."""
        return self.run.config

    @property
    def maps(self) -> dict[str, SupervisedMap]:
        """The run's maps: a map catching up paces itself by them."""
        return self.run.maps

    @maps.setter
    def maps(self, maps: dict[str, SupervisedMap]) -> None:
        self.run.maps = maps

    def start(
        self, m: SupervisedMap, opening: bool = True, pace: CatchUpPace | None = None
    ) -> None:
        """Start a map's queries (``MapLifecycle.start``)."""
        self.lifecycle.start(m, opening, pace)

    def rebuild(self, m: SupervisedMap, before: AppConfig | None, version: int) -> None:
        """Rebuild the map's definition ``version`` beside its live copy (``Rebuilds``)."""
        self.rebuilds.begin(m, before, version, self.lifecycle.stop)

    def busy(self, name: str, kind: str) -> str:
        """Why an operation of ``kind`` asked of the map cannot run now ("" when it can)."""
        return self.rebuilds.busy(name, kind)

    def _rebuilt(self, m: SupervisedMap) -> None:
        """Notice a rebuild that ended: a map it left stopped starts on its new copy."""
        job = self.rebuilds.ended(m.name)
        if job is None:
            return
        if job.error:
            self.lifecycle.fail(m, job.error)
        elif job.wanted > job.version:
            self.rebuild(m, None, job.wanted)
        elif m.state == "rebuilding":
            self.lifecycle.start(m)

    def step(self, m: SupervisedMap, request: Control) -> None:
        """Bring one map to what is asked of it, and notice a failed query or a lost copy."""
        self._rebuilt(m)
        if m.state == "restoring":
            self.lifecycle.restore(m, "")
            return
        if m.state == "running" and m.queries is not None and m.queries.opened():
            self.pacing.opened(m)
        elif m.pace is not None and m.state == "running":
            self.pacing.follow(m)
        trouble = self.lifecycle.trouble(m)
        if trouble is not None and trouble.kind == "fenced":
            self.lifecycle.refenced(m)
            return
        if trouble is not None and trouble.kind == "restore":
            self.lifecycle.restore(m, trouble.why)
            return
        if trouble is not None and trouble.kind == "moved":
            self.lifecycle.moved(m, trouble.why)
            return
        if trouble is not None:
            self.lifecycle.fail(m, trouble.why)
        self.lifecycle.obey(m, request)
        if self.live.far_behind(m):
            log.info(
                "map %s: far behind on the real-time path, catching up in micro-batches", m.name
            )
            self.lifecycle.stop(m, "stopped")
            self.lifecycle.start(m, opening=False)
        elif self.live.wants(m):
            self.live.join(m)
