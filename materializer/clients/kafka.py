"""The settings of every Kafka client the product runs, from the one ``kafka`` block.

Two client families speak to the brokers: librdkafka (confluent-kafka: dead letters,
the changelog, transactional outputs, admin calls, group commits, the query service's
status reads) and Kafka's Java client (Spark's source and writers). They name the same
security settings differently, so ``kafka.security`` is mapped here, once per family,
and nowhere else; ``kafka.properties`` pass to both as they are, last, so an operator
can still override any of it.

Both families get certificates and keys as PEM text rather than file paths: Spark ships
the options (and the fold's producer settings) to executors, which need not see the
driver's files.
"""

from __future__ import annotations

from typing import Any

from materializer.config import KafkaConfig, KafkaSecurity, read_config_file

_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def librdkafka(kafka: KafkaConfig, **settings: Any) -> dict[str, Any]:
    """A confluent-kafka client's config: brokers, security, ``settings``, then properties."""
    config: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap_servers}
    if kafka.security is not None:
        config.update(_librdkafka_security(kafka.security))
    config.update(settings)
    config.update(kafka.properties)
    return config


def java(kafka: KafkaConfig, **settings: str) -> dict[str, str]:
    """A Java client's properties (no ``kafka.`` prefix), in the same order of precedence."""
    config = {"bootstrap.servers": kafka.bootstrap_servers}
    if kafka.security is not None:
        config.update(_java_security(kafka.security))
    config.update(settings)
    config.update(kafka.properties)
    return config


def topic_partitions(offsets: dict[str, dict[int, int]]) -> list[Any]:
    """Offsets per topic and partition as the client's TopicPartitions, in a stable order."""
    from confluent_kafka import TopicPartition

    return [
        TopicPartition(topic, partition, offset)
        for topic, by_partition in sorted(offsets.items())
        for partition, offset in sorted(by_partition.items())
    ]


FENCERS = 32
"""Producers fencing at once: each waits on a transaction coordinator's round trips. A
hundred ids took 0.8–1.8 s at 32, 2.5–3.6 s at 8 (a real-time query's restart fences its
maps' writers)."""


def fence_transactional_ids(kafka: KafkaConfig, ids: list[str], timeout: float) -> None:
    """Fence whatever producer last held each of ``ids``: an ``init_transactions`` of the id
    aborts its open transaction and bumps its epoch, so it can commit nothing more. The ids
    are fenced several at once, each a producer's own round trips to its coordinator."""
    from concurrent.futures import ThreadPoolExecutor

    from confluent_kafka import Producer

    def fence(tid: str) -> None:
        fencer = Producer({**librdkafka(kafka), "transactional.id": tid})  # the id whatever
        try:
            fencer.init_transactions(timeout)
        finally:
            fencer.flush(0)

    if ids:
        with ThreadPoolExecutor(max_workers=min(FENCERS, len(ids))) as pool:
            list(pool.map(fence, ids))


def _librdkafka_security(security: KafkaSecurity) -> dict[str, Any]:
    config: dict[str, Any] = {"security.protocol": security.protocol}
    if security.ca_file:
        config["ssl.ca.pem"] = read_config_file(security.ca_file, "kafka.security.ca_file")
    if security.cert_file and security.key_file:
        config["ssl.certificate.pem"] = read_config_file(
            security.cert_file, "kafka.security.cert_file"
        )
        config["ssl.key.pem"] = read_config_file(security.key_file, "kafka.security.key_file")
    if security.key_password is not None:
        config["ssl.key.password"] = security.key_password.reveal("kafka.security.key_password")
    if security.sasl is not None:
        config["sasl.mechanism"] = security.sasl.mechanism
        config["sasl.username"] = security.sasl.username
        config["sasl.password"] = security.sasl.password.reveal("kafka.security.sasl.password")
    return config


def _java_security(security: KafkaSecurity) -> dict[str, str]:
    config = {"security.protocol": security.protocol}
    if security.ca_file:
        config["ssl.truststore.type"] = "PEM"
        config["ssl.truststore.certificates"] = read_config_file(
            security.ca_file, "kafka.security.ca_file"
        )
    if security.cert_file and security.key_file:
        config["ssl.keystore.type"] = "PEM"
        config["ssl.keystore.certificate.chain"] = read_config_file(
            security.cert_file, "kafka.security.cert_file"
        )
        config["ssl.keystore.key"] = read_config_file(security.key_file, "kafka.security.key_file")
    if security.key_password is not None:
        config["ssl.key.password"] = security.key_password.reveal("kafka.security.key_password")
    if security.sasl is not None:
        sasl = security.sasl
        config["sasl.mechanism"] = sasl.mechanism
        config["sasl.jaas.config"] = (
            f"{_JAAS_MODULES[sasl.mechanism]} required "
            f"username={_jaas_quoted(sasl.username)} "
            f"password={_jaas_quoted(sasl.password.reveal('kafka.security.sasl.password'))};"
        )
    return config


def _jaas_quoted(text: str) -> str:
    """A JAAS option value: quoted, with quotes and backslashes escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
