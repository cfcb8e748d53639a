"""Where an enrichment's batches go: its output topic and dead-letter topic, with a guarantee.

``at_least_once``: Spark's own ``kafka`` writer from the executors, one
record per row, the topic chosen per row. A batch replayed after a crash is
written again, so a consumer may see an event's output twice, never zero
times. Records are visible as soon as they are written.

``exactly_once``: the driver writes the whole batch in one Kafka transaction
with one transactional producer, and the batch's end offsets go into the same
transaction (``send_offsets_to_transaction``) for the consumer group
``materializer.<enrichment>``, as Kafka Streams does. The transaction either
commits both the records and the offsets or neither. A batch whose end
offsets the group already holds was committed before a crash, and its replay
is skipped. The producer's ``transactional.id`` is stable, so a restarted run
fences a zombie and aborts the transaction a killed run left open. The cost:
``read_committed`` consumers see a batch only once it commits (a trigger
interval plus the batch's time later), and the batch crosses the driver,
which caps throughput at what one producer sends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from materializer.batch import Batch, Sink
from materializer.clients.group_positions import retried
from materializer.clients.kafka import java
from materializer.config import AppConfig
from materializer.enrichment.partition_join import DEAD, OUT, TARGET

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Producer

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_S = 60.0


class KafkaOutput(Sink):
    """``at_least_once``: the batch through Spark's ``kafka`` writer, output and dead letters
    in one write."""

    name = "kafka"

    def __init__(self, topics: Mapping[str, str], producer: Mapping[str, str]) -> None:
        self.topics = dict(topics)
        self.producer = dict(producer)

    def write(self, batch: Batch) -> None:
        """Every row to its topic; a replay writes them again."""
        from pyspark.sql import functions as F

        rows = batch.rows
        topic = F.when(F.col(TARGET) == OUT, F.lit(self.topics[OUT])).otherwise(
            F.lit(self.topics[DEAD])
        )
        writer = rows.select(topic.alias("topic"), "key", "value", "headers").write.format("kafka")
        for key, value in self.producer.items():
            writer = writer.option(f"kafka.{key}", value)
        writer.save()


class TransactionalOutput(Sink):
    """``exactly_once``: the batch and its end offsets in one transaction, from the driver."""

    name = "transaction"

    def __init__(
        self,
        topics: Mapping[str, str],
        client: Mapping[str, str],
        producer: Mapping[str, str],
        group: str,
        end_offsets: Callable[[int], dict[str, dict[int, int]]],
    ) -> None:
        """``client``: connection settings of every client; ``producer``: the producer's own
        (``transactional.id``, ``transaction.timeout.ms``...)."""
        self.topics = dict(topics)
        self.group = group
        self._client = dict(client)
        self._producer_settings = dict(producer)
        self._end_offsets = end_offsets
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None

    def write(self, batch: Batch) -> None:
        """Commit the batch's records and end offsets together, unless the group has them."""
        from confluent_kafka import KafkaException, TopicPartition

        ends = [
            TopicPartition(topic, partition, offset)
            for topic, partitions in self._end_offsets(batch.batch_id).items()
            for partition, offset in partitions.items()
        ]
        if self._committed(ends):
            log.info(
                "group %s already holds the offsets of batch %d: a replay, skipped",
                self.group,
                batch.batch_id,
            )
            return
        producer = self._ready_producer()
        consumer = self._group_consumer()
        rows = batch.rows.toArrow()
        producer.begin_transaction()
        try:
            for target, key, value, headers in zip(
                rows.column(TARGET).to_pylist(),
                rows.column("key").to_pylist(),
                rows.column("value").to_pylist(),
                rows.column("headers").to_pylist(),
                strict=True,
            ):
                _produce(
                    producer,
                    self.topics[target],
                    key,
                    value,
                    [(h["key"], h["value"]) for h in headers or ()],
                )
            producer.send_offsets_to_transaction(
                ends, consumer.consumer_group_metadata(), COMMIT_TIMEOUT_S
            )
            producer.commit_transaction(COMMIT_TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0]
            if error.txn_requires_abort():
                producer.abort_transaction(COMMIT_TIMEOUT_S)
            raise

    def close(self) -> None:
        """Drop the producer (librdkafka closes it) and close the group's consumer."""
        self._producer = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _committed(self, ends: list[Any]) -> bool:
        """Whether the group's committed offsets reach ``ends`` on every partition."""
        if not ends:
            return False
        committed = retried(
            self.group,
            lambda: self._group_consumer().committed(ends, timeout=COMMIT_TIMEOUT_S),
            COMMIT_TIMEOUT_S,
        )
        held = {(tp.topic, tp.partition): tp.offset for tp in committed}
        return all(held.get((tp.topic, tp.partition), -1) >= tp.offset for tp in ends)

    def _ready_producer(self) -> Producer:
        """The transactional producer; its first start fences any earlier one of this id."""
        from confluent_kafka import Producer

        if self._producer is None:
            producer = Producer(
                {
                    **self._client,
                    "linger.ms": 5,
                    **self._producer_settings,
                }
            )
            producer.init_transactions(COMMIT_TIMEOUT_S)
            self._producer = producer
        return self._producer

    def _group_consumer(self) -> Consumer:
        """A consumer of the group that never subscribes: its metadata and committed offsets
        are all the transactions need."""
        from confluent_kafka import Consumer

        if self._consumer is None:
            self._consumer = Consumer(
                {
                    **self._client,
                    "group.id": self.group,
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                }
            )
        return self._consumer


def _produce(
    producer: Producer,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, str | bytes | None]],
) -> None:
    """Queue one record, waiting for room when the producer's queue is full."""
    while True:
        try:
            producer.produce(topic, value, key, headers=headers)
            return
        except BufferError:
            producer.poll(0.1)


def producer_options(config: AppConfig, max_record_bytes: int) -> dict[str, str]:
    """Spark ``kafka`` writer options (without the ``kafka.`` prefix) for an enrichment's
    topics: idempotent, and records as large as its sources' largest."""
    return java(
        config.kafka,
        **{
            "enable.idempotence": "true",
            "acks": "all",
            "max.request.size": str(max_record_bytes),
        },
    )
