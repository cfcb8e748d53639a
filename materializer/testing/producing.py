"""Records into the tests' Kafka as a producer application writes them: idempotent, in
order, each acknowledged before the call returns, with the (partition, offset) it got."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Self

from confluent_kafka import KafkaError, Message
from confluent_kafka.cimpl import Producer

Record = tuple[bytes | None, bytes | None]


def produce(
    bootstrap_servers: str,
    topic: str,
    records: Iterable[Record],
    partition: int | None = None,
    settings: Mapping[str, Any] | None = None,
) -> list[tuple[int, int]]:
    """Produce ``(key, value)`` records in order, idempotently; (partition, offset) of each.

    ``settings`` adds producer properties (``message.max.bytes`` for big records, say).
    A producer of its own for this call: ``Producing`` keeps one for many.
    """
    with Producing(bootstrap_servers, settings) as producer:
        return producer.send(topic, records, partition)


class Producing:
    """One idempotent producer kept for many ``send`` calls, each as ``produce`` does it.

    A producer's start (its metadata and idempotence id) takes about half a second: a
    test that streams records a few at a time sends them through one of these instead.
    ``send`` may be called from one thread at a time.
    """

    def __init__(self, bootstrap_servers: str, settings: Mapping[str, Any] | None = None) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap_servers,
                "enable.idempotence": True,
                "linger.ms": 5,
                "compression.type": "lz4",
                **(settings or {}),
            }
        )

    def send(
        self, topic: str, records: Iterable[Record], partition: int | None = None
    ) -> list[tuple[int, int]]:
        """Produce ``(key, value)`` records in order and wait for them: (partition, offset)
        of each."""
        producer = self.producer
        positions: list[tuple[int, int] | None] = []
        errors: list[str] = []

        def delivered(index: int, err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                positions[index] = (msg.partition() or 0, msg.offset() or 0)

        for i, (key, value) in enumerate(records):
            positions.append(None)
            while True:
                try:
                    producer.produce(
                        topic,
                        value=value,
                        key=key,
                        partition=-1 if partition is None else partition,
                        on_delivery=functools.partial(delivered, i),
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        remaining = producer.flush(60)
        if errors or remaining:
            raise RuntimeError(f"produce to {topic} failed: {errors[:3]} ({remaining} undelivered)")
        return [p for p in positions if p is not None]

    def close(self) -> None:
        """Whatever is still in flight delivered."""
        self.producer.flush(60)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
