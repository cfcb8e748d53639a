"""The run's loop: every half second it takes in the catalog's changes (polled every
``catalog.poll_interval``) and, in a worker group, the group's share, steps each map,
takes up operations asked of them and reports their states, until told to stop; then it
drains every map and closes what it opened."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from materializer.catalog.live import LiveMaps
from materializer.config import AppConfig
from materializer.contract.status import IN_HAND, MapReport
from materializer.errors import ConfigError
from materializer.group.worker import Worker
from materializer.ops.requested import RequestedOperations
from materializer.run.figures import MapFigures
from materializer.run.following import CatalogChanges
from materializer.run.rebuilds import REBUILD_GRACE
from materializer.run.sharing import GroupShare
from materializer.run.supervised import SupervisedMap
from materializer.run.supervisor import Supervisor
from materializer.runtime.control_channel import ControlChannel
from materializer.runtime.listener import listen
from materializer.runtime.metrics import BatchMetrics
from materializer.runtime.progress import BatchLog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


LOOP_SECONDS = 0.5


def open_catalog(config: AppConfig, names: Sequence[str] | None) -> LiveMaps:
    """The catalog, read once, with the named maps checked against it (a worker group runs
    every map: it takes no names)."""
    live = LiveMaps(config)
    live.start()
    errors = [
        f"maps.{n}: no such map (known: {', '.join(sorted(live.config.maps)) or 'none'})"
        for n in names or []
        if n not in live.config.maps and n not in config.enrichments
    ]
    if not errors and config.worker.group is not None and names is not None:
        errors = [
            f"worker.group: {config.worker.group}: a worker group shares every map "
            "between its workers; run it without --map"
        ]
    if errors:
        live.close()
        raise ConfigError("", errors)
    return live


class RunLoop:
    """One run's maps, the services beside them, and the loop that ties them."""

    def __init__(
        self,
        config: AppConfig,
        names: Sequence[str] | None,
        live: LiveMaps,
        spark: SparkSession,
        metrics: BatchMetrics,
        worker: Worker | None,
    ) -> None:
        """``config``: the file's; ``names``: the maps to run (None: every one in force);
        ``worker``: this run's place in its worker group (None: it runs them all)."""
        self._names = names
        self._live = live
        self._enrichments = sorted(config.enrichments)
        self.worker = worker
        batch_log = BatchLog()
        listen(spark, batch_log, metrics)
        self.channel = ControlChannel(config.redis, self.in_force())
        self.supervisor = Supervisor(
            spark,
            live.config,
            batch_log,
            self.channel.generation,
            metrics,
            self.channel.report,
            self.worker,
            from_file=frozenset(config.maps) | frozenset(config.enrichments),
        )
        self.operations = RequestedOperations(
            spark,
            lambda: self.supervisor.config,
            config.worker.worker_id() if self.worker is None else self.worker.id,
            busy=self.supervisor.busy,
            grace_seconds=REBUILD_GRACE,
        )
        self.figures = MapFigures(config, self.supervisor.run, metrics)
        self.changes = CatalogChanges(self.supervisor, live, self.channel, self.figures)
        self.share = None
        if self.worker is not None:
            self.share = GroupShare(
                self.supervisor, self.changes, self.channel, self.worker, metrics
            )
        # A worker of a group starts the maps the group gives it, as it gives them.
        if self.worker is None:
            self.supervisor.maps = {name: SupervisedMap(name) for name in self.in_force()}
        self._following = config.catalog.enabled
        self._poll = config.catalog.poll_interval.total_seconds()
        self._next_poll = 0.0

    @property
    def maps(self) -> dict[str, SupervisedMap]:
        """The maps this run holds now."""
        return self.supervisor.maps

    def in_force(self) -> list[str]:
        """The maps (then enrichments) to run: the named ones, or every one in force."""
        maps = self._live.config.maps
        if self._names is not None:
            return [n for n in self._names if n in maps or n in self._enrichments]
        return [*sorted(maps), *self._enrichments]

    def start(self, stop: threading.Event) -> None:
        """Start the figures, join the group, and start the maps the run holds."""
        self.figures.start()
        if self.worker is not None:
            self.worker.start()
        requests = self.channel.requests()
        for m in self.maps.values():
            if stop.is_set():
                break
            self.changes.first_start(m, requests[m.name])
        self._next_poll = time.monotonic() + self._poll

    def goes_on(self) -> bool:
        """Whether there is anything to run: a worker waits for the group's maps, a run
        following the catalog for its first map; otherwise a map running or paused."""
        return (
            self.worker is not None
            or (self._following and not self.maps)
            or any(m.state in IN_HAND for m in self.maps.values())
        )

    def step(self) -> None:
        """One loop: the catalog's changes, the group's share, each map, operations, reports."""
        if time.monotonic() >= self._next_poll:
            self._next_poll = time.monotonic() + self._poll
            if self._live.refresh():
                wanted = self.in_force()
                if self.share is not None:  # the group's moves are the share's
                    wanted = [n for n in wanted if n in self.maps]
                self.changes.follow(wanted)
        if self.share is not None:
            self.share.share(self.in_force())
        requests = self.channel.requests()
        for m in self.maps.values():
            self.supervisor.step(m, requests[m.name])
        self.supervisor.live.settle()
        # Operations asked of the maps this run holds (in a group: the maps it owns).
        self.operations.step(
            m.name
            for m in self.maps.values()
            if m.state != "fenced" and not self.supervisor.run.enrichment(m.name)
        )
        reports = self._reports()
        self.channel.report(reports)
        self.figures.reported(reports)

    def _reports(self) -> dict[str, MapReport]:
        """Every map's report but a fenced one's (another worker's to report)."""
        return {m.name: m.report() for m in self.maps.values() if m.state != "fenced"}

    def close(self) -> None:
        """Drain the maps and close what this loop opened, in order (the catalog, Spark and
        the metrics port are the caller's).

        A worker of a group drains too before it leaves: when the whole group stops
        at once no next owner comes to take in the rest of its maps' changelogs, and
        a data team would read tables behind Redis until the group starts again.
        """
        self.figures.stop_sampling()
        # Operations end at their next step; one holding its map still sees it stopped below.
        self.operations.interrupt()
        running = [m for m in self.maps.values() if m.state == "running"]
        self.supervisor.lifecycle.stop_all(running)
        self.supervisor.live.close()
        self.supervisor.indexes.close()
        self.channel.report(self._reports())
        self.operations.close()
        if self.worker is not None:  # drained: the others take the maps over at once
            self.worker.close()
        self.figures.stop()  # last: a look at a Kafka that does not answer must not delay the drain
        self.channel.close()

    def failed(self) -> list[str]:
        """The maps that failed."""
        return [m.name for m in self.maps.values() if m.state == "failed"]
