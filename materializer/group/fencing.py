"""Fencing: a worker that lost a map writes nothing more for it.

A worker of the group learns that it lost a map only when it next polls the
group, and one paused past its session (SIGSTOP, a long GC, a frozen VM) goes on
with the batch it was in when it wakes. So each store refuses it by itself:

- Redis: a worker that takes a map gets the next *epoch* (``claim``), raises the
  map's owner key on every master to it, and every write carries it; the writing
  functions refuse a write whose epoch is older (``MATERIALIZER_FENCED``).
- Kafka: the changelog and dead-letter records go through transactional producers
  whose ``transactional.id`` is the map's (``transactional_prefix``); the new
  owner's ``init_transactions`` on each of them (``fence_producers``) aborts the
  old owner's open transaction and refuses its later ones. Readers of the
  changelog read committed records only.
- Delta: the map's Delta query checks, before each commit, that no newer owner
  holds the map (``OwnerCheck``).

The Delta check is a check then a commit: a worker that stops between the two for
longer than its session and the new owner's first commit can still commit once, the
rows of changelog records that were committed (the same ones the new owner merges).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from materializer.clients.kafka import fence_transactional_ids, librdkafka
from materializer.clients.redis import client_for, masters, on, per_master
from materializer.config import AppConfig
from materializer.contract.redis_layout import epoch_key, owner_key
from materializer.redis.deliveries import TRANSACTION_TIMEOUT_S, transactional_id
from materializer.redis.functions import NEXT_EPOCH, RAISE_EPOCH, Fenced, load_library

log = logging.getLogger(__name__)


def claim(config: AppConfig, map_name: str) -> int:
    """Take the map over: the next epoch, set on every master's owner key; the epoch.

    A newer owner's key is left as it is (``raise``): a worker that claims late
    is fenced by the one that claimed after it.
    """
    client = client_for(config.redis)
    load_library(config.redis)
    key = epoch_key(map_name)
    epoch = int(client.execute_command("FCALL", NEXT_EPOCH, 1, key))  # type: ignore[no-untyped-call]
    nodes = masters(client)
    for node_name, owner in per_master(client, map_name, owner_key).items():
        raise_epoch = ("FCALL", RAISE_EPOCH, 1, owner, str(epoch))
        held = int(client.execute_command(*raise_epoch, **on(nodes[node_name])))  # type: ignore[no-untyped-call]
        if held > epoch:
            raise Fenced(map_name, epoch)
    return epoch


class OwnerCheck:
    """Whether this worker still owns a map: the last epoch handed out is its own."""

    def __init__(self, config: AppConfig, map_name: str, epoch: int) -> None:
        self._config = config
        self.map_name = map_name
        self.epoch = epoch

    def __call__(self) -> None:
        """Raise ``Fenced`` if a newer owner claimed the map."""
        raw = client_for(self._config.redis).get(epoch_key(self.map_name))
        if raw is not None and int(raw) > self.epoch:
            raise Fenced(self.map_name, self.epoch)


@dataclass(frozen=True)
class Ownership:
    """What a map's queries carry on the worker that owns it: its epoch, its producers'
    ``transactional.id`` prefix, and the Delta query's check."""

    epoch: int
    transactional_id: str
    check: OwnerCheck


def take_over(config: AppConfig, map_name: str) -> Ownership:
    """Claim the map (Redis) and fence its former owner's producers (Kafka), before its
    queries start on this worker.

    A large batch's tasks each have a producer: one per partition of the batch, at most
    the map's source partitions or ``spark.shuffle_partitions``.
    """
    epoch = claim(config, map_name)
    topics = config.map(map_name).source.topics
    tasks = max(config.spark.shuffle_partitions, _partitions(config, topics))
    fence_producers(config, map_name, tasks)
    prefix = transactional_prefix(config, map_name)
    return Ownership(epoch, prefix, OwnerCheck(config, map_name, epoch))


def _partitions(config: AppConfig, topics: list[str]) -> int:
    """How many partitions ``topics`` have together."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(librdkafka(config.kafka))
    metadata = admin.list_topics(timeout=TRANSACTION_TIMEOUT_S)
    return sum(len(metadata.topics[t].partitions) for t in topics if t in metadata.topics)


def transactional_prefix(config: AppConfig, map_name: str) -> str:
    """The ``transactional.id`` of the map's driver producer; its tasks' add their number."""
    return f"materializer.{config.worker.group}.{map_name}"


def fence_producers(config: AppConfig, map_name: str, tasks: int) -> None:
    """Fence every producer a former owner of the map may still hold: the driver's and those
    of tasks ``0 .. tasks - 1``, each by an ``init_transactions`` of its id."""
    prefix = transactional_prefix(config, map_name)
    ids = [transactional_id(prefix, task) for task in (None, *range(tasks))]
    fence_transactional_ids(config.kafka, ids, TRANSACTION_TIMEOUT_S)
    log.debug("map %s: %d producers fenced", map_name, len(ids))
