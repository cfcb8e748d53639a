"""The run's real-time path: its caught-up maps share queries in Spark's Real-time Mode
(``live.query``), up to ``spark.live_maps_per_query`` maps each, which this room starts,
restarts when their maps change, and watches.

A map whose path is ``realtime`` (``AppConfig.fold_path``) opens and catches up in
micro-batches; once its fold is within its ``catch_up.ready_lag`` it joins: its fold
stops after its batch and the next start of a shared query with room takes it from its
watermark. It leaves when it stops for any reason (pause, restart, delete, rebuild,
failure, a fence, the run's end) or falls far behind (``FAR_BEHIND``): its query stops,
its writers committing what they applied, and starts again without it; the map's
micro-batch fold then starts where the real-time path left it
(``live.positions.handed_back``). The other queries' maps fold on meanwhile.

Why several queries and not one: each task of a real-time query holds the whole query's
plan for as long as the query runs, so one query's memory grows with its maps times its
partitions (a hundred one-partition maps in one query held 500 MiB of plans), and every
join restarts every map (docs/decisions/0032-the-live-path-in-real-time-mode.md).

The maps' Delta tables follow the same way: one micro-batch query merges every member's
changelog (``live.delta``), started and stopped with the shared fold; a member's own Delta
query stops when it joins, and the map's next one takes up where its table stands.

A failed Redis call or transaction of one map names it (the writer's ``MapFailure``): that
map alone sees its fold failed and goes the way a failed micro-batch fold goes; the
others fold on in the query started again without it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from materializer.checkpoints.running import Checkpoint
from materializer.clients.kafka_offsets import admin_client, partition_ids
from materializer.clients.redis import TRANSIENT_ERRORS, client_for
from materializer.config import AppConfig
from materializer.config.names import checkpoint_path
from materializer.job import MapQueries, map_fold, map_key_paths, records
from materializer.live.delta import DeltaMember
from materializer.live.freshness import take
from materializer.live.marks import LiveMarks
from materializer.live.query import LiveMap, query_name, start_live, stop_live
from materializer.run.live_delta import LiveDelta
from materializer.run.shared_fold import NAMED, SharedFold
from materializer.run.supervised import InForce, SupervisedMap
from materializer.runtime.metrics import BatchMetrics, records_behind
from materializer.runtime.query_group import FINISH_BATCH_TIMEOUT, FoldQuery, stop_after_batch
from materializer.spark.slots import cluster_live_slots, local_live_slots

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
"""Maps join the running shared queries at most this often, so that maps catching up
together join in one restart; in between they fold on in micro-batches."""


@dataclass
class _Group:
    """Maps that share a real-time query: their names in joining order, the query while it
    runs and the maps it folds, and whether it must start again (its maps changed, or it
    stopped)."""

    index: int
    maps: list[str] = field(default_factory=list)
    query: StreamingQuery | None = None
    folding: set[str] = field(default_factory=set)
    """The maps the running query folds (none once it stopped)."""
    changed: bool = False
    starts: int = 0

    @property
    def name(self) -> str:
        """The name of its query now: each start's its own, so that a stop waits for that
        query's writers only, never for those a failed one of the group still drains."""
        return query_name(self.index, self.starts)


