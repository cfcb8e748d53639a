"""``materializer run``: every map's and enrichment's queries in one Spark session.

Enrichments are supervised as maps are (``<enrichment>:__control__`` and
``__status__`` work the same), in the same loop, until told to stop.

A supervisor loop watches each map: a map whose query fails is reported and
the others keep running; operators' requests in ``<map>:__control__`` (pause,
resume, restart) are obeyed within one loop, operations asked in
``<map>:__operation__`` (verify, rehydrate, rebuild) are taken up within one loop
and carried out beside it (``ops.requested``), and each map's state and rates
go to ``<map>:__status__``. Pausing stops a map's queries after the batch in
flight, so its offsets stay put; resuming starts them again from their
checkpoints, so nothing is lost or folded twice. A stop request lets each
query finish the batch it is in before stopping it; a batch cut short anyway
(a second signal, a timeout) is replayed on the next start and changes
nothing twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from confluent_kafka import KafkaException

from materializer.catalog.changes import state_bound_changes
from materializer.catalog.live import LiveMaps
from materializer.catalog.purge import drop_copy
from materializer.checkpoints.source_loss import SourceDataLoss, check_source, explain_failure
from materializer.clients.kafka_offsets import KafkaAccessError, check_access
from materializer.clients.redis import TRANSIENT_ERRORS, client_for
from materializer.config import AppConfig
from materializer.contract.control import Control
from materializer.contract.markers import is_whole
from materializer.contract.redis_layout import definition_key, generation_key, physical_name
from materializer.contract.status import IN_HAND, MapReport
from materializer.enrichment.job import start_enrichment
from materializer.errors import ConfigError, MaterializerError, SetupError
from materializer.group.fencing import Ownership, take_over
from materializer.group.worker import Worker
from materializer.job import start_map
from materializer.ops.rebuild import Progress, rebuild
from materializer.ops.requested import RequestedOperations
from materializer.redis.functions import CopyLost, Fenced
from materializer.redis.state_size import StateSize, StateSizes
from materializer.restore.automatic import ensure_whole
from materializer.runtime.catch_up import CatchUpTracker, Followed, MapCatchUp
from materializer.runtime.control_channel import ControlChannel
from materializer.runtime.history import HistoryRecorder
from materializer.runtime.listener import listen
from materializer.runtime.metrics import BatchMetrics, records_behind, serve_metrics
from materializer.runtime.pacing import CatchUpPace
from materializer.runtime.progress import BatchLog
from materializer.runtime.query_group import QueryGroup
from materializer.spark.session import build_spark_session
from materializer.spark.signals import route_stop_signals

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

LOOP_SECONDS = 0.5
REBUILD_GRACE = 60.0
"""After readers moved to a rebuilt copy, how long the old one stays: longer than any
reader keeps the old generation in mind."""

_RECOVERABLE_TYPES: tuple[type[Exception], ...] = (CopyLost, *TRANSIENT_ERRORS)
RECOVERABLE = tuple(f"{cls.__module__}.{cls.__name__}" for cls in _RECOVERABLE_TYPES)
"""Failures of a map's query that a restart mends once Redis answers again with a whole
copy (``Supervisor.restore``): a server that restarted, empty or not, or a cluster that
was down for a while. Anything else fails the map."""
FENCED_ERROR = f"{Fenced.__module__}.{Fenced.__name__}"
"""A query that failed on this: another worker of the group may own its map now."""


@dataclass
class _Map:
    """One map under supervision."""

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
    """While it catches up beside live maps (``runtime.pacing``): its pace; None otherwise."""
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
        )


@dataclass
class _Rebuild:
    """A rebuild under way in this run."""

    name: str
    version: int
    switched: bool = False
    done: bool = False
    error: str = ""
    wanted: int = 0


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
    ) -> None:
        """``report`` writes maps' states at once, for a state the loop would report late.
        ``worker``: this run's place in its worker group (None: it runs every map)."""
        self._spark = spark
        self.config = config
        """The config in force; a map a rebuild has not yet moved keeps the one it runs."""
        self.from_file = frozenset(config.maps) | frozenset(config.enrichments)
        """The maps and enrichments of the configuration file (the others are the catalog's);
        the run sets them from the file when the config holds the catalog's maps too."""
        self._pinned: dict[str, tuple[AppConfig, int]] = {}
        """Per map being rebuilt: the config its live queries run and the generation the
        rebuild folds into; the map takes ``config`` once readers moved there."""
        self._rebuilds: dict[str, _Rebuild] = {}
        self._batch_log = batch_log
        self._generation = generation
        self._metrics = metrics
        self._report = report
        self._access_checked = False
        self._worker = worker
        self.maps: dict[str, _Map] = {}
        """The run's maps (``run_maps`` sets them): a map catching up paces itself by them."""

    def _check_access(self) -> None:
        """Once per run: credentials do not change while it runs, and brokers that do not
        answer would cost every map the check's whole timeout."""
        if not self._access_checked:
            check_access(self.config.kafka)
            self._access_checked = True

    def start(self, m: _Map, opening: bool = True, pace: CatchUpPace | None = None) -> None:
        """Start a map's queries on its current generation; a start that fails marks it failed.

        The generation is read at every start, so a map a rebuild switched over
        while paused resumes on the new copy of its data. A map opens with one small
        batch of its fold alone (``job.start_map``'s ``opening``); ``step`` then starts
        its queries as usual, or at a ``pace`` while it catches up beside live maps.
        """
        m.pace = None
        if m.name in self._rebuilds and m.name not in self._pinned:
            m.state = "rebuilding"  # its old definition is gone: nothing runs until the switch
            return
        try:
            self._check_access()
            if m.name in self.config.enrichments:
                m.queries = start_enrichment(
                    self._spark, self.config, m.name, self._batch_log, metrics=self._metrics
                )
            else:
                m.generation = self._generation(m.name)
                config = self.config_for(m)
                check_source(config, m.name, m.generation)
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
                )
                m.pace = pace
        except Fenced as exc:  # another worker claimed it meanwhile
            self.fenced(m, str(exc))
            return
        except SourceDataLoss as exc:  # records it needs are gone: it alone fails
            self.fail(m, str(exc))
            return
        except KafkaAccessError as exc:  # refused credentials: no restart mends them
            kind = "enrichment" if m.name in self.config.enrichments else "map"
            self.fail(m, f"{kind} {m.name} cannot reach its topics: {exc}")
            return
        except MaterializerError as exc:
            if m.name in self.from_file and self._worker is None:
                raise  # the file's configuration: no restart mends it; the run reports it, ends
            self.fail(m, str(exc))  # a map of the catalog: a change of it may mend it
            return
        except Exception as exc:  # Spark's own errors while building the queries
            self.fail(m, f"could not start: {exc}")
            return
        m.state, m.error = "running", ""
        if m.queries.opening:
            log.info("map %s opening: one batch of its fold first", m.name)
        else:
            log.info("map %s running", m.name)

    def _live_batches_ms(self, m: _Map) -> list[int]:
        """The last batch durations of the run's other maps folding live."""
        durations = []
        for other in list(self.maps.values()):
            queries = other.queries
            if other is m or other.state != "running" or other.pace is not None:
                continue
            if queries is None or queries.opening or other.name in self.config.enrichments:
                continue
            progress = queries.fold.lastProgress
            if progress is not None:
                durations.append(int(progress.get("batchDuration") or 0))
        return durations

    def _paces(self, m: _Map, behind: int) -> bool:
        """Whether a map that opened ``behind`` records behind catches up at a pace: other
        maps of the run fold live, and its config bounds its batches."""
        settings = self.config_for(m).map(m.name).catch_up
        if settings.max_records_per_batch is None or behind <= settings.ready_lag:
            return False
        return any(
            o is not m and o.state == "running" and o.name not in self.config.enrichments
            for o in list(self.maps.values())
        )

    def _follow_pace(self, m: _Map) -> None:
        """A paced catch-up: slower while the live maps' batches run long; once within its
        ready lag, or alone, it runs as usual."""
        assert m.pace is not None and m.queries is not None
        ready = self.config_for(m).map(m.name).catch_up.ready_lag
        behind = records_behind(m.queries.fold.lastProgress)
        live = self._live_batches_ms(m)
        if behind is not None and (behind <= ready or not live):
            log.info(
                "map %s: %s, running as usual",
                m.name,
                "caught up" if behind <= ready else "no other map folds live",
            )
            m.queries.stop_after_batch()
            self.start(m, opening=False)
        else:
            m.pace.follow(live)
        if self._metrics is not None:
            self._metrics.paced(m.name, None if m.pace is None else m.pace.paced_seconds)

    def refenced(self, m: _Map) -> None:
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
                m.owner = take_over(self.config, m.name)
                self.start(m)
                return
        except Fenced:
            pass
        except Exception as exc:  # noqa: BLE001 - Redis or Kafka away: the group tries later
            log.warning("map %s: cannot take it over again yet: %s", m.name, exc)
        self.fenced(m, "fenced: another worker took it over")

    def fenced(self, m: _Map, why: str) -> None:
        """Another worker owns the map now: stop its queries without a drain (they could
        write nothing more), and leave the map to the group."""
        if m.queries is not None:
            m.queries.stop()
            m.queries = None
        m.state = "fenced"
        log.warning(
            "map %s: %s; its queries stopped, the worker goes on with its others", m.name, why
        )

    def first_start(self, m: _Map, request: Control) -> None:
        """A map's first start in this run: paused if operators paused it before."""
        m.restart_id = request.restart_id
        if request.desired == "paused":
            m.state = "paused"
            log.info("map %s paused (as requested before this run)", m.name)
        else:
            self.start(m)

    def config_for(self, m: _Map) -> AppConfig:
        """The config to start a map's queries with, for the generation it starts on."""
        pinned = self._pinned.get(m.name)
        if pinned is None:
            return self.config
        old, target = pinned
        if m.generation >= target:
            del self._pinned[m.name]
            return self.config
        return old

    def rebuild(self, m: _Map, before: AppConfig | None, version: int) -> None:
        """Fold the map's new definition into a new generation beside the live one, which
        keeps serving (and folding, on ``before``, its old definition, when this run knew
        it); readers move once the new copy caught up, as ``materializer rebuild`` does."""
        if m.name in self._rebuilds:
            log.warning(
                "map %s: a rebuild is under way; definition %d is rebuilt once it ends",
                m.name,
                version,
            )
            self._rebuilds[m.name].wanted = version
            return
        target = self._generation(m.name) + 1
        if before is not None and m.name in before.maps:
            self._pinned[m.name] = (before, target)
        else:  # the old definition is gone: the old copy serves as it stands
            self.stop(m, "rebuilding")
        job = self._rebuilds[m.name] = _Rebuild(m.name, version)
        log.info("map %s: rebuilding definition %d into generation %d", m.name, version, target)
        threading.Thread(
            target=self._rebuild, args=(job, self.config), name=f"rebuild-{m.name}", daemon=True
        ).start()

    def _rebuild(self, job: _Rebuild, config: AppConfig) -> None:
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

    def busy(self, name: str, kind: str) -> str:
        """Why an operation of ``kind`` asked of the map cannot run now ("" when it can)."""
        if kind == "rebuild" and name in self._rebuilds:
            return "a rebuild of its changed definition is under way"
        return ""

    def drop_old_copies(self, name: str) -> None:
        """Drop, on a thread, the copies a rebuild left behind when a stop cut its grace
        period short (readers moved long since: the run has started again)."""
        current = self._generation(name)

        def drop() -> None:
            client = client_for(self.config.redis)
            for generation in range(current):
                try:
                    drop_copy(self.config, client, name, generation)
                except Exception as exc:  # noqa: BLE001 - left for the next start
                    log.warning("map %s: cannot drop generation %d yet: %s", name, generation, exc)

        if current:
            threading.Thread(target=drop, name=f"drop-{name}", daemon=True).start()

    def rebuilt(self, m: _Map) -> None:
        """Notice a rebuild that ended: a map it left stopped starts on its new copy."""
        job = self._rebuilds.get(m.name)
        if job is None or not job.done:
            return
        del self._rebuilds[m.name]
        self._pinned.pop(m.name, None)
        if job.error:
            self.fail(m, job.error)
        elif job.wanted > job.version:
            self.rebuild(m, None, job.wanted)
        elif m.state == "rebuilding":
            self.start(m)

    def stop(self, m: _Map, state: str) -> None:
        """Stop a map's queries after their batch in flight."""
        if m.queries is not None:
            m.queries.stop_after_batch()
            m.queries = None
        m.state = state
        log.info("map %s %s", m.name, state)

    def stop_all(self, running: list[_Map]) -> None:
        """The run's end: every fold stops after its batch, then every Delta table takes in
        the changelog up to it, all within ``spark.stop_timeout``."""
        deadline = time.monotonic() + self.config.spark.stop_timeout.total_seconds()
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

    def fail(self, m: _Map, error: str) -> None:
        """Record a failure; the other maps keep running."""
        log.error("map %s failed, the others keep running: %s", m.name, error)
        if m.queries is not None:
            m.queries.stop()
            m.queries = None
        m.state, m.error = "failed", error

    def restore(self, m: _Map, why: str) -> None:
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
        if m.name not in self.config.enrichments:
            try:
                client = client_for(self.config.redis)
                if m.generation:  # the pointer to the generation goes with the data
                    client.set(generation_key(m.name), str(m.generation), nx=True)
                ensure_whole(self.config, m.name, m.generation)
            except (redis.RedisError, MaterializerError) as exc:
                log.error(
                    "map %s: cannot restore its Redis copy yet, trying again: %s", m.name, exc
                )
                return
        self.start(m)

    def lost(self, m: _Map) -> bool:
        """Whether a running map's Redis copy lost a master's marker (not an enrichment's)."""
        if m.name in self.config.enrichments:
            return False
        try:
            return not is_whole(client_for(self.config.redis), physical_name(m.name, m.generation))
        except redis.RedisError:
            return False  # unreachable: its queries retry, then fail or find it lost

    def step(self, m: _Map, request: Control) -> None:
        """Bring one map to what is asked of it, and notice a failed query or a lost copy."""
        self.rebuilt(m)
        if m.state == "restoring":
            self.restore(m, "")
            return
        if m.state == "running" and m.queries is not None and m.queries.opened():
            behind = records_behind(m.queries.fold.lastProgress)
            m.queries.stop()  # between batches: its trigger waits a day
            paced = behind is not None and self._paces(m, behind)
            self.start(m, opening=False, pace=CatchUpPace(m.name) if paced else None)
        elif m.pace is not None and m.state == "running" and m.queries is not None:
            self._follow_pace(m)
        if m.state == "running" and m.queries is not None:
            broken = [q for q in m.queries.queries if not q.isActive]
            if broken:
                error = explain_failure(self.config, m.name, m.generation, broken[0])
                if FENCED_ERROR in error:
                    self.refenced(m)
                    return
                if any(name in error for name in RECOVERABLE):
                    self.restore(m, "Redis failed its query")
                    return
                self.fail(m, error)
            elif self.lost(m):
                self.restore(m, "Redis lost its copy")
                return
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


