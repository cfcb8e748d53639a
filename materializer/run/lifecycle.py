"""A map's lifecycle in the run: started (with its opening), stopped, paused, failed,
fenced, restored when Redis lost its copy, and started again when its registry subject
gained fields.

A map opens with one small batch of its fold alone (``job.start_map``'s ``opening``);
the run's pacing then starts its queries as usual, or at a pace while it catches up
beside live maps. Pausing stops a map's queries after the batch in flight, so its offsets
stay put; resuming starts them again from their checkpoints, so nothing is lost or
folded twice. A map whose query fails is reported and the others keep running.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import redis

from materializer.checkpoints.source_loss import SourceDataLoss, check_source, explain_failure
from materializer.clients.kafka_offsets import KafkaAccessError, check_access
from materializer.clients.redis import TRANSIENT_ERRORS, client_for
from materializer.contract.control import Control
from materializer.contract.markers import is_whole
from materializer.contract.redis_layout import generation_key, physical_name
from materializer.contract.status import MapReport
from materializer.enrichment.job import start_enrichment
from materializer.errors import MaterializerError
from materializer.group.fencing import take_over
from materializer.job import start_map
from materializer.live.positions import handed_back
from materializer.redis.functions import CopyLost, Fenced
from materializer.redis.indexes import IndexBuilds
from materializer.restore.automatic import ensure_whole
from materializer.run.rebuilds import Rebuilds
from materializer.run.supervised import InForce, SupervisedMap
from materializer.runtime.metrics import BatchMetrics
from materializer.runtime.pacing import CatchUpPace
from materializer.runtime.progress import BatchLog
from materializer.source.formats.arrow_decode import SchemaMoved

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_RECOVERABLE_TYPES: tuple[type[Exception], ...] = (CopyLost, *TRANSIENT_ERRORS)
RECOVERABLE = tuple(f"{cls.__module__}.{cls.__name__}" for cls in _RECOVERABLE_TYPES)
"""Failures of a map's query that a restart mends once Redis answers again with a whole
copy (``MapLifecycle.restore``): a server that restarted, empty or not, or a cluster that
was down for a while. Anything else fails the map."""
FENCED_ERROR = f"{Fenced.__module__}.{Fenced.__name__}"
"""A query that failed on this: another worker of the group may own its map now."""
SCHEMA_MOVED = re.compile(re.escape(f"{SchemaMoved.__module__}.{SchemaMoved.__name__}: ") + "(.*)")
"""A query that stopped on this: the map's registry subject gained fields, which a start
reads (``schema_moves``)."""


@dataclass(frozen=True)
class Trouble:
    """What ails a running map, and what mends it."""

    kind: Literal["fenced", "restore", "moved", "fail"]
    why: str


class MapLifecycle:
    """Starts, stops, fails, fences and restores the run's maps, one at a time."""

    def __init__(
        self,
        spark: SparkSession,
        run: InForce,
        rebuilds: Rebuilds,
        batch_log: BatchLog,
        generation: Callable[[str], int],
        metrics: BatchMetrics | None,
        report: Callable[[dict[str, MapReport]], None],
        in_group: bool,
        indexes: IndexBuilds,
    ) -> None:
        """``report`` writes maps' states at once, for a state the loop would report late;
        ``in_group``: the run is a worker of a group (a map's bad config fails the map alone
        there, never the worker); ``indexes``: where a started map's indexes are declared
        and built."""
        self._spark = spark
        self._run = run
        self._rebuilds = rebuilds
        self._batch_log = batch_log
        self._generation = generation
        self._metrics = metrics
        self._report = report
        self._in_group = in_group
        self._indexes = indexes
        self._access_checked = False

    def _check_access(self) -> None:
        """Once per run: credentials do not change while it runs, and brokers that do not
        answer would cost every map the check's whole timeout."""
        if not self._access_checked:
            check_access(self._run.config.kafka)
            self._access_checked = True

    def start(
        self, m: SupervisedMap, opening: bool = True, pace: CatchUpPace | None = None
    ) -> None:
        """Start a map's queries on its current generation; a start that fails marks it failed.

        The generation is read at every start, so a map a rebuild switched over
        while paused resumes on the new copy of its data. ``opening``: one small batch
        of its fold alone first; ``pace``: it catches up beside live maps at that pace.
        """
        m.pace = None
        if self._rebuilds.holds(m.name):
            m.state = "rebuilding"  # its old definition is gone: nothing runs until the switch
            return
        enrichment = self._run.enrichment(m.name)
        try:
            self._check_access()
            if enrichment:
                m.queries = start_enrichment(
                    self._spark, self._run.config, m.name, self._batch_log, metrics=self._metrics
                )
            else:
                m.generation = self._generation(m.name)
                config = self._rebuilds.config_for(m)
                check_source(config, m.name, m.generation)
                starting = handed_back(config, m.name, physical_name(m.name, m.generation))
                m.queries = start_map(
                    self._spark,
                    config,
                    m.name,
                    self._batch_log,
                    generation=m.generation,
                    metrics=self._metrics,
                    owner=m.owner,
                    opening=opening,
                    pace=pace,
                    starting_offsets=starting,
                )
                m.pace = pace
        except Fenced as exc:  # another worker claimed it meanwhile
            self.fenced(m, str(exc))
            return
        except SourceDataLoss as exc:  # records it needs are gone: it alone fails
            self.fail(m, str(exc))
            return
        except KafkaAccessError as exc:  # refused credentials: no restart mends them
            kind = "enrichment" if enrichment else "map"
            self.fail(m, f"{kind} {m.name} cannot reach its topics: {exc}")
            return
        except MaterializerError as exc:
            if m.name in self._run.from_file and not self._in_group:
                raise  # the file's configuration: no restart mends it; the run reports it, ends
            self.fail(m, str(exc))  # a map of the catalog: a change of it may mend it
            return
        except Exception as exc:  # Spark's own errors while building the queries
            self.fail(m, f"could not start: {exc}")
            return
        m.state, m.error = "running", ""
        if not enrichment:
            self.index(m)
        if m.queries.opening:
            log.info("map %s opening: one batch of its fold first", m.name)
        else:
            log.info("map %s running", m.name)

    def index(self, m: SupervisedMap) -> None:
        """Declare the map's indexes as its definition in force says, and build what is
        new while it folds; a Redis that does not answer leaves it to the next start."""
        try:
            self._indexes.want(self._rebuilds.config_for(m), m.name, m.generation)
        except redis.RedisError as exc:
            log.warning("map %s: its indexes could not be declared: %s", m.name, exc)

    def first_start(self, m: SupervisedMap, request: Control) -> None:
        """A map's first start in this run: paused if operators paused it before."""
        m.restart_id = request.restart_id
        if request.desired == "paused":
            m.state = "paused"
            log.info("map %s paused (as requested before this run)", m.name)
        else:
            self.start(m)

    def obey(self, m: SupervisedMap, request: Control) -> None:
        """Operators' requests (``<map>:__control__``): restart, pause, resume."""
        if request.restart_id != m.restart_id:
            m.restart_id = request.restart_id
            log.info("map %s: restart requested", m.name)
            self.stop(m, "stopped")
            if request.desired == "running":
                self.start(m)
            else:
                m.state = "paused"
            return
        if request.desired == "paused" and m.state == "running":
            self.stop(m, "paused")
        elif request.desired == "running" and m.state == "paused":
            self.start(m)

    def stop(self, m: SupervisedMap, state: str) -> None:
        """Stop a map's queries after their batch in flight."""
        if m.queries is not None:
            m.queries.stop_after_batch()
            m.queries = None
        m.state = state
        log.info("map %s %s", m.name, state)

    def stop_all(self, running: list[SupervisedMap]) -> None:
        """The run's end: every fold stops after its batch, then every Delta table takes in
        the changelog up to it, all within ``spark.stop_timeout``."""
        deadline = time.monotonic() + self._run.config.spark.stop_timeout.total_seconds()
        for m in running:
            if m.queries is not None:
                m.queries.stop_fold(deadline)
        for m in running:
            if m.queries is not None and not m.queries.drain(deadline):
                log.warning(
                    "map %s: the stop timeout (spark.stop_timeout) cut its Delta table's "
                    "catch-up short; the next start merges the rest of the changelog",
                    m.name,
                )
            m.queries = None
            m.state = "stopped"
            log.info("map %s stopped", m.name)

    def fail(self, m: SupervisedMap, error: str) -> None:
        """Record a failure; the other maps keep running."""
        log.error("map %s failed, the others keep running: %s", m.name, error)
        if m.queries is not None:
            m.queries.stop()
            m.queries = None
        m.state, m.error = "failed", error

    def moved(self, m: SupervisedMap, why: str) -> None:
        """The map's registry subject gained fields: its queries start again on them, from
        their checkpoints, so the batch that met them is read again with them. Stopped at
        once, not after the Delta query's batch in flight: the fold waits meanwhile, and a
        batch cut short is replayed and changes nothing."""
        log.info("map %s: %s", m.name, why)
        pace = m.pace  # a map catching up at a pace goes on at it
        if m.queries is not None:
            m.queries.stop()
            m.queries = None
        self.start(m, opening=False, pace=pace)

    def fenced(self, m: SupervisedMap, why: str) -> None:
        """Another worker owns the map now: stop its queries without a drain (they could
        write nothing more), and leave the map to the group."""
        if m.queries is not None:
            m.queries.stop()
            m.queries = None
        m.state = "fenced"
        log.warning(
            "map %s: %s; its queries stopped, the worker goes on with its others", m.name, why
        )

    def refenced(self, m: SupervisedMap) -> None:
        """A query refused as fenced: by a newer owner, or, when the map's epoch is still
        this worker's, by a worker that lost the map and woke up to start a producer of
        its id; then the map starts again under a new epoch, which fences that one."""
        try:
            if m.owner is not None:
                m.owner.check()
                log.warning(
                    "map %s: a worker that lost it fenced one of its producers; "
                    "taking it over again under a new epoch",
                    m.name,
                )
                self.stop(m, "stopped")
                m.owner = take_over(self._run.config, m.name)
                self.start(m)
                return
        except Fenced:
            pass
        except Exception as exc:  # noqa: BLE001 - Redis or Kafka away: the group tries later
            log.warning("map %s: cannot take it over again yet: %s", m.name, exc)
        self.fenced(m, "fenced: another worker took it over")

    def restore(self, m: SupervisedMap, why: str) -> None:
        """Stop a map that lost Redis (its copy, or for a while the server), restore its copy
        if a server lost it, and start the map again from its checkpoints.

        The map reports ``restoring`` meanwhile; a restore that fails (Redis
        still unreachable) is tried again on the next loop.
        """
        if m.state != "restoring":
            log.warning("map %s: %s; restarting it once its Redis copy is whole", m.name, why)
            m.state = "restoring"
            self._report({m.name: m.report()})
        if m.queries is not None:
            m.queries.stop_after_batch()
            m.queries = None
        if not self._run.enrichment(m.name):
            try:
                client = client_for(self._run.config.redis)
                if m.generation:  # the pointer to the generation goes with the data
                    client.set(generation_key(m.name), str(m.generation), nx=True)
                ensure_whole(self._run.config, m.name, m.generation)
            except (redis.RedisError, MaterializerError) as exc:
                log.error(
                    "map %s: cannot restore its Redis copy yet, trying again: %s", m.name, exc
                )
                return
        self.start(m)

    def lost(self, m: SupervisedMap) -> bool:
        """Whether a running map's Redis copy lost a master's marker (not an enrichment's)."""
        if self._run.enrichment(m.name):
            return False
        try:
            client = client_for(self._run.config.redis)
            return not is_whole(client, physical_name(m.name, m.generation))
        except redis.RedisError:
            return False  # unreachable: its queries retry, then fail or find it lost

    def trouble(self, m: SupervisedMap) -> Trouble | None:
        """What ails a running map, if anything: a query refused as fenced, Redis that
        failed a query or lost the copy (a restore mends it), or another failure."""
        if m.state != "running" or m.queries is None:
            return None
        broken = [q for q in m.queries.queries if not q.isActive]
        if not broken:
            return Trouble("restore", "Redis lost its copy") if self.lost(m) else None
        error = explain_failure(
            self._run.config, m.name, m.generation, str(broken[0].exception()), broken[0].name
        )
        if FENCED_ERROR in error:
            return Trouble("fenced", error)
        moved = SCHEMA_MOVED.search(error)
        if moved:
            return Trouble("moved", moved.group(1))
        if any(name in error for name in RECOVERABLE):
            return Trouble("restore", "Redis failed its query")
        return Trouble("fail", error)
