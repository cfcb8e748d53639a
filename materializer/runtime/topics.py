"""Topics a map or enrichment writes to, made ready before its queries start.

A dead-letter record is its source record plus a few headers, so the
dead-letter topic must take records as big as the largest its source topics
accept. A topic the broker auto-creates gets the broker's default limit (about
1 MB) and a bigger poison record would fail the batch that sends it; creating the
topic with the sources' limit (plus room for the headers) loses nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # not re-exported in its stubs
    AdminClient,
    ConfigResource,
)
from confluent_kafka.cimpl import NewTopic

from materializer.clients.kafka import librdkafka
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
    return AdminClient(librdkafka(config.kafka))


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


def ensure_topic(
    config: AppConfig,
    sources: list[str],
    topic: str,
    key_path: str,
    settings: Mapping[str, str],
) -> int:
    """Create a topic a map or enrichment writes if it is missing; the record size its
    producer must allow, for records made from ``sources``' records.

    A new topic gets the sources' partition count and record limit (plus
    header room) and ``settings``; an existing one is left as the operator
    made it, with a warning when it takes smaller records than the sources do.
    """
    admin = _admin(config)
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
                    "%s: topic %s takes records up to %d bytes, its sources %s "
                    "up to %d: bigger records would stop the query writing it",
                    key_path,
                    topic,
                    have,
                    ", ".join(sources),
                    limits.max_message_bytes,
                )
            return max(have, needed)
        new = NewTopic(
            topic,
            num_partitions=limits.partitions,
            replication_factor=-1,  # the broker's default.replication.factor
            config={MAX_MESSAGE_BYTES: str(needed), **settings},
        )
        try:
            admin.create_topics([new])[topic].result(TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        log.info("%s: created topic %s", key_path, topic)
        return needed
    except KafkaException as exc:
        raise SetupError(f"{key_path}: cannot prepare topic {topic}: {exc.args[0].str()}") from None


def ensure_dead_letter_topic(config: AppConfig, map_name: str, topic: str) -> int:
    """The dead-letter topic, ready for the biggest poison record; its record limit."""
    sources = config.map(map_name).source.topics
    return ensure_topic(config, sources, topic, f"maps.{map_name}.dead_letter.topic", {})


def ensure_changelog_topic(config: AppConfig, map_name: str, topic: str) -> int:
    """The compacted changelog topic: the latest record per entity is kept for good."""
    settings = {"cleanup.policy": "compact"}
    sources = config.map(map_name).source.topics
    return ensure_topic(config, sources, topic, f"maps.{map_name}.changelog.topic", settings)
