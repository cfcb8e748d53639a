"""Offsets asked of Kafka's admin API: log ends for lag, earliest/latest/by time for resets."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from materializer.clients.kafka import librdkafka, topic_partitions
from materializer.config import KafkaConfig
from materializer.errors import MaterializerError

KAFKA_TIMEOUT_SECONDS = 5.0

Position = str | int
"""``"earliest"``, ``"latest"``, or a UTC epoch-milliseconds timestamp."""


class KafkaOffsetsError(MaterializerError):
    """Kafka could not say where a topic's partitions start or end."""


class KafkaAccessError(MaterializerError):
    """The brokers refused the configured credentials or TLS settings: no retry mends it."""


ACCESS_CHECK_SECONDS = 15.0


def check_access(kafka: KafkaConfig, timeout: float = ACCESS_CHECK_SECONDS) -> None:
    """Raise ``KafkaAccessError`` if the brokers refuse this config's credentials or TLS.

    librdkafka retries a refused login forever and reports it only to an error
    callback; the call that needed the connection fails later as a plain timeout.
    Asking for metadata once, with the callback watching, turns that into one
    error that says why. Brokers that do not answer at all are left to the
    caller's retries (an outage ends; a wrong password does not).
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    refused: list[str] = []
    kinds = (KafkaError._AUTHENTICATION, KafkaError._SSL)

    def seen(error: KafkaError) -> None:
        if error.code() in kinds:
            refused.append(error.str())

    admin = AdminClient(librdkafka(kafka, error_cb=seen))
    deadline = time.monotonic() + timeout
    while not refused and time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=1.0)
            return
        except KafkaException:
            admin.poll(0.1)  # the error callback runs only here
    if refused:
        raise KafkaAccessError(
            f"Kafka at {kafka.bootstrap_servers} refused {_credentials(kafka)}: {refused[-1]}"
        )


def _credentials(kafka: KafkaConfig) -> str:
    """What the config presents to the brokers, in words and without secrets."""
    security = kafka.security
    if security is not None and security.sasl is not None:
        sasl = security.sasl
        return f"the login of kafka.security.sasl ({sasl.mechanism}, user {sasl.username!r})"
    return f"the connection ({security.protocol if security else 'PLAINTEXT'}, kafka.security)"


def admin_client(kafka: KafkaConfig) -> Any:
    """An AdminClient with the config's connection properties (security, timeouts)."""
    from confluent_kafka.admin import AdminClient

    return AdminClient(librdkafka(kafka))


def partition_offsets(
    admin: Any, topics: Sequence[str], at: Position = "latest"
) -> dict[str, dict[int, int]]:
    """Per topic and partition, the offset at ``at``.

    For a timestamp, the first offset whose record is at or after it; a
    partition with no such record gives its log end (nothing there to replay).
    """
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

    wanted: dict[Any, Any] = {}
    for topic, ids in partition_ids(admin, topics).items():
        for partition in ids:
            if at == "earliest":
                spec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
            elif at == "latest":
                spec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
            else:
                spec = OffsetSpec.for_timestamp(int(at))
            wanted[TopicPartition(topic, partition)] = spec
    out: dict[str, dict[int, int]] = {t: {} for t in topics}
    if not wanted:
        return out
    futures = admin.list_offsets(wanted, request_timeout=KAFKA_TIMEOUT_SECONDS)
    missing = []
    for tp, future in futures.items():
        offset = future.result().offset
        if offset < 0:
            missing.append(tp.topic)
        out[tp.topic][tp.partition] = offset
    if missing:
        ends = partition_offsets(admin, sorted(set(missing)), "latest")
        for topic, partitions in out.items():
            for partition, offset in partitions.items():
                if offset < 0:
                    partitions[partition] = ends[topic][partition]
    return out


def partition_ids(admin: Any, topics: Sequence[str]) -> dict[str, list[int]]:
    """Per topic, its partitions (one metadata request per topic); ``KafkaOffsetsError`` for a
    topic Kafka does not know."""
    out: dict[str, list[int]] = {}
    for topic in topics:
        metadata = admin.list_topics(topic, timeout=KAFKA_TIMEOUT_SECONDS).topics[topic]
        if metadata.error is not None:
            raise KafkaOffsetsError(f"topic {topic}: {metadata.error.str()}")
        out[topic] = sorted(metadata.partitions)
    return out


def offsets_of(
    admin: Any, partitions: Mapping[str, Sequence[int]], at: Literal["earliest", "latest"]
) -> dict[str, dict[int, int]]:
    """The log start or end offset of each of ``partitions``, in one ``ListOffsets`` call for
    all of them (librdkafka sends one request per partition leader, not one per partition).

    For callers that ask often (``materializer.runtime.catch_up`` asks every
    second): the partitions are given, so no metadata request goes with it.
    """
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

    spec = OffsetSpec.earliest() if at == "earliest" else OffsetSpec.latest()  # type: ignore[no-untyped-call]
    wanted = {TopicPartition(t, p): spec for t, ps in partitions.items() for p in ps}
    out: dict[str, dict[int, int]] = {t: {} for t in partitions}
    if not wanted:
        return out
    futures = admin.list_offsets(wanted, request_timeout=KAFKA_TIMEOUT_SECONDS)
    for tp, future in futures.items():
        out[tp.topic][tp.partition] = int(future.result().offset)
    return out


def commit_group_offsets(
    admin: Any,
    group: str,
    offsets: dict[str, dict[int, int]],
    timeout: float = KAFKA_TIMEOUT_SECONDS,
) -> None:
    """Set a member-less group's committed offsets (Kafka's "next offsets"), all or an error.

    For one-shot commands: ``admin`` must not be used again, nor live on, after a
    timeout. librdkafka aborts the process when the coordinator a timed-out admin
    request was waiting for answers later (see ``materializer.runtime.group_offsets``,
    which commits through a consumer of the group instead).
    """
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException

    partitions = topic_partitions(offsets)
    if not partitions:
        return
    request = ConsumerGroupTopicPartitions(group, partitions)
    futures = admin.alter_consumer_group_offsets([request], request_timeout=timeout)
    result = futures[group].result(timeout + 5)
    for tp in result.topic_partitions:
        if tp.error is not None:
            raise KafkaException(tp.error)
