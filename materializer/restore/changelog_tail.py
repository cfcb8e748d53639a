"""The part of a map's changelog topic its Delta table has not taken in yet.

The Delta query MERGEs the changelog every trigger, so the table trails the
fold by up to a trigger, and by much more when the materializer died before
its next MERGE. Whatever the Delta query's checkpoint last committed is in the
table; every changelog record after that is the tail. Reading it with a plain
consumer (assigned partitions, explicit offsets, no group commits) leaves the
map's own consumers untouched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from materializer.clients.kafka import librdkafka
from materializer.config import KafkaConfig
from materializer.contract.changelog import EXPIRED_HEADER
from materializer.errors import MaterializerError

POLL_SECONDS = 1.0
STALL_SECONDS = 60.0
"""How long the tail may go without a record or an end of partition before the read gives up."""
METADATA_SECONDS = 10.0


class ChangelogError(MaterializerError):
    """The changelog topic could not be read to its end."""


@dataclass
class Tail:
    """The last changelog record per key between ``start`` and ``end`` (per partition).

    ``changes`` maps each key to its entity JSON, ``None`` for a delete; a key
    lives in one partition, so the last record read for it is its latest.
    ``timestamps`` holds that record's Kafka timestamp (epoch ms), when it has one.
    """

    topic: str
    start: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    records: int = 0
    changes: dict[str, bytes | None] = field(default_factory=dict)
    timestamps: dict[str, int] = field(default_factory=dict)
    expired: set[str] = field(default_factory=set)
    """Keys whose last record is the tombstone of an expiry (``ttl.redis``), not a delete."""

    @property
    def upserts(self) -> int:
        """Keys whose last record is an entity."""
        return sum(1 for value in self.changes.values() if value is not None)

    @property
    def deletes(self) -> int:
        """Keys whose last record is a delete."""
        return len(self.changes) - self.upserts


def read_tail(kafka: KafkaConfig, topic: str, committed: dict[int, int] | None) -> Tail:
    """The records of ``topic`` from ``committed`` (earliest where absent) to the log end now.

    A start before the log's first offset (retention, compaction) begins at that
    first offset. The end is each partition's high watermark when the read
    starts: records written later belong to batches the hold kept from running
    or that a later rehydrate or verify sees. A topic that does not exist yet
    (the map never wrote a batch) has an empty tail.
    """
    from confluent_kafka import Consumer, KafkaException

    consumer = Consumer(
        librdkafka(
            kafka,
            **{
                "group.id": "materializer-ops",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "fetch.max.bytes": 64 * 1024 * 1024,
                "queued.max.messages.kbytes": 256 * 1024,
            },
        )
    )
    tail = Tail(topic)
    try:
        _read(consumer, tail, committed)
    except KafkaException as exc:
        raise ChangelogError(f"changelog topic {topic}: {exc}") from None
    finally:
        consumer.close()
    return tail


def _read(consumer: Any, tail: Tail, committed: dict[int, int] | None) -> None:
    """Assign each partition that has records past its start, and consume them."""
    from confluent_kafka import KafkaError, TopicPartition

    topic = tail.topic
    assignments = []
    for partition in _partitions(consumer, topic):
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=METADATA_SECONDS
        )
        start = max(low, (committed or {}).get(partition, low))
        tail.start[partition], tail.end[partition] = start, high
        if start < high:
            assignments.append(TopicPartition(topic, partition, start))
    if assignments:
        consumer.assign(assignments)
        _consume(consumer, tail, {tp.partition for tp in assignments}, KafkaError)


def _partitions(consumer: Any, topic: str) -> list[int]:
    from confluent_kafka import KafkaError, KafkaException

    try:
        metadata = consumer.list_topics(topic, timeout=METADATA_SECONDS).topics[topic]
    except KafkaException as exc:
        raise ChangelogError(f"changelog topic {topic}: {exc}") from None
    if metadata.error is not None:
        if metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return []
        raise ChangelogError(f"changelog topic {topic}: {metadata.error.str()}")
    return sorted(metadata.partitions)


def _consume(consumer: Any, tail: Tail, open_partitions: set[int], kafka_error: Any) -> None:
    """Read until every partition reached its end (its last offset, or Kafka's end of partition).

    Offsets are not contiguous (transaction markers, compaction), so a
    partition is done at its first record at or past the end, or at the end of
    partition event, never by counting.
    """
    waiting = set(open_partitions)
    last_progress = time.monotonic()
    changes, timestamps = tail.changes, tail.timestamps
    while waiting:
        messages = consumer.consume(num_messages=10_000, timeout=POLL_SECONDS)
        if messages:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > STALL_SECONDS:
            raise ChangelogError(
                f"changelog topic {tail.topic}: no records for {STALL_SECONDS:.0f} s before "
                f"the end of partitions {sorted(waiting)}"
            )
        for message in messages:
            partition = message.partition()
            error = message.error()
            if error is not None:
                if error.code() == kafka_error._PARTITION_EOF:
                    waiting.discard(partition)
                    continue
                raise ChangelogError(f"changelog topic {tail.topic}: {error.str()}")
            offset, end = message.offset(), tail.end[partition]
            if offset >= end or partition not in waiting:
                waiting.discard(partition)
                continue
            key = message.key()
            if key is not None:
                name = key.decode()
                changes[name] = message.value()
                if message.value() is None and (EXPIRED_HEADER, b"1") in (message.headers() or ()):
                    tail.expired.add(name)
                else:
                    tail.expired.discard(name)
                stamp = message.timestamp()[1]
                if stamp >= 0:
                    timestamps[name] = stamp
                else:
                    timestamps.pop(name, None)
                tail.records += 1
            if offset >= end - 1:
                waiting.discard(partition)
