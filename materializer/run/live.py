"""The run's real-time path: its caught-up maps share one query in Spark's Real-time Mode
(``live.query``), which this room starts, restarts when its maps change, and watches.

A map whose path is ``realtime`` (``AppConfig.fold_path``) opens and catches up in
micro-batches; once its fold is within its ``catch_up.ready_lag`` it joins: its fold
stops after its batch and the next start of the shared query takes it from its watermark.
It leaves when it stops for any reason (pause, restart, delete, rebuild, failure, a
fence, the run's end) or falls far behind (``FAR_BEHIND``): the shared query stops, its
writer committing what it applied, and starts again without it; the map's micro-batch
fold then starts where the real-time path left it (``live.positions.handed_back``).

The maps' Delta tables follow the same way: one micro-batch query merges every member's
changelog (``live.delta``), started and stopped with the shared fold; a member's own Delta
query stops when it joins, and the map's next one takes up where its table stands.

A failed Redis call or transaction of one map names it (the writer's ``MapFailure``): that
map alone sees its fold failed and goes the way a failed micro-batch fold goes; the
others fold on in the query started again without it.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from materializer.checkpoints.running import Checkpoint
from materializer.clients.kafka_offsets import admin_client, partition_ids
from materializer.clients.redis import TRANSIENT_ERRORS, client_for
from materializer.config import AppConfig
from materializer.config.names import checkpoint_path
from materializer.job import MapQueries, map_fold, map_key_paths, records
from materializer.live.delta import DeltaMember
from materializer.live.freshness import take
from materializer.live.marks import LiveMarks
from materializer.live.query import QUERY_NAME, LiveMap, start_live, stop_live
from materializer.redis.functions import FENCED, LOST, CopyLost
from materializer.run.lifecycle import FENCED_ERROR
from materializer.run.live_delta import LiveDelta
from materializer.run.supervised import InForce, SupervisedMap
from materializer.runtime.metrics import BatchMetrics, records_behind
from materializer.runtime.query_group import FINISH_BATCH_TIMEOUT, FoldQuery, stop_after_batch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.types import StructType

    from materializer.redis.sink import RedisFold
    from materializer.runtime.projector import Projector

log = logging.getLogger(__name__)

FAR_BEHIND = 10
"""A map on the real-time path with more records left than this many times its
``catch_up.ready_lag`` goes back to micro-batches, which catch up faster
(docs/decisions/0032-the-live-path-in-real-time-mode.md), and joins again once caught up."""

JOINS_AT_ONCE = 8
"""Joining maps' micro-batch folds stopped at once: each waits for its batch to end."""

JOIN_EVERY_S = 5.0
"""Maps join a running shared query at most this often, so that maps catching up together
join it in one restart; in between they fold on in micro-batches."""

_NAMED = re.compile(r"MATERIALIZER_LIVE_MAP (\S+) : ")
"""How the writer names the map a failure is of (``MapFailure``)."""


class SharedFold:
    """A map's place in the run's real-time query, as its ``QueryGroup`` sees its fold."""

    name = QUERY_NAME

    def __init__(self, path: LivePath, map_name: str) -> None:
        self._path = path
        self._map = map_name

    @property
    def isActive(self) -> bool:  # noqa: N802 - StreamingQuery's name
        """False once the shared query failed over this map (or over none in particular)."""
        return self._map not in self._path.failures

    @property
    def lastProgress(self) -> Any:  # noqa: N802
        """None: a real-time batch reports once it ends, minutes apart; the map's rates are
        its catch-up figures'."""
        return None

    @property
    def status(self) -> dict[str, Any]:
        """Never between batches: a stop does not wait for one to end."""
        return {"isTriggerActive": False, "isDataAvailable": False, "message": "real-time"}

    def exception(self) -> str | None:
        """The shared query's failure, when it is this map's, in the terms the lifecycle
        reads a micro-batch fold's failure in (``in_lifecycle_terms``)."""
        error = self._path.failures.get(self._map)
        return None if error is None else in_lifecycle_terms(error)

    def stop(self) -> None:
        """The map leaves the real-time path."""
        self._path.leave(self._map)

    def processAllAvailable(self) -> None:  # noqa: N802
        """A real-time fold has no batch to wait for: its watermark says how far it is."""
        raise RuntimeError(f"map {self._map} folds in real time: wait for its watermark")


