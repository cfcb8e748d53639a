"""A consumer group's committed positions, read and written by a consumer of the group that
never subscribes: the group has no members, and the broker takes its commits as it takes
the admin API's (``runtime.group_offsets``). For the real-time path, whose writer commits
each map's position in its Kafka transactions (``live.positions``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from materializer.clients.kafka import librdkafka
from materializer.clients.kafka_offsets import KAFKA_TIMEOUT_SECONDS, KafkaOffsetsError
from materializer.config import KafkaConfig

COORDINATOR_WAIT_S = 30.0
"""How long a call waits for the group's coordinator: a broker that has just started, or
moved the group, answers "not coordinator" or "loading" for a while."""

_T = TypeVar("_T")


def committed(
    kafka: KafkaConfig, group: str, topics: dict[str, list[int]]
) -> dict[str, dict[int, int]]:
    """The positions committed to ``group``, per topic and partition (none: left out)."""
    with group_consumer(kafka, group) as consumer:
        return committed_by(consumer, group, topics)


def committed_by(
    consumer: Any, group: str, topics: dict[str, list[int]], wait: float = COORDINATOR_WAIT_S
) -> dict[str, dict[int, int]]:
    """``committed``, asked through an open ``group_consumer`` of ``group``, waiting up to
    ``wait`` seconds for a coordinator not ready to answer (``retried``)."""
    from confluent_kafka import TopicPartition

    wanted = [TopicPartition(t, p) for t, ps in topics.items() for p in ps]
    found = retried(group, lambda: consumer.committed(wanted, timeout=KAFKA_TIMEOUT_SECONDS), wait)
    out: dict[str, dict[int, int]] = {}
    for tp in found:
        if tp.offset >= 0:
            out.setdefault(tp.topic, {})[tp.partition] = tp.offset
    return out


@contextlib.contextmanager
def group_consumer(kafka: KafkaConfig, group: str) -> Iterator[Any]:
    """A consumer of ``group`` that never subscribes."""
    from confluent_kafka import Consumer

    consumer = Consumer(librdkafka(kafka, **{"group.id": group}))
    try:
        yield consumer
    finally:
        consumer.close()


def retried(group: str, call: Callable[[], _T], timeout: float = COORDINATOR_WAIT_S) -> _T:
    """``call``, again while the group's coordinator is not ready to answer (a broker just
    restarted, a crashed run's group handed over, a transaction still open on its offsets),
    up to ``timeout`` seconds."""
    from confluent_kafka import KafkaError, KafkaException

    waiting = {
        KafkaError._TIMED_OUT,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
    }
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0]
            retry = error.retriable() or error.code() in waiting
            if not retry or time.monotonic() > deadline:
                raise KafkaOffsetsError(
                    f"consumer group {group}: cannot read or commit the map's position: "
                    f"{error.str()}"
                ) from None
            time.sleep(0.5)
