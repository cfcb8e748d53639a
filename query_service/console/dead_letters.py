"""The last records of a map's dead-letter topic, for the map's page.

Read straight from Kafka, where they are kept: each partition's last few records
with the headers the fold gave them (``materializer.source.dead_letters``: the
source topic, partition and offset, the stage and the error). A plain consumer
assigned near each partition's end, no group: reading commits nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from materializer.clients.kafka import librdkafka
from materializer.config import AppConfig
from materializer.config.names import dead_letter_topic

POLL_SECONDS = 1.0
"""How long one request to Kafka may take; the page bounds the whole read too."""


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter as the page lists it."""

    timestamp_ms: int
    source_topic: str
    source_partition: str
    source_offset: str
    stage: str
    error: str
    key: str


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode(errors="replace")


def last_dead_letters(config: AppConfig, map_name: str, count: int = 20) -> list[DeadLetter]:
    """Up to ``count`` of the map's newest dead letters, newest first (blocking: run it on a
    thread); none when the topic does not exist yet."""
    from confluent_kafka import Consumer, TopicPartition

    topic = dead_letter_topic(config, map_name)
    consumer: Any = Consumer(
        librdkafka(
            config.kafka,
            **{"group.id": "materializer-console", "enable.auto.commit": False},
        )
    )
    try:
        metadata = consumer.list_topics(topic, timeout=POLL_SECONDS).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            return []
        wanted: list[Any] = []
        ends: dict[int, int] = {}
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=POLL_SECONDS
            )
            if high > low:
                wanted.append(TopicPartition(topic, partition, max(low, high - count)))
                ends[partition] = high
        if not wanted:
            return []
        consumer.assign(wanted)
        found: list[DeadLetter] = []
        left = {tp.partition for tp in wanted}
        while left:
            batch = consumer.consume(500, timeout=POLL_SECONDS)
            if not batch:
                break
            for record in batch:
                if record.error() is not None:
                    continue
                headers = {k: v for k, v in record.headers() or []}
                found.append(
                    DeadLetter(
                        timestamp_ms=record.timestamp()[1],
                        source_topic=_text(headers.get("x-source-topic")),
                        source_partition=_text(headers.get("x-source-partition")),
                        source_offset=_text(headers.get("x-source-offset")),
                        stage=_text(headers.get("x-error-stage")),
                        error=_text(headers.get("x-error-message")),
                        key=_text(record.key()),
                    )
                )
                if record.offset() + 1 >= ends[record.partition()]:
                    left.discard(record.partition())
        found.sort(key=lambda d: d.timestamp_ms, reverse=True)
        return found[:count]
    finally:
        consumer.close()