class LivePath:
    """The maps on the run's real-time path and their shared query."""

    def __init__(
        self,
        spark: SparkSession,
        run: InForce,
        config_for: Callable[[SupervisedMap], AppConfig],
        worker_id: str,
        metrics: BatchMetrics | None = None,
    ) -> None:
        """``config_for``: the config a map runs on (a rebuild pins its old one);
        ``worker_id``: names the query's checkpoint, one per worker of a group;
        ``metrics``: where the writers' figures go (``take_figures``)."""
        self._spark = spark
        self._metrics = metrics
        self._marks: LiveMarks | None = None
        """The table marks of the maps on the path (``live.marks``), once a query started."""
        self._left: set[str] = set()
        """Maps that left since the last ``take_figures``: their writers' last figures."""
        self._run = run
        self._config_for = config_for
        self._checkpoint = checkpoint_path(run.config, "__live__", worker_id)
        self._delta = LiveDelta(
            spark,
            run.config,
            checkpoint_path(run.config, "__live__", f"{worker_id}.delta"),
            self._delta_failed,
            metrics,
        )
        """The members' shared Delta query, started with the shared fold."""
        self._members: dict[str, SupervisedMap] = {}
        self._query: StreamingQuery | None = None
        self._changed = False
        self._stopping: dict[str, Future[None]] = {}
        """The micro-batch folds of maps joining, stopping (``join``)."""
        self._stops = ThreadPoolExecutor(max_workers=JOINS_AT_ONCE, thread_name_prefix="join")
        self._folds: dict[str, RedisFold] = {}
        """Each member's fold, built at its first start in the shared query."""
        self._entities: dict[str, StructType] = {}
        """Each member's entity struct, which its changelog is read with."""
        self._started_at = 0.0
        self._slots = _live_slots(spark.sparkContext.master or "")
        self._partitions: dict[str, int] = {}
        self.failures: dict[str, str] = {}
        """Maps whose failure stopped the shared query, until they leave it."""

    def holds(self, name: str) -> bool:
        """Whether the map folds on the real-time path."""
        return name in self._members

    def wants(self, m: SupervisedMap) -> bool:
        """Whether a running map joins now: its path is ``realtime``, its micro-batch fold
        (past its opening, at full pace) is within its ready lag, and its partitions fit
        the slots left."""
        queries = m.queries
        if m.state != "running" or queries is None or queries.opening or m.pace is not None:
            return False
        if self.holds(m.name) or self._run.enrichment(m.name):
            return False
        config = self._config_for(m)
        if config.fold_path(m.name) != "realtime":
            return False
        if self._query is not None and time.monotonic() - self._started_at < JOIN_EVERY_S:
            return False
        behind = records_behind(queries.fold.lastProgress)
        if behind is None or behind > config.map(m.name).catch_up.ready_lag:
            return False
        return self._fits(config, m.name)

    def _fits(self, config: AppConfig, name: str) -> bool:
        """Whether the map's partitions fit the real-time query's slots (said once if not)."""
        if self._slots is None:
            return True
        if name not in self._partitions:
            topics = partition_ids(admin_client(config.kafka), config.map(name).source.topics)
            self._partitions[name] = sum(len(p) for p in topics.values())
            held = sum(self._partitions.get(n, 0) for n in self._members)
            if held + self._partitions[name] > self._slots:
                log.warning(
                    "map %s stays on micro-batches: its %d partitions do not fit the %d task "
                    "slots the real-time query has left (spark.live_slots, spark.master)",
                    name,
                    self._partitions[name],
                    self._slots - held,
                )
        held = sum(self._partitions.get(n, 0) for n in self._members)
        return held + self._partitions[name] <= self._slots

    def join(self, m: SupervisedMap) -> None:
        """Stop the map's micro-batch fold and its Delta query after their batches, beside
        the other maps joining (each stop waits for its batch); the next ``settle`` folds the
        map in the shared query and merges its changelog in the shared Delta query. A stop
        of the map still drains its table (``QueryGroup.catch_up``)."""
        assert m.queries is not None
        queries = [m.queries.fold, *m.queries.side]
        projectors = m.queries.projectors
        if isinstance(m.queries, MapQueries):
            if m.queries.redis_fold is not None:
                self._folds[m.name] = m.queries.redis_fold
            if m.queries.entity is not None:
                self._entities[m.name] = m.queries.entity
        m.queries.projectors, m.queries.side = [], []
        m.queries.fold = SharedFold(self, m.name)
        self._stopping[m.name] = self._stops.submit(_stop_fold, m.name, queries, projectors)
        self._members[m.name] = m
        self._changed = True
        log.info("map %s: caught up, folds on the real-time path", m.name)

    def leave(self, name: str) -> None:
        """The map leaves: the shared query stops now (what its writer applied is committed
        first), and ``settle`` starts it again without the map."""
        if name not in self._members:
            return
        self._noticed()  # a failure of the query is the members' before this one goes
        del self._members[name]
        self._stopped(name, self._stopping.pop(name, None))
        self._folds.pop(name, None)
        self._entities.pop(name, None)
        self._stop_query()
        self.failures.pop(name, None)  # after the stop: nothing of the map runs any more
        if self._marks is not None:
            self._marks.leave([name])
        self._left.add(name)
        self._changed = True
        log.info("map %s left the real-time path", name)

    def far_behind(self, m: SupervisedMap) -> bool:
        """Whether a map on the path has fallen far enough behind to catch up in
        micro-batches (``FAR_BEHIND``)."""
        figures = m.catch_up
        if not self.holds(m.name) or figures is None:
            return False
        ready = self._config_for(m).map(m.name).catch_up.ready_lag
        return figures.records_left > FAR_BEHIND * max(ready, 1)

    def settle(self) -> None:
        """Once a loop: take in a failure of the shared query, start it again when its
        maps changed or it stopped, and take its writers' figures."""
        self.take_figures()
        self._noticed()
        if not self._changed:
            self._delta.retry(lambda: [self._delta_member(m) for m in self._folding()])
            return
        self._changed = False
        self._stop_query()
        self._await_joins()
        members = self._folding()
        if not members:
            return
        started = time.monotonic()
        try:
            self._query = start_live(
                self._spark,
                self._run.config,
                [self._live_map(m) for m in members],
                self._checkpoint,
            )
        except Exception as exc:  # noqa: BLE001 - each map's lifecycle takes it from here
            self._failed(f"could not start the real-time query: {exc}")
            return
        self._delta.start([self._delta_member(m) for m in members])
        self._started_at = time.monotonic()
        if self._marks is None:
            self._marks = LiveMarks(self._run.config)
        self._marks.hold({m.name: (m.generation, self._config_for(m)) for m in members})
        log.info(
            "real-time query started in %.1f s for %d maps: %s",
            self._started_at - started,
            len(members),
            ", ".join(sorted(m.name for m in members)),
        )

    def _live_map(self, m: SupervisedMap) -> LiveMap:
        """The map as the shared query takes it, with its fold built once while it stays
        (its micro-batch fold's, when it had one): building it makes its topics ready,
        several admin calls (a hundred maps' start spent a quarter of its time there)."""
        config = self._config_for(m)
        fold = self._folds.get(m.name)
        if fold is None:
            fold = self._folds[m.name] = map_fold(config, m.name, m.generation, owner=m.owner)
        return LiveMap(m.name, m.generation, m.owner, config, fold)

    def _delta_member(self, m: SupervisedMap) -> DeltaMember:
        """The map as the shared Delta query takes it, with the entity struct its fold made
        (made again from its records when it joined without one)."""
        config = self._config_for(m)
        entity = self._entities.get(m.name)
        if entity is None:
            with map_key_paths(m.name):
                keyed = records(self._spark, config, m.name)
                entity = self._folds[m.name].entity_type(keyed)
            self._entities[m.name] = entity
        check = None if m.owner is None else m.owner.check
        return DeltaMember(m.name, m.generation, config, entity, check)

    def _folding(self) -> list[SupervisedMap]:
        """The members the shared queries take: those whose failure is not yet noticed."""
        return [m for n, m in self._members.items() if n not in self.failures]

    def _delta_failed(self, name: str, error: str) -> None:
        """The shared Delta query could not merge one member's changes (from its thread)."""
        if name not in self._members:
            return  # it left meanwhile: its next writer merges its rows
        log.error("map %s: its Delta table's MERGE failed on the real-time path: %s", name, error)
        self.failures[name] = error

    def _noticed(self) -> None:
        """Take in a failure of the shared queries: over the map it names, or over all."""
        query = self._query
        if query is not None and not query.isActive:
            self._failed(str(query.exception()))
            self._query = None
            self._changed = True
        error = self._delta.noticed()
        if error is not None:
            self._failed(error)
            self._changed = True

    def _await_joins(self) -> None:
        """Wait until every joining map's micro-batch fold has stopped (``_stopped``)."""
        for name, stopping in self._stopping.items():
            self._stopped(name, stopping)
        self._stopping.clear()

    def _stopped(self, name: str, stopping: Future[None] | None) -> None:
        """Wait until a joining map's micro-batch fold has stopped. One whose stop failed
        fails the map (as the micro-batch fold's failure would): it does not join."""
        if stopping is None:
            return
        try:
            stopping.result()
        except Exception as exc:  # noqa: BLE001 - the map's lifecycle takes it from here
            self.failures[name] = f"its micro-batch fold did not stop on joining: {exc}"

    def take_figures(self) -> None:
        """Into the maps' metrics, what the writers counted since the last take: how fresh
        each record was when Redis held it, the newest timestamp folded, the dead letters
        (``live.freshness``). A Redis that does not answer now is asked again next loop."""
        names = set(self._members) | self._left
        if self._metrics is None or not names:
            return
        try:
            taken = take(client_for(self._run.config.redis), sorted(names))
        except TRANSIENT_ERRORS as exc:
            log.debug("the real-time path's figures wait for Redis: %s", exc)
            return
        self._left.clear()
        for name, folded in taken.items():
            self._metrics.fold_applied(
                name, folded.newest_timestamp_us, folded.dead_letters, folded.freshness
            )

    def _failed(self, error: str) -> None:
        """The shared query failed: over the map its error names, or over every map."""
        named = _NAMED.search(error)
        if named is not None and named.group(1) in self._members:
            self.failures[named.group(1)] = error
            return
        for name in self._members:
            self.failures[name] = error

    def _stop_query(self) -> None:
        """Stop the shared Delta query after its batch (a map leaving must find its table
        with no other writer), then the shared fold."""
        self._delta.stop()
        if self._query is not None:
            query, self._query = self._query, None
            if not stop_live(self._spark, query):
                log.warning(
                    "the real-time query's writers did not end in time; the next start "
                    "folds their last records again (once)"
                )

    def close(self) -> None:
        """The run's end: the shared query stops (its writer commits what it applied), and
        its checkpoint goes, which names this process and holds nothing a start needs."""
        self._left |= set(self._members)
        self._members.clear()
        self._await_joins()
        self._stops.shutdown()
        self._stop_query()
        self._delta.close()
        if self._marks is not None:
            self._marks.leave(sorted(self._left))
            self._marks.close()
        self.take_figures()
        if self._started_at:
            Checkpoint(self._spark, self._checkpoint).discard()


