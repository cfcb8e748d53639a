"""Where a map's real-time source starts: the position its last effects reached.

The real-time writer commits, in each Kafka transaction with the changelog's and dead
letters' records, the next source offset per partition to the map's group of its own
(``config.names.LIVE_GROUP``): where everything before has landed, in Redis and in Kafka.
Its calls move the Redis watermark first, so after a crash the watermark may be ahead; the
records between are read again, Redis recognises them, and the changelog and dead letters
get them once (their first transaction never committed).

A map the micro-batch path folded last (its watermark's app id is not the real-time
writer's) is handed over first: that path commits its watermark after the batch's
changelog, so the watermark is exact, and it is committed to the group as the real-time
path's position. A partition with no position starts where ``source.starting_offsets``
says. Spark's ``startingOffsets`` JSON must name every partition, so they are asked of
Kafka.
"""

from __future__ import annotations

import orjson

from materializer.clients.group_positions import (
    COORDINATOR_WAIT_S,
    committed,
    group_consumer,
    retried,
)
from materializer.clients.kafka import fence_transactional_ids
from materializer.clients.kafka_offsets import admin_client, partition_ids
from materializer.clients.redis import client_for
from materializer.config import AppConfig
from materializer.config.names import LIVE_GROUP
from materializer.contract.redis_layout import meta_key
from materializer.contract.watermark import LIVE_APP, Watermark

EARLIEST, LATEST = -2, -1
"""Spark's ``startingOffsets`` JSON for a partition's first and next offset."""

__all__ = ["LIVE_APP", "committed", "handed_back", "live_group", "starting_offsets"]


def live_group(map_name: str) -> str:
    """The consumer group the real-time writer commits the map's positions to."""
    return LIVE_GROUP.replace("{map}", map_name)


def transactional_prefix(physical: str) -> str:
    """What the ``transactional.id`` of each of the map copy's real-time writers starts with."""
    return f"materializer.live.{physical}"


def starting_offsets(
    config: AppConfig, map_name: str, physical: str, topics: dict[str, list[int]]
) -> str:
    """Where the map's real-time source starts, as Spark's ``startingOffsets`` JSON (see the
    module's docstring); the writers of the map's last query fenced first by the caller
    (``fence``), all maps' at once. ``topics``: its partitions."""
    watermark = Watermark.from_hash(client_for(config.redis).hgetall(meta_key(physical)))
    if watermark is not None and watermark.app_id != LIVE_APP:
        hand_over(config, live_group(map_name), watermark.offsets)
    return _positions(config, map_name, topics)


def handed_back(config: AppConfig, map_name: str, physical: str) -> str | None:
    """Where the map's micro-batch fold starts when the real-time path folded it last (its
    watermark's app id is the real-time writer's), as ``startingOffsets`` JSON; None when
    the micro-batch path folded it last, whose checkpoint then says where it stands.

    The real-time path's committed positions, once its writers are fenced: the records
    past them were applied to Redis, but their changelog and dead letters never committed,
    so the micro-batch fold takes them again (Redis changes nothing twice, the changelog
    and the dead letters get them once).
    """
    watermark = Watermark.from_hash(client_for(config.redis).hgetall(meta_key(physical)))
    if watermark is None or watermark.app_id != LIVE_APP:
        return None
    topics = partition_ids(admin_client(config.kafka), config.map(map_name).source.topics)
    fence(config, transactional_prefix(physical), topics)
    return _positions(config, map_name, topics)


def _positions(config: AppConfig, map_name: str, topics: dict[str, list[int]]) -> str:
    """The committed real-time positions of every partition of ``topics``, as
    ``startingOffsets`` JSON; a partition with none starts where ``source.starting_offsets``
    says."""
    reached = committed(config.kafka, live_group(map_name), topics)
    unread = EARLIEST if config.map(map_name).source.starting_offsets == "earliest" else LATEST
    offsets = {
        topic: {str(p): reached.get(topic, {}).get(p, unread) for p in partitions}
        for topic, partitions in topics.items()
    }
    return orjson.dumps(offsets).decode()


def transactional_ids(prefix: str, topics: dict[str, list[int]]) -> list[str]:
    """The ``transactional.id`` of the writer of each source partition: the map's prefix,
    then the partition as Kafka's Java client writes it, as ``Transactions`` names them."""
    return [f"{prefix}.{topic}-{p}" for topic, partitions in topics.items() for p in partitions]


def fence(config: AppConfig, prefix: str, topics: dict[str, list[int]]) -> None:
    """Fence every writer a query of the map may have left (a process killed mid-batch):
    Kafka aborts their open transactions, whose offset commits would otherwise hold the
    group's positions unreadable until the transactions time out, and their producers can
    commit nothing after."""
    fence_transactional_ids(config.kafka, transactional_ids(prefix, topics), COORDINATOR_WAIT_S)


def hand_over(config: AppConfig, group: str, offsets: dict[str, dict[int, int]]) -> None:
    """Commit ``offsets`` to ``group`` as the real-time path's position."""
    from confluent_kafka import TopicPartition

    if not any(offsets.values()):
        return
    positions = [TopicPartition(t, p, o) for t, ps in offsets.items() for p, o in ps.items()]
    with group_consumer(config.kafka, group) as consumer:
        retried(group, lambda: consumer.commit(offsets=positions, asynchronous=False))
