"""``materializer run``: every map's and enrichment's queries in one Spark session.

Its rooms, in the order a map meets them (Kafka Connect's runtime is the model: a
worker that runs things, a herder that owns the group and the loop):

- ``supervised``: a map as the run supervises it, and which maps fold live;
- ``lifecycle``: a map started (with its opening), stopped, paused, failed, fenced, restored;
- ``pacing``: after its opening, a map far behind catches up at a pace beside live maps;
- ``rebuilds``: a definition its state is bound to, rebuilt beside the live copy;
- ``live``: once caught up, a map whose path is ``realtime`` folds in one of the run's
  real-time queries, shared with up to seven others (``live.query``);
- ``supervisor``: one step of a map per loop, tying those together;
- ``following``: the catalog's maps created, changed and deleted while the run runs
  (``CatalogChanges``);
- ``sharing``: in a worker group, the maps the group gives this worker, claimed and fenced;
- ``figures``: state sizes, catch-up figures and history, each on a thread of its own;
- ``loop``: the loop that ties them, and the run's end.

Operators' requests in ``<map>:__control__`` (pause, resume, restart) are obeyed within
one loop, operations asked in ``<map>:__operation__`` (verify, rehydrate, rebuild) are
taken up within one loop and carried out beside it (``ops.requested``), and each map's
state and rates go to ``<map>:__status__``. A stop request lets each query finish the
batch it is in before stopping it; a batch cut short anyway (a second signal, a timeout)
is replayed on the next start and changes nothing twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from contextlib import ExitStack

from materializer.config import AppConfig
from materializer.group.worker import Worker
from materializer.run.loop import LOOP_SECONDS, RunLoop, open_catalog
from materializer.runtime.metrics import BatchMetrics, serve_metrics
from materializer.spark.session import build_spark_session
from materializer.spark.signals import route_stop_signals

log = logging.getLogger(__name__)


def run_maps(config: AppConfig, names: Sequence[str] | None, stop: threading.Event) -> list[str]:
    """Run the named maps and enrichments (``None``: every one in force) until ``stop`` is
    set, or until none is running or paused (every one failed); a run with no map yet
    waits for the catalog to give it one. Returns the maps that failed.

    A map paused before the run starts stays paused until resumed. The run follows
    the catalog (``run.following``); named maps keep their names: a run of ``--map``
    follows their definitions only.
    """
    with ExitStack() as closing:  # whatever fails, what was opened closes, newest first
        live = open_catalog(config, names)
        closing.callback(live.close)
        worker = Worker(config) if config.worker.group is not None else None
        metrics = BatchMetrics()
        # Before the JVM starts, so that a port already taken ends the run at once.
        metrics_server = serve_metrics(config.metrics, metrics.registry)
        if metrics_server is not None:
            closing.callback(metrics_server.server_close)
            closing.callback(metrics_server.shutdown)
        spark = build_spark_session(config.spark, object_store=config.object_store)
        closing.callback(spark.stop)
        route_stop_signals(spark, lambda name: _stop_on(name, stop))
        run = RunLoop(config, names, live, spark, metrics, worker)
        closing.callback(run.close)
        run.start(stop)
        while not stop.is_set() and run.goes_on():
            run.step()
            stop.wait(LOOP_SECONDS)
    return run.failed()


def _stop_on(signal_name: str, stop: threading.Event) -> None:
    """A stop signal, to the driver or to its JVM: the run drains and ends."""
    if not stop.is_set():
        log.info("%s: stopping after the running batches", signal_name)
    stop.set()