def _stop_on(signal_name: str, stop: threading.Event) -> None:
    """A stop signal, to the driver or to its JVM: the run drains and ends."""
    if not stop.is_set():
        log.info("%s: stopping after the running batches", signal_name)
    stop.set()


def run_maps(config: AppConfig, names: Sequence[str] | None, stop: threading.Event) -> list[str]:
    """Run the named maps and enrichments (``None``: every one in force) until ``stop`` is
    set, or until none is running or paused (every one failed); a run with no map yet
    waits for the catalog to give it one.

    Returns the maps that failed. A map paused before the run starts stays
    paused until resumed. The run follows the catalog (``materializer.catalog``):
    a map created there starts, one changed restarts on its new definition, one
    deleted stops after its Delta table took in its changelog; the others never
    notice. Named maps keep their names: a run of ``--map`` follows their
    definitions only.
    """
    live = LiveMaps(config)
    live.start()
    unknown = [n for n in names or [] if n not in live.config.maps and n not in config.enrichments]
    if unknown:
        live.close()
        known = ", ".join(sorted(live.config.maps)) or "none"
        raise ConfigError("", [f"maps.{n}: no such map (known: {known})" for n in unknown])

    def in_force() -> list[str]:
        if names is not None:
            return [n for n in names if n in live.config.maps or n in config.enrichments]
        return [*sorted(live.config.maps), *sorted(config.enrichments)]

    if config.worker.group is not None and names is not None:
        live.close()
        raise ConfigError(
            "",
            [
                f"worker.group: {config.worker.group}: a worker group shares every map "
                "between its workers; run it without --map"
            ],
        )
    worker = Worker(config) if config.worker.group is not None else None

    metrics = BatchMetrics()
    # Before the JVM starts, so that a port already taken ends the run at once.
    metrics_server = serve_metrics(config.metrics, metrics.registry)
    spark = build_spark_session(config.spark, object_store=config.object_store)
    route_stop_signals(spark, lambda name: _stop_on(name, stop))
    batch_log = BatchLog()
    listen(spark, batch_log, metrics)
    channel = ControlChannel(config.redis, in_force())
    supervisor = Supervisor(
        spark, live.config, batch_log, channel.generation, metrics, channel.report, worker
    )
    supervisor.from_file = frozenset(config.maps) | frozenset(config.enrichments)
    operations = RequestedOperations(
        spark,
        lambda: supervisor.config,
        config.worker.worker_id() if worker is None else worker.id,
        busy=supervisor.busy,
        grace_seconds=REBUILD_GRACE,
    )
    # A worker of a group starts the maps the group gives it, as it gives them.
    maps = {name: _Map(name) for name in in_force()} if worker is None else {}
    supervisor.maps = maps

    def measured(name: str, size: StateSize) -> None:
        if name in maps:
            maps[name].state_size = size
        metrics.state_size(name, size.keys, size.bytes)

    sizes = StateSizes(
        config.redis,
        lambda: {m.name: physical_name(m.name, m.generation) for m in list(maps.values())},
        measured,
        config.metrics.state_interval.total_seconds(),
    )

    def followed() -> dict[str, Followed]:
        """The maps whose fold runs here now (not enrichments), for the catch-up figures."""
        out = {}
        for m in list(maps.values()):
            definition = supervisor.config.maps.get(m.name)
            if m.state == "running" and definition is not None:
                out[m.name] = Followed(
                    physical=physical_name(m.name, m.generation),
                    topics=tuple(definition.source.topics),
                    ready_lag=definition.catch_up.ready_lag,
                    from_latest=definition.source.starting_offsets == "latest",
                )
        return out

    def caught_up(name: str, figures: MapCatchUp | None) -> None:
        if name in maps:
            maps[name].catch_up = figures
        metrics.catch_up(name, figures)

    catch_up = CatchUpTracker(config.kafka, config.redis, followed, caught_up)
    history = None
    if config.metrics.history.max_len:
        interval = config.metrics.history.interval.total_seconds()
        history = HistoryRecorder(
            config.redis, metrics.intervals, interval, config.metrics.history.max_len
        )
    following = config.catalog.enabled
    poll = config.catalog.poll_interval.total_seconds()
    try:
        sizes.start()
        catch_up.start()
        if history is not None:
            history.start()
        if worker is not None:
            worker.start()
        requests = channel.requests()
        for m in maps.values():
            if stop.is_set():
                break
            _start(supervisor, live, m, requests[m.name], channel)
        next_poll = time.monotonic() + poll
        while not stop.is_set() and (
            worker is not None
            or (following and not maps)
            or any(m.state in IN_HAND for m in maps.values())
        ):
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + poll
                if live.refresh():
                    wanted = in_force()
                    if worker is not None:  # the group's moves are ``_share``'s
                        wanted = [n for n in wanted if n in maps]
                    _follow(supervisor, live, maps, wanted, channel)
            if worker is not None:
                _share(supervisor, live, maps, in_force(), channel, worker, metrics)
            requests = channel.requests()
            for m in maps.values():
                supervisor.step(m, requests[m.name])
            # Operations asked of the maps this run holds (in a group: the maps it owns).
            operations.step(
                m.name
                for m in maps.values()
                if m.state != "fenced" and m.name not in supervisor.config.enrichments
            )
            # A fenced map is another worker's to report.
            reports = {m.name: m.report() for m in maps.values() if m.state != "fenced"}
            channel.report(reports)
            if history is not None:  # the maps' figures over time; enrichments have none
                history.reported({n: r for n, r in reports.items() if n in supervisor.config.maps})
            stop.wait(LOOP_SECONDS)
    finally:
        sizes.stop()
        if history is not None:
            history.stop()
        # Operations end at their next step; one holding its map still sees it stopped below.
        operations.interrupt()
        running = [m for m in maps.values() if m.state == "running"]
        if worker is None:
            supervisor.stop_all(running)
        else:  # each map's new owner takes in the rest of its changelog: leave soon
            for m in running:
                supervisor.stop(m, "stopped")
        channel.report({m.name: m.report() for m in maps.values() if m.state != "fenced"})
        operations.close()
        if worker is not None:  # drained: the others take the maps over at once
            worker.close()
        catch_up.stop()  # last: a look at a Kafka that does not answer must not delay the drain
        channel.close()
        live.close()
        spark.stop()
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
    return [m.name for m in maps.values() if m.state == "failed"]


