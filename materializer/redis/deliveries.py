"""What the fold sends to Kafka beside Redis: the changelog and dead-letter records of a
batch, through a producer made from the map's settings, each delivered or failed loudly."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from materializer.clients.kafka import librdkafka
from materializer.config import KafkaConfig

if TYPE_CHECKING:
    from confluent_kafka import Producer

    from materializer.redis.functions import FoldTarget


def producer_settings(kafka: KafkaConfig, max_record_bytes: int) -> tuple[tuple[str, Any], ...]:
    """librdkafka settings for a map's own records: idempotent, and partitioned by key as
    Kafka's Java clients do (``murmur2``), so a key stays in the partition it always had."""
    settings = librdkafka(
        kafka,
        **{
            "enable.idempotence": "true",
            "acks": "all",
            "partitioner": "murmur2_random",
            "message.max.bytes": str(max_record_bytes),
            "linger.ms": "5",
        },
    )
    return tuple(sorted(settings.items()))


def new_producer(target: FoldTarget) -> Producer:
    """A producer of the changelog and dead-letter records, with the map's Kafka settings."""
    from confluent_kafka import Producer

    return Producer(dict(target.producer))


class Deliveries:
    """Produces records and fails loudly if any is not delivered by the flush."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.errors: list[str] = []

    def _done(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Any) -> None:
        """Produce one record, waiting for room when the producer's queue is full."""
        while True:
            try:
                self.producer.produce(
                    topic, key=key, value=value, headers=headers, on_delivery=self._done
                )
                return
            except BufferError:
                self.producer.poll(0.05)

    def flush(self) -> None:
        """Wait for every record sent; raise if any was not delivered."""
        remaining = self.producer.flush(120)
        if self.errors or remaining:
            raise RuntimeError(
                f"Kafka did not take {len(self.errors) + remaining} records: {self.errors[:3]}"
            )
