"""The run follows the catalog (``materializer.catalog``): a map created there starts, one
changed restarts on its new definition (or is rebuilt beside its live copy when its state
is bound to what changed), one deleted stops after its Delta table took in its changelog;
the others never notice."""

from __future__ import annotations

import logging

from materializer.catalog.changes import state_bound_changes
from materializer.catalog.live import LiveMaps
from materializer.config import MapConfig
from materializer.contract.control import Control
from materializer.run.figures import MapFigures
from materializer.run.supervised import SupervisedMap
from materializer.run.supervisor import Supervisor
from materializer.runtime.control_channel import ControlChannel

log = logging.getLogger(__name__)


class CatalogChanges:
    """The catalog's changes brought to the run's maps, and a map's first start in this run."""

    def __init__(
        self, supervisor: Supervisor, live: LiveMaps, channel: ControlChannel, figures: MapFigures
    ) -> None:
        self._supervisor = supervisor
        self._live = live
        self._channel = channel
        self._figures = figures

    def first_start(self, m: SupervisedMap, request: Control) -> None:
        """A map's first start in this run; one whose definition a rebuild has yet to fold is
        rebuilt instead, and its old copy serves as it stands meanwhile."""
        record = self._live.maps.stored.get(m.name)
        if record is not None and record.rebuilt_at:
            if self._channel.definition(m.name) < record.rebuilt_at:
                m.restart_id = request.restart_id
                self._supervisor.rebuild(m, None, record.version)
                return
            self._supervisor.rebuilds.drop_old_copies(m.name)
        self._supervisor.lifecycle.first_start(m, request)

    def follow(self, wanted: list[str]) -> None:
        """Bring the running maps to the catalog's: start the new, restart the changed, stop
        the deleted. Only those move; the others' queries never stop."""
        supervisor, lifecycle, channel = self._supervisor, self._supervisor.lifecycle, self._channel
        maps = supervisor.maps
        after = self._live.config
        before = supervisor.run.take(after)
        for name in [n for n in maps if n not in wanted]:
            m = maps.pop(name)
            if m.state == "running":
                # A state that does not age: a purge waits until the Delta catch-up is done.
                m.state = "stopping"
                channel.report({name: m.report()})
            lifecycle.stop_all([m] if m.state == "stopping" else [])
            # Before the report that lets a purge start: nothing of this run writes it after.
            self._figures.forget(name)
            m.state = "stopped"
            channel.report({name: m.report()})
            log.info("map %s deleted by %s: its queries stopped", name, self.by(name))
        channel.names = list(wanted)
        requests = channel.requests()
        for name in wanted:
            if name in after.enrichments:
                continue
            version = self._live.maps.version(name)
            old, new = before.maps.get(name), after.maps.get(name)
            if name not in maps:
                m = maps[name] = SupervisedMap(name)
                log.info("map %s created by %s (version %d)", name, self.by(name), version)
                self.first_start(m, requests[name])
            elif old != new:
                m = maps[name]
                if old is not None and new is not None and state_bound_changes(old, new):
                    supervisor.rebuild(m, before, version)
                    continue
                if old is not None and new is not None and _indexes_only(old, new):
                    log.info(
                        "map %s changed by %s (version %d): its indexes, kept while it folds",
                        name, self.by(name), version,
                    )  # fmt: skip
                    if m.state == "running":
                        lifecycle.index(m)
                    continue
                log.info(
                    "map %s changed by %s (version %d): restarting its queries",
                    name, self.by(name), version,
                )  # fmt: skip
                was = m.state
                lifecycle.stop(m, "stopped")
                if was == "paused":
                    m.state = "paused"
                else:
                    lifecycle.start(m)

    def by(self, name: str) -> str:
        """Who made the map's last change in the catalog (``file`` for a map of the file)."""
        record = self._live.maps.records.get(name)
        return "file" if record is None or name in self._live.file_config.maps else record.by or "?"


def _indexes_only(old: MapConfig, new: MapConfig) -> bool:
    """Whether a change touches the map's indexes alone: the fold need not stop for it."""
    return old.model_copy(update={"indexes": []}) == new.model_copy(update={"indexes": []})
