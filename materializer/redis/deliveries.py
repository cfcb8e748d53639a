"""What the fold sends to Kafka beside Redis: the changelog and dead-letter records of a
batch, through a producer made from the map's settings, each delivered or failed loudly."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
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


TRANSACTION_TIMEOUT_S = 60.0
"""How long a producer waits for Kafka to begin, commit or abort a transaction, or to fence
the producers of its ``transactional.id``."""


def new_producer(target: FoldTarget, task: int | None = None) -> Producer:
    """A producer of the changelog and dead-letter records, with the map's Kafka settings.

    In a worker group (``target.transactional_id``) it is transactional: the
    driver's under the map's ``transactional.id``, an executor task's under
    the id with its partition (``task``). Its ``init_transactions`` fences any
    producer that had the id before it, on this worker or on one that lost the map.
    """
    from confluent_kafka import Producer

    settings = dict(target.producer)
    if target.transactional_id is None:
        return Producer(settings)
    settings["transactional.id"] = transactional_id(target.transactional_id, task)
    # A worker that lost the map must not fence its new owner's producer of this id.
    check_owner(target)
    producer = Producer(settings)
    try:
        producer.init_transactions(TRANSACTION_TIMEOUT_S)
    except Exception as exc:
        raise_fenced(target, exc)
        raise
    return producer


def check_owner(target: FoldTarget) -> None:
    """Raise ``Fenced`` if a newer owner than ``target.epoch`` claimed the map."""
    from materializer.clients.redis import client_for
    from materializer.contract.redis_layout import epoch_key, logical_name
    from materializer.redis.functions import Fenced

    if target.epoch is None:
        return
    raw = client_for(target.redis).get(epoch_key(logical_name(target.map_name)))
    if raw is not None and int(raw) > target.epoch:
        raise Fenced(target.map_name, target.epoch)


def transactional_id(prefix: str, task: int | None) -> str:
    """The ``transactional.id`` of a map's driver producer (``task`` None) or task's."""
    return prefix if task is None else f"{prefix}.{task}"


def raise_fenced(target: FoldTarget, exc: Exception) -> None:
    """Raise ``Fenced`` if Kafka refused a producer because a newer one has its id."""
    from confluent_kafka import KafkaError, KafkaException

    from materializer.redis.functions import Fenced

    fenced = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    # The client may raise its error wrapped (a delivery callback's SystemError).
    for error in (exc, exc.__cause__, exc.__context__):
        if isinstance(error, KafkaException) and error.args[0].code() in fenced:
            raise Fenced(target.map_name, target.epoch) from exc


class Deliveries:
    """Produces records and fails loudly if any is not delivered by the flush.

    For a map in a worker group, the records sent between two flushes go in one
    transaction, begun by the first of them and committed by the flush:
    ``read_committed`` readers (the Delta query) never see the records of a worker
    fenced in the middle of a batch. A flush with nothing sent commits nothing.
    """

    def __init__(self, producer: Producer, target: FoldTarget | None = None) -> None:
        self.producer = producer
        self.errors: list[str] = []
        self.target = target if target is not None and target.transactional_id else None
        self.ends: dict[str, dict[int, int]] = {}
        """Per topic and partition, the next offset after the last record delivered there:
        where a reader that read up to it has read every record sent through this object."""
        self.ends_known = True
        """False once a delivery came back without its offset (the broker did not say)."""
        self._open = False

    def _done(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
            return
        ends = self.ends.get(msg.topic())
        if ends is None:
            ends = self.ends[msg.topic()] = {}
        end = msg.offset() + 1
        if end <= 0:
            self.ends_known = False
        elif end > ends.get(msg.partition(), 0):
            ends[msg.partition()] = end

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Any) -> None:
        """Produce one record, waiting for room when the producer's queue is full."""
        if self.target is not None and not self._open:
            self._in_transaction(self.producer.begin_transaction)
            self._open = True
        while True:
            try:
                self.producer.produce(
                    topic, key=key, value=value, headers=headers, on_delivery=self._done
                )
                return
            except BufferError:
                self.producer.poll(0.05)

    def flush(self) -> None:
        """Wait for every record sent, and commit them; raise if any was not delivered."""
        try:
            remaining = self.producer.flush(120)
        except Exception as exc:  # a fatal error: a fenced producer's, raised on the way
            if self.target is not None:
                raise_fenced(self.target, exc)
            raise
        if self.errors or remaining:
            self.abort()
            raise RuntimeError(
                f"Kafka did not take {len(self.errors) + remaining} records: {self.errors[:3]}"
            )
        if self._open:
            try:
                self._in_transaction(self.producer.commit_transaction, TRANSACTION_TIMEOUT_S)
            except Exception:
                self.abort()
                raise
            self._open = False

    def abort(self) -> None:
        """Abort the open transaction of records that must not be read (a batch that failed
        on the way); the producer can begin another."""
        if self._open:
            self._open = False
            # Fenced or broken: nothing more to do with it here; the caller drops it.
            with contextlib.suppress(Exception):
                self.producer.abort_transaction(TRANSACTION_TIMEOUT_S)

    def _in_transaction(self, call: Callable[..., None], *args: float) -> None:
        """A transactional call; a fenced producer raises ``Fenced``."""
        assert self.target is not None
        try:
            call(*args)
        except Exception as exc:
            raise_fenced(self.target, exc)
            raise
