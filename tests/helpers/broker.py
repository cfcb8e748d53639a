"""The broker asked directly, with Kafka's admin API: what a test checks a command did to
topics and consumer groups, rather than what the command said it did."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, ConfigResource

TIMEOUT_S = 30.0


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def topics(bootstrap: str) -> set[str]:
    """The topics the broker holds now."""
    return set(_admin(bootstrap).list_topics(timeout=TIMEOUT_S).topics)


def consumer_groups(bootstrap: str) -> set[str]:
    """The consumer groups the broker knows now (with members or only committed offsets)."""
    admin = _admin(bootstrap)  # held until the answer: a client gone leaves it unanswered
    listed = admin.list_consumer_groups(request_timeout=TIMEOUT_S).result(TIMEOUT_S)
    return {group.group_id for group in listed.valid}


def partitions(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has."""
    metadata = _admin(bootstrap).list_topics(topic, timeout=TIMEOUT_S).topics[topic]
    assert metadata.error is None, metadata.error
    return len(metadata.partitions)


def topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    """``topic``'s configuration as the broker describes it (its own settings and defaults)."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = _admin(bootstrap)
    future = admin.describe_configs([resource], request_timeout=TIMEOUT_S)[resource]
    return {name: entry.value for name, entry in future.result(TIMEOUT_S).items()}