class LivePath:
    """The maps on the run's real-time path and their shared queries."""

    def __init__(
        self,
        spark: SparkSession,
        run: InForce,
        config_for: Callable[[SupervisedMap], AppConfig],
        worker_id: str,
        metrics: BatchMetrics | None = None,
    ) -> None:
        """``config_for``: the config a map runs on (a rebuild pins its old one);
        ``worker_id``: names the queries' checkpoints (``<worker>.<group>``), one set per
        worker of a group;
        ``metrics``: where the writers' figures go (``take_figures``)."""
        self._spark = spark
        self._metrics = metrics
        self._marks: LiveMarks | None = None
        """The table marks of the maps on the path (``live.marks``), once a map joined."""
        self._left: set[str] = set()
        """Maps that left since the last ``take_figures``: their writers' last figures."""
        self._run = run
        self._config_for = config_for
        self._worker_id = worker_id
        self._per_query = run.config.spark.live_maps_per_query
        self._delta = LiveDelta(
            spark,
            run.config,
            checkpoint_path(run.config, "__live__", f"{worker_id}.delta"),
            self._delta_failed,
            metrics,
        )
        """The members' shared Delta query, started again whenever they change."""
        self._members: dict[str, SupervisedMap] = {}
        self._groups: dict[int, _Group] = {}
        self._group_of: dict[str, _Group] = {}
        self._delta_changed = False
        """Whether the shared Delta query must start again: its members changed."""
        self._stopping: dict[str, Future[None]] = {}
        """The micro-batch folds of maps joining, stopping (``join``)."""
        self._stops = ThreadPoolExecutor(max_workers=JOINS_AT_ONCE, thread_name_prefix="join")
        self._folds: dict[str, RedisFold] = {}
        """Each member's fold, built at its first start in a shared query."""
        self._entities: dict[str, StructType] = {}
        """Each member's entity struct, which its changelog is read with."""
        self._started_at = 0.0
        self._checkpoints: set[str] = set()
        """The shared queries' checkpoints started on: a close discards them."""
        self._slots = local_live_slots(spark.sparkContext.master or "")
        self._partitions: dict[str, int] = {}
        self.failures: dict[str, str] = {}
        """Maps whose failure stopped their shared query (or the Delta one), until they leave."""

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
        if self._running() and time.monotonic() - self._started_at < JOIN_EVERY_S:
            return False
        behind = records_behind(queries.fold.lastProgress)
        if behind is None or behind > config.map(m.name).catch_up.ready_lag:
            return False
        return self._fits(config, m.name)

    def _fits(self, config: AppConfig, name: str) -> bool:
        """Whether the map's partitions fit the real-time query's slots (said once if not)."""
        # A cluster's slots are its registered executors'.
        slots = cluster_live_slots(self._spark) if self._slots is None else self._slots
        if name not in self._partitions:
            topics = partition_ids(admin_client(config.kafka), config.map(name).source.topics)
            self._partitions[name] = sum(len(p) for p in topics.values())
            held = sum(self._partitions.get(n, 0) for n in self._members)
            if held + self._partitions[name] > slots:
                log.warning(
                    "map %s stays on micro-batches: its %d partitions do not fit the %d task "
                    "slots the real-time queries have left (spark.live_slots, spark.master, "
                    "the executors' cores)",
                    name,
                    self._partitions[name],
                    max(0, slots - held),
                )
        held = sum(self._partitions.get(n, 0) for n in self._members)
        return held + self._partitions[name] <= slots

    def join(self, m: SupervisedMap) -> None:
        """Stop the map's micro-batch fold and its Delta query after their batches, beside
        the other maps joining (each stop waits for its batch); the next ``settle`` folds the
        map in a shared query and merges its changelog in the shared Delta query. A stop
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
        group = self._room()
        group.maps.append(m.name)
        group.changed = True
        self._group_of[m.name] = group
        self._delta_changed = True
        log.info("map %s: caught up, folds on the real-time path (%s)", m.name, group.name)

    def _room(self) -> _Group:
        """The group a joining map goes to (``group_with_room``), made if new."""
        sizes = {index: len(g.maps) for index, g in self._groups.items()}
        index = group_with_room(sizes, self._per_query)
        return self._groups.setdefault(index, _Group(index))

    def _running(self) -> bool:
        return any(g.query is not None for g in self._groups.values())

    def leave(self, name: str) -> None:
        """The map leaves: its shared query and the shared Delta query stop now (what their
        writers applied is committed first), and ``settle`` starts them again without it."""
        if name not in self._members:
            return
        self._noticed()  # a failure of a query is its members' before this one goes
        del self._members[name]
        self._stopped(name, self._stopping.pop(name, None))
        self._folds.pop(name, None)
        self._entities.pop(name, None)
        group = self._group_of.pop(name)
        group.maps.remove(name)
        self._delta_changed = True
        self._delta.stop()  # a map leaving must find its table with no other writer
        if name in group.folding:  # not when its query started again without it already
            group.changed = True
            self._stop_group(group)
        elif not group.maps:
            group.changed = True  # the group goes at the next settle
        self.failures.pop(name, None)  # after the stop: nothing of the map runs any more
        if self._marks is not None:
            self._marks.leave([name])
        self._left.add(name)
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
        """Once a loop: take in a failure of a shared query, start again the queries whose
        maps changed or that stopped, and take the writers' figures."""
        self.take_figures()
        self._noticed()
        changed = [g for g in self._groups.values() if g.changed]
        if not changed and not self._delta_changed:
            self._delta.retry(lambda: [self._delta_member(m) for m in self._folding()])
            return
        if self._delta_changed:
            self._delta.stop()
        for group in changed:
            self._stop_group(group)
        self._await_joins()
        for group in changed:
            group.changed = False
            self._start_group(group)
        if self._delta_changed:
            self._delta_changed = False
            members = self._folding()
            if members:
                self._delta.start([self._delta_member(m) for m in members])
        if self._marks is None:
            self._marks = LiveMarks(self._run.config)
        self._marks.hold({m.name: (m.generation, self._config_for(m)) for m in self._folding()})

    def _start_group(self, group: _Group) -> None:
        """Start the group's query on its maps whose failure is not noticed yet; a group
        left without maps goes."""
        members = [self._members[n] for n in group.maps if n not in self.failures]
        if not group.maps:
            del self._groups[group.index]
        if not members:
            return
        started = time.monotonic()
        checkpoint = self._checkpoint(group)
        self._checkpoints.add(checkpoint)
        group.starts += 1
        try:
            group.query = start_live(
                self._spark,
                self._run.config,
                [self._live_map(m) for m in members],
                checkpoint,
                name=group.name,
            )
        except Exception as exc:  # noqa: BLE001 - each map's lifecycle takes it from here
            self._failed(f"could not start the real-time query: {exc}", group)
            return
        group.folding = {m.name for m in members}
        self._started_at = time.monotonic()
        log.info(
            "real-time query %s started in %.1f s for %d maps: %s",
            group.name,
            time.monotonic() - started,
            len(members),
            ", ".join(sorted(m.name for m in members)),
        )

    def _checkpoint(self, group: _Group) -> str:
        """The group's query's checkpoint, named after this worker: emptied at each start."""
        return checkpoint_path(self._run.config, "__live__", f"{self._worker_id}.{group.index}")

    def _live_map(self, m: SupervisedMap) -> LiveMap:
        """The map as its shared query takes it, with its fold built once while it stays
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
        """Take in a failure of the shared queries: over the map it names, or over all the
        maps of the failed query (every map, for the shared Delta query)."""
        for group in self._groups.values():
            query = group.query
            if query is not None and not query.isActive:
                self._failed(str(query.exception()), group)
                group.query, group.folding = None, set()
                group.changed = True
                self._delta_changed = True
        error = self._delta.noticed()
        if error is not None:
            self._failed(error)
            for group in self._groups.values():
                group.changed = True
            self._delta_changed = True

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

    def _failed(self, error: str, group: _Group | None = None) -> None:
        """A shared query failed: over the map its error names, or over every map of
        ``group`` (of every group when None)."""
        named = NAMED.search(error)
        if named is not None and named.group(1) in self._members:
            self.failures[named.group(1)] = error
            return
        for name in self._members if group is None else group.maps:
            self.failures[name] = error

    def _stop_group(self, group: _Group) -> None:
        """Stop the group's query, once its writers committed what they applied."""
        if group.query is not None:
            query, group.query, group.folding = group.query, None, set()
            if not stop_live(self._spark, query, group.name):
                log.warning(
                    "the real-time query %s's writers did not end in time; the next start "
                    "folds their last records again (once)",
                    group.name,
                )

    def close(self) -> None:
        """The run's end: the shared queries stop (their writers commit what they applied),
        and their checkpoints go, which name this process and hold nothing a start needs."""
        self._left |= set(self._members)
        self._members.clear()
        self._await_joins()
        self._stops.shutdown()
        self._delta.stop()
        for group in self._groups.values():
            self._stop_group(group)
        self._groups.clear()
        self._group_of.clear()
        self._delta.close()
        if self._marks is not None:
            self._marks.leave(sorted(self._left))
            self._marks.close()
        self.take_figures()
        for checkpoint in self._checkpoints:
            Checkpoint(self._spark, checkpoint).discard()


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


def group_with_room(sizes: dict[int, int], per_query: int) -> int:
    """The group a joining map goes to, from each group's number of maps: the first with
    room, else a new one with the lowest free number. Filling the first ones keeps the
    queries few; a map joining restarts only the group it goes to."""
    for index in sorted(sizes):
        if sizes[index] < per_query:
            return index
    return next(i for i in range(len(sizes) + 1) if i not in sizes)
