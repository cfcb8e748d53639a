"""The catalog topic: created on first use, written with ``acks=all``, read to its end.

Writers (the query service's admin API, ``materializer maps``) read the topic to its end
before each change, so a change's version follows the last one they saw; readers
(every ``materializer run`` and query service) follow it with a consumer of their own,
outside any consumer group: each one needs every record, from the first.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import uuid
from typing import Any, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as Partition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from materializer.clients.kafka import librdkafka
from materializer.config import CatalogConfig, KafkaConfig
from materializer.contract.map_catalog import StoredMap, decode
from materializer.errors import MaterializerError

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 15.0
TOPIC_SETTINGS = {
    "cleanup.policy": "compact",
    # A definition is never old: compaction keeps the last one of each map for good,
    # and a deletion's tombstone long enough for every reader to see it.
    "delete.retention.ms": str(7 * 24 * 3600 * 1000),
    "min.compaction.lag.ms": "0",
}


class CatalogUnavailable(MaterializerError):
    """Kafka did not answer the catalog's read or write in time; nothing was changed."""


class CatalogTopic:
    """One catalog topic on one Kafka cluster."""

    def __init__(self, kafka: KafkaConfig, catalog: CatalogConfig) -> None:
        self._kafka = kafka
        self._catalog = catalog
        self.topic = catalog.topic
        self._ready = False
        self._producer: Any = None
        self._lock = threading.Lock()

    def ensure(self) -> None:
        """Create the topic (compacted, one partition) if it is missing."""
        if self._ready:
            return
        admin = AdminClient(librdkafka(self._kafka, logger=log))
        try:
            found = admin.list_topics(timeout=TIMEOUT_SECONDS).topics.get(self.topic)
            if found is None or found.error is not None:
                new = NewTopic(
                    self.topic,
                    num_partitions=1,
                    replication_factor=self._catalog.replication_factor,
                    config=TOPIC_SETTINGS,
                )
                try:
                    admin.create_topics([new])[self.topic].result(TIMEOUT_SECONDS)
                    log.info("catalog.topic: created topic %s", self.topic)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise
            elif len(found.partitions) != 1:
                raise CatalogUnavailable(
                    f"catalog.topic: topic {self.topic} has {len(found.partitions)} partitions; "
                    "the catalog needs exactly one, so that every change keeps its order"
                )
        except KafkaException as exc:
            raise CatalogUnavailable(
                f"catalog.topic: cannot prepare topic {self.topic}: {exc.args[0].str()}"
            ) from None
        except concurrent.futures.TimeoutError:
            raise CatalogUnavailable(
                f"catalog.topic: Kafka did not create topic {self.topic} within "
                f"{TIMEOUT_SECONDS:.0f} s"
            ) from None
        self._ready = True

    def follower(self) -> CatalogFollower:
        """A reader of every record from the first, for one process."""
        self.ensure()
        return CatalogFollower(self._kafka, self.topic)

    def read(self) -> dict[str, StoredMap]:
        """Every map's last record, read to the end of the topic as it is now."""
        follower = self.follower()
        try:
            follower.catch_up(TIMEOUT_SECONDS)
            return follower.last
        finally:
            follower.close()

    def write(self, change: StoredMap) -> StoredMap:
        """Append one change and wait until every in-sync replica has it; where it landed."""
        self.ensure()
        with self._lock:
            if self._producer is None:
                self._producer = Producer(
                    librdkafka(self._kafka, acks="all", logger=log, **{"enable.idempotence": True})
                )
            done: list[Any] = []
            self._producer.produce(
                self.topic,
                key=change.key(),
                value=change.value(),
                headers=change.headers(),
                on_delivery=lambda err, msg: done.append((err, msg)),
            )
            left = self._producer.flush(TIMEOUT_SECONDS)
        if left or not done:
            raise CatalogUnavailable(
                f"catalog.topic: Kafka did not take the change to map {change.name!r} within "
                f"{TIMEOUT_SECONDS:.0f} s; it may still land, so read the map before retrying"
            )
        err, msg = done[0]
        if err is not None:
            raise CatalogUnavailable(
                f"catalog.topic: Kafka refused the change to map {change.name!r}: {err.str()}"
            )
        return StoredMap(
            change.name,
            change.version,
            change.config,
            change.by,
            change.at_ms,
            change.rebuilt_at,
            offset=msg.offset(),
        )

    def close(self) -> None:
        """Release the producer (after whatever it still holds is sent)."""
        if self._producer is not None:
            self._producer.flush(TIMEOUT_SECONDS)
            self._producer = None


class CatalogFollower:
    """Reads the catalog from its first record and keeps up with it: each map's last record.

    Not thread-safe: one thread polls it (the run's loop, the query service's watcher).
    """

    def __init__(self, kafka: KafkaConfig, topic: str) -> None:
        self.topic = topic
        self._consumer = Consumer(
            librdkafka(
                kafka,
                **{
                    # No group: nothing is committed, every reader reads from the first record.
                    "group.id": f"materializer-catalog-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "enable.partition.eof": True,
                    "logger": log,
                },
            )
        )
        self._consumer.assign([Partition(topic, 0, OFFSET_BEGINNING)])
        self.last: dict[str, StoredMap] = {}
        """Each map's last record, a deletion included (its tombstone until compacted)."""
        self.position = 0
        """The offset after the last record read."""

    def poll(self, timeout: float = 0.0) -> bool:
        """Take in what has arrived; whether anything changed."""
        changed = False
        deadline = time.monotonic() + timeout
        while True:
            msg = self._consumer.poll(max(0.0, deadline - time.monotonic()))
            if msg is None:
                return changed
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return changed
                raise CatalogUnavailable(f"catalog.topic: cannot read {self.topic}: {error}")
            offset = msg.offset() or 0
            self.position = offset + 1
            headers = cast("list[tuple[str, bytes]] | None", msg.headers())
            record = decode(msg.key(), msg.value(), headers, offset)
            if record is None:
                log.warning(
                    "catalog.topic: record at offset %d of %s is not a map definition; skipped",
                    msg.offset(),
                    self.topic,
                )
                continue
            self.last[record.name] = record
            changed = True

    def catch_up(self, timeout: float) -> None:
        """Read up to the topic's end as it is now; ``CatalogUnavailable`` past ``timeout``."""
        deadline = time.monotonic() + timeout
        try:
            _, end = self._consumer.get_watermark_offsets(Partition(self.topic, 0), timeout=timeout)
        except KafkaException as exc:
            raise CatalogUnavailable(
                f"catalog.topic: cannot read the end of {self.topic}: {exc.args[0].str()}"
            ) from None
        while self.position < end:
            if time.monotonic() > deadline:
                raise CatalogUnavailable(
                    f"catalog.topic: read {self.position} of {end} records of {self.topic} "
                    f"within {timeout:.0f} s"
                )
            self.poll(0.2)

    def close(self) -> None:
        """Leave the topic."""
        self._consumer.close()