def _follow(
    supervisor: Supervisor,
    live: LiveMaps,
    maps: dict[str, _Map],
    wanted: list[str],
    channel: ControlChannel,
) -> None:
    """Bring the running maps to the catalog's: start the new, restart the changed, stop
    the deleted. Only those move; the others' queries never stop."""
    before = supervisor.config
    after = live.config
    supervisor.config = after
    for name in [n for n in maps if n not in wanted]:
        m = maps.pop(name)
        if m.state == "running":
            # A state that does not age: a purge waits until the Delta catch-up is done.
            m.state = "stopping"
            channel.report({name: m.report()})
        supervisor.stop_all([m] if m.state == "stopping" else [])
        m.state = "stopped"
        channel.report({name: m.report()})
        log.info("map %s deleted by %s: its queries stopped", name, _by(live, name))
    channel.names = list(wanted)
    requests = channel.requests()
    for name in wanted:
        if name in after.enrichments:
            continue
        version = live.maps.version(name)
        if name not in maps:
            m = maps[name] = _Map(name)
            log.info("map %s created by %s (version %d)", name, _by(live, name), version)
            _start(supervisor, live, m, requests[name], channel)
        elif before.maps.get(name) != after.maps.get(name):
            m = maps[name]
            old, new = before.maps.get(name), after.maps.get(name)
            if old is not None and new is not None and state_bound_changes(old, new):
                supervisor.rebuild(m, before, version)
                continue
            log.info(
                "map %s changed by %s (version %d): restarting its queries",
                name, _by(live, name), version,
            )  # fmt: skip
            was = m.state
            supervisor.stop(m, "stopped")
            if was == "paused":
                m.state = "paused"
            else:
                supervisor.start(m)


