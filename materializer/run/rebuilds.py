"""Rebuilds the run carries out when a map's definition changed in a way its state is bound
to: the new definition folds into a new generation on a thread of its own, beside the live
one, and readers move once it caught up (as ``materializer rebuild`` does).

While a rebuild runs, the map's live queries keep the definition they started with (the
config *pinned* to it) and fold into the old generation; once the map starts on the new
generation it takes the config in force. When the old definition is gone (a run that
never knew it), the old copy serves as it stands until the switch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from materializer.catalog.purge import drop_copy
from materializer.clients.redis import client_for
from materializer.config import AppConfig
from materializer.contract.redis_layout import definition_key
from materializer.ops.rebuild import Progress, rebuild
from materializer.run.supervised import InForce, SupervisedMap

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

REBUILD_GRACE = 60.0
"""After readers moved to a rebuilt copy, how long the old one stays: longer than any
reader keeps the old generation in mind."""


@dataclass
class RebuildJob:
    """A rebuild under way in this run: ``wanted`` is set by the loop, the rest by the
    rebuild's thread."""

    name: str
    version: int
    switched: bool = False
    done: bool = False
    error: str = ""
    wanted: int = 0
    """A later definition to rebuild once this one ends (0: none)."""


class Rebuilds:
    """The rebuilds under way in this run, and the config each rebuilt map runs meanwhile."""

    def __init__(self, spark: SparkSession, run: InForce, generation: Callable[[str], int]) -> None:
        self._spark = spark
        self._run = run
        self._generation = generation
        self._jobs: dict[str, RebuildJob] = {}
        self._pinned: dict[str, tuple[AppConfig, int]] = {}
        """Per map being rebuilt: the config its live queries run and the generation the
        rebuild folds into; the map takes the config in force once readers moved there."""

    def config_for(self, m: SupervisedMap) -> AppConfig:
        """The config to start a map's queries with, for the generation it starts on."""
        pinned = self._pinned.get(m.name)
        if pinned is None:
            return self._run.config
        old, target = pinned
        if m.generation >= target:
            del self._pinned[m.name]
            return self._run.config
        return old

    def holds(self, name: str) -> bool:
        """Whether nothing of the map may run until its rebuild switches readers over: a
        rebuild is under way and its old definition is gone."""
        return name in self._jobs and name not in self._pinned

    def busy(self, name: str, kind: str) -> str:
        """Why an operation of ``kind`` asked of the map cannot run now ("" when it can)."""
        if kind == "rebuild" and name in self._jobs:
            return "a rebuild of its changed definition is under way"
        return ""

    def begin(
        self,
        m: SupervisedMap,
        before: AppConfig | None,
        version: int,
        stop: Callable[[SupervisedMap, str], None],
    ) -> None:
        """Fold definition ``version`` of the map into a new generation beside the live one,
        which keeps serving (and folding, on ``before``, its old definition, when this run
        knew it); when the old definition is gone, ``stop`` stops the map meanwhile and the
        old copy serves as it stands. A rebuild asked while one is under way waits for it
        to end."""
        job = self._jobs.get(m.name)
        if job is not None:
            log.warning(
                "map %s: a rebuild is under way; definition %d is rebuilt once it ends",
                m.name,
                version,
            )
            job.wanted = version
            return
        target = self._generation(m.name) + 1
        if before is not None and m.name in before.maps:
            self._pinned[m.name] = (before, target)
        else:
            stop(m, "rebuilding")
        job = self._jobs[m.name] = RebuildJob(m.name, version)
        log.info("map %s: rebuilding definition %d into generation %d", m.name, version, target)
        threading.Thread(
            target=self._rebuild,
            args=(job, self._run.config),
            name=f"rebuild-{m.name}",
            daemon=True,
        ).start()

    def _rebuild(self, job: RebuildJob, config: AppConfig) -> None:
        client = client_for(config.redis)

        def moved(progress: Progress) -> None:
            if progress.phase == "grace" and not job.switched:
                job.switched = True
                client.set(definition_key(job.name), str(job.version))
                log.info("map %s: readers moved to definition %d", job.name, job.version)

        try:
            rebuild(self._spark, config, job.name, report=moved, grace_seconds=REBUILD_GRACE)
        except Exception as exc:  # noqa: BLE001 - reported as the map's error, the run goes on
            job.error = f"the rebuild of definition {job.version} failed: {exc}"
            log.error("map %s: %s", job.name, job.error)
        finally:
            job.done = True

    def ended(self, name: str) -> RebuildJob | None:
        """The map's rebuild, once it ended (then no longer under way); None otherwise."""
        job = self._jobs.get(name)
        if job is None or not job.done:
            return None
        del self._jobs[name]
        self._pinned.pop(name, None)
        return job

    def drop_old_copies(self, name: str) -> None:
        """Drop, on a thread, the copies a rebuild left behind when a stop cut its grace
        period short (readers moved long since: the run has started again)."""
        current = self._generation(name)
        config = self._run.config

        def drop() -> None:
            client = client_for(config.redis)
            for generation in range(current):
                try:
                    drop_copy(config, client, name, generation)
                except Exception as exc:  # noqa: BLE001 - left for the next start
                    log.warning("map %s: cannot drop generation %d yet: %s", name, generation, exc)

        if current:
            threading.Thread(target=drop, name=f"drop-{name}", daemon=True).start()
