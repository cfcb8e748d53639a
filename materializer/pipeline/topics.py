"""Topics a map writes to, made ready before its queries start.

A dead-letter record is its source record plus a few headers, so the
dead-letter topic must take records as big as the largest its source topics
accept. A topic the broker auto-creates gets the broker's default limit (about
1 MB) and a bigger poison record would fail the dead-letter query; creating the
topic with the sources' limit (plus room for the headers) loses nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # not re-exported in its stubs
    AdminClient,
    ConfigResource,
)
from confluent_kafka.cimpl import NewTopic

from materializer.config import AppConfig
from materializer.errors import SetupError

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = "max.message.bytes"
HEADER_ROOM = 64 * 1024
"""Bytes added to the sources' record limit for the ``x-error-*`` / ``x-source-*`` headers."""
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TopicLimits:
    """What a dead-letter topic needs to hold every source record."""

    partitions: int
    max_message_bytes: int


def _admin(config: AppConfig) -> AdminClient:
    return AdminClient(
        {"bootstrap.servers": config.kafka.bootstrap_servers, **config.kafka.properties}
    )


def source_limits(admin: AdminClient, topics: list[str]) -> TopicLimits:
    """The most partitions and the largest record limit among ``topics`` (those that exist)."""
    metadata = admin.list_topics(timeout=TIMEOUT_S).topics
    present = [t for t in topics if t in metadata and metadata[t].error is None]
    partitions = max((len(metadata[t].partitions) for t in present), default=1)
    largest = 0
    if present:
        resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in present]
        for future in admin.describe_configs(resources).values():
            entries = future.result(TIMEOUT_S)
            largest = max(largest, int(entries[MAX_MESSAGE_BYTES].value))
    return TopicLimits(partitions, largest)


def ensure_dead_letter_topic(config: AppConfig, map_name: str, topic: str) -> int:
    """Create the dead-letter topic if it is missing; the record size its producer must allow.

    An existing topic is left as the operator made it; a warning says when it
    takes smaller records than the sources do.
    """
    admin = _admin(config)
    sources = config.map(map_name).source.topics
    try:
        limits = source_limits(admin, sources)
        needed = limits.max_message_bytes + HEADER_ROOM
        # All topics, not just this one: naming a missing topic may make the broker auto-create it.
        existing = admin.list_topics(timeout=TIMEOUT_S).topics.get(topic)
        if existing is not None and existing.error is None:
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            entries = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
            have = int(entries[MAX_MESSAGE_BYTES].value)
            if have < needed:
                log.warning(
                    "map %s: dead-letter topic %s takes records up to %d bytes, its sources "
                    "up to %d: bigger poison records would stop the dead-letter query",
                    map_name,
                    topic,
                    have,
                    limits.max_message_bytes,
                )
            return max(have, needed)
        new = NewTopic(
            topic,
            num_partitions=limits.partitions,
            replication_factor=-1,  # the broker's default.replication.factor
            config={MAX_MESSAGE_BYTES: str(needed)},
        )
        try:
            admin.create_topics([new])[topic].result(TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        log.info("map %s: created dead-letter topic %s", map_name, topic)
        return needed
    except KafkaException as exc:
        raise SetupError(
            f"maps.{map_name}.dead_letter.topic: cannot prepare {topic}: {exc.args[0].str()}"
        ) from None