def _share(
    supervisor: Supervisor,
    live: LiveMaps,
    maps: dict[str, _Map],
    names: list[str],
    channel: ControlChannel,
    worker: Worker,
    metrics: BatchMetrics | None = None,
) -> None:
    """Bring this worker's maps to what the group gives it: a map lost or fenced stops at
    once, one moving to another worker drains first, one given to this worker is claimed
    (``group.fencing.take_over``), then started. Redis or Kafka away: nothing moves until
    they answer (the maps running go on)."""
    try:
        share = worker.share(names)
    except (redis.RedisError, KafkaException, SetupError) as exc:
        log.warning("worker group %s: cannot read its slots yet: %s", worker.group, exc)
        return
    fenced = set()
    for name in [n for n in maps if n in share.lost or maps[n].state == "fenced"]:
        m = maps.pop(name)
        if m.state == "fenced":
            worker.fenced(name)  # left out of the share for a while (``Membership.fenced``)
            fenced.add(name)
        else:
            supervisor.fenced(m, "lost to the group (this worker was out of it past its session)")
    # A map moving on finishes its batches in flight; its new owner's Delta query takes in
    # the rest of its changelog (a drain here would keep the map stale meanwhile).
    for m in [m for m in maps.values() if m.name in names and m.name not in share.owned]:
        supervisor.stop(m, "stopped")
        del maps[m.name]
        log.info("map %s moved to another worker of group %s", m.name, worker.group)
    # ``share`` was read before the fences above: a map fenced now is not taken back at once.
    taken = [n for n in names if n in share.owned and n not in maps and n not in fenced]
    if taken:
        channel.names = sorted({*maps, *taken})
        requests = channel.requests()
        for name in taken:
            m = _Map(name, worker=worker.id)
            if name not in supervisor.config.enrichments:
                try:
                    m.owner = take_over(supervisor.config, name)
                except Fenced:  # claimed after this worker's claim began: the group decides
                    worker.fenced(name)
                    continue
                except (redis.RedisError, KafkaException, MaterializerError) as exc:
                    log.warning("map %s: cannot take it over yet, trying again: %s", name, exc)
                    continue
            maps[name] = m
            epoch = "" if m.owner is None else f" (epoch {m.owner.epoch})"
            log.info("map %s taken over by worker %s%s", name, worker.id, epoch)
            _start(supervisor, live, m, requests[name], channel)
    channel.names = sorted(maps)
    if metrics is not None:
        metrics.worker_maps(worker.id, maps, rebalanced=share.version != worker.acted)
    worker.acted = share.version
    worker.release(share.version)


def _by(live: LiveMaps, name: str) -> str:
    """Who made the map's last change in the catalog (``file`` for a map of the file)."""
    record = live.maps.records.get(name)
    return "file" if record is None or name in live.file_config.maps else record.by or "?"


def _start(
    supervisor: Supervisor, live: LiveMaps, m: _Map, request: Control, channel: ControlChannel
) -> None:
    """A map's first start in this run; one whose definition a rebuild has yet to fold is
    rebuilt instead, and its old copy serves as it stands meanwhile."""
    record = live.maps.stored.get(m.name)
    if record is not None and record.rebuilt_at:
        if channel.definition(m.name) < record.rebuilt_at:
            m.restart_id = request.restart_id
            supervisor.rebuild(m, None, record.version)
            return
        supervisor.drop_old_copies(m.name)
    supervisor.first_start(m, request)
