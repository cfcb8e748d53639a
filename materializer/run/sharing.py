"""A worker of a group runs the maps the group gives it (``materializer.group``): a map lost
or fenced stops at once, one moving to another worker stops after its batch in flight,
one given to this worker is claimed (``group.fencing.take_over``), then started."""

from __future__ import annotations

import logging

import redis
from confluent_kafka import KafkaException

from materializer.errors import MaterializerError, SetupError
from materializer.group.fencing import take_over
from materializer.group.worker import Worker
from materializer.redis.functions import Fenced
from materializer.run.following import CatalogChanges
from materializer.run.supervised import SupervisedMap
from materializer.run.supervisor import Supervisor
from materializer.runtime.control_channel import ControlChannel
from materializer.runtime.metrics import BatchMetrics

log = logging.getLogger(__name__)


class GroupShare:
    """Brings this worker's maps to what the group gives it, once per loop."""

    def __init__(
        self,
        supervisor: Supervisor,
        changes: CatalogChanges,
        channel: ControlChannel,
        worker: Worker,
        metrics: BatchMetrics | None = None,
    ) -> None:
        self._supervisor = supervisor
        self._changes = changes
        self._channel = channel
        self._worker = worker
        self._metrics = metrics

    def share(self, names: list[str]) -> None:
        """Take this worker's share of ``names`` (every map in force). Redis or Kafka away:
        nothing moves until they answer (the maps running go on)."""
        worker, maps, lifecycle = self._worker, self._supervisor.maps, self._supervisor.lifecycle
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
                lifecycle.fenced(
                    m, "lost to the group (this worker was out of it past its session)"
                )
        # A map moving on finishes its batches in flight; its new owner's Delta query takes
        # in the rest of its changelog (a drain here would keep the map stale meanwhile).
        for m in [m for m in maps.values() if m.name in names and m.name not in share.owned]:
            lifecycle.stop(m, "stopped")
            del maps[m.name]
            log.info("map %s moved to another worker of group %s", m.name, worker.group)
        # ``share`` was read before the fences above: a map fenced now is not taken back at once.
        taken = [n for n in names if n in share.owned and n not in maps and n not in fenced]
        if taken:
            self._take(taken)
        self._channel.names = sorted(maps)
        if self._metrics is not None:
            self._metrics.worker_maps(worker.id, maps, rebalanced=share.version != worker.acted)
        worker.acted = share.version
        worker.release(share.version)

    def _take(self, taken: list[str]) -> None:
        """Claim and start the maps the group gave this worker."""
        worker, maps = self._worker, self._supervisor.maps
        self._channel.names = sorted({*maps, *taken})
        requests = self._channel.requests()
        for name in taken:
            m = SupervisedMap(name, worker=worker.id)
            if not self._supervisor.run.enrichment(name):
                try:
                    m.owner = take_over(self._supervisor.config, name)
                except Fenced:  # claimed after this worker's claim began: the group decides
                    worker.fenced(name)
                    continue
                except (redis.RedisError, KafkaException, MaterializerError) as exc:
                    log.warning("map %s: cannot take it over yet, trying again: %s", name, exc)
                    continue
            maps[name] = m
            epoch = "" if m.owner is None else f" (epoch {m.owner.epoch})"
            log.info("map %s taken over by worker %s%s", name, worker.id, epoch)
            self._changes.first_start(m, requests[name])
