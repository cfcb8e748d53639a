"""Helpers of the value-format tests: one-map configs, dead letters read back, stores compared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from materializer.config import AppConfig
from materializer.config.names import dead_letter_topic
from materializer.contract.table_layout import table_path
from materializer.job import start_map
from tests.helpers.slices import config, delta_map_rs, redis_map, slice_config


def format_config(
    tmp: Path,
    kafka: str,
    redis_url: str,
    topic: str,
    map_name: str,
    source: dict[str, Any],
    **extra: Any,
) -> AppConfig:
    """A one-map config whose source reads ``topic`` as ``source`` says."""
    doc = slice_config(tmp, kafka, redis_url, topic, map_name, **extra)
    doc["maps"][map_name]["source"] = {"topics": [topic], **source}
    return config(doc)


Letters = dict[tuple[int, int], tuple[bytes | None, bytes | None, dict[str, str]]]


def dead_letters(bootstrap: str, topic: str) -> Letters:
    """Every dead letter in the topic now, by source (partition, offset): (key, value, headers)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}"})
    out: Letters = {}
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, low)])
            while True:
                msg = consumer.poll(10.0)
                if msg is None:
                    raise AssertionError(f"{topic}/{partition} ended before offset {high}")
                if msg.error() is not None:
                    continue
                headers = {k: v.decode() for k, v in msg.headers() or []}
                source = (int(headers["x-source-partition"]), int(headers["x-source-offset"]))
                out[source] = (msg.key(), msg.value(), headers)
                if msg.offset() >= high - 1:
                    break
    finally:
        consumer.close()
    return out


def compact(value: Any) -> Any:
    """A value as the entity's compact JSON shows it: null fields left out at every depth."""
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [compact(v) for v in value]
    return value


def stores(cfg: AppConfig, client: Any, map_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The map as Redis holds it and as its Delta table holds it (read by delta-rs), compacted."""
    delta = delta_map_rs(Path(table_path(cfg, map_name)))
    return redis_map(client, map_name), compact(delta)


def letters_of(
    kafka: str, cfg: AppConfig, map_name: str
) -> dict[int, tuple[Any, Any, dict[str, str]]]:
    """The map's dead letters, by source offset."""
    return dead_letters(kafka, dead_letter_topic(cfg, map_name))


def fold_all(spark: Any, cfg: AppConfig, map_name: str) -> None:
    """Run ``map_name``'s queries over everything its topics hold now, then stop them."""
    queries = start_map(spark, cfg, map_name)
    try:
        queries.process_all_available()
    finally:
        queries.stop()