def _stop_fold(name: str, queries: list[FoldQuery], projectors: list[Projector]) -> None:
    """A joining map's micro-batch fold and Delta query stopped after their batches (stopped
    anyway when the wait fails), its projectors closed."""
    deadline = time.monotonic() + FINISH_BATCH_TIMEOUT
    try:
        for query in queries:
            stop_after_batch(query, deadline)
    finally:
        # Each stopped whatever the others do: a Delta query left running would be a second
        # writer of the table once the shared one starts.
        errors = []
        for query in queries:
            try:
                query.stop()
            except Exception as exc:  # noqa: BLE001 - raised below, once all are stopped
                errors.append(exc)
        for projector in projectors:
            projector.close()
        if errors:
            raise errors[0]
    log.debug("map %s: its micro-batch fold stopped", name)


def _live_slots(master: str) -> int | None:
    """The task slots a local master leaves the real-time query beyond the cores' worth the
    other queries use; None on a cluster (its executors are the deployment's to size)."""
    found = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", master)
    if found is None:
        return 0 if master == "local" else None
    return max(0, int(found.group(1)) - (os.cpu_count() or 1))


def in_lifecycle_terms(error: str) -> str:
    """The writer's failure, led by the name of the error the micro-batch fold raises for
    the same cause, so the lifecycle mends it the same way: a newer owner (Redis refused the
    epoch, or Kafka the producer) fences the map, a lost copy or a Redis away restores it."""
    if FENCED in error or "ProducerFencedException" in error:
        return f"{FENCED_ERROR}: {error}"
    if LOST in error:
        return f"{CopyLost.__module__}.{CopyLost.__name__}: {error}"
    if "JedisConnectionException" in error:
        return f"redis.exceptions.ConnectionError: {error}"
    return error
