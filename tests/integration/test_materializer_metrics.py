"""The materializer's Prometheus metrics, read back from the registry's scraped text."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from materializer.job import start_map
from materializer.runtime.listener import QueryListener, listen
from materializer.runtime.metrics import BatchMetrics
from materializer.testing.waiting import wait_until
from tests.helpers.slices import config, slice_config

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(metrics: BatchMetrics) -> Samples:
    """Every sample of the registry, parsed from the text a Prometheus server would scrape."""
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


class Ended(QueryListener):
    """Which queries have ended, as the listener bus tells it.

    The bus hands every event to each listener in turn, in order; a query's
    end comes after all its progress. Once this listener, registered after the
    metrics, has seen a query end, the metrics have seen all of its batches.
    """

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def progress(self, progress: Any) -> None:
        pass

    def terminated(self, query_id: str, error: str | None) -> None:
        self.ids.add(query_id)


@dataclass
class Listening:
    metrics: BatchMetrics
    ended: Ended

    def scrape_after(self, queries: list[Any]) -> Samples:
        """The metrics once the stopped ``queries`` have had every batch reported."""
        for query in queries:
            query.stop()
        wait_until(
            "the queries' last events", lambda: {str(q.id) for q in queries} <= self.ended.ids
        )
        return scrape(self.metrics)


@pytest.fixture()
def listening(spark) -> Iterator[Listening]:
    metrics, ended = BatchMetrics(), Ended()
    remove = listen(spark, metrics, ended)
    yield Listening(metrics, ended)
    remove()


# ---------------------------------------------------------------- a map on Kafka


def produce_at(
    bootstrap: str, topic: str, records: list[tuple[tuple[bytes, bytes], int]]
) -> list[tuple[int, int]]:
    """Produce ``((key, value), timestamp_ms)`` records, each with its own Kafka timestamp;
    (partition, offset) of each."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    positions: list[tuple[int, int]] = []

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        positions.append((msg.partition(), msg.offset()))

    for (key, value_), timestamp_ms in records:
        producer.produce(topic, value_, key, timestamp=timestamp_ms, on_delivery=delivered)
    assert producer.flush(30) == 0
    return positions


def test_a_running_map_reports_rows_dead_letters_lag_and_freshness(
    spark, listening: Listening, kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    name = f"met{uuid.uuid4().hex[:8]}"
    cfg = config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name))
    good = [(f"u{i % 7}".encode(), orjson.dumps({"id": f"u{i % 7}", "age": i})) for i in range(30)]
    undecodable = [(f"x{i}".encode(), b"{not json") for i in range(4)]
    before = time.time()
    # The good records an hour old, the undecodable ones new: freshness is the age of the
    # newest record folded, not of the newest read.
    hour_ago_ms = int((before - 3600) * 1000)
    positions = produce_at(kafka_bootstrap, topic, [(r, hour_ago_ms) for r in good])
    positions += produce_at(kafka_bootstrap, topic, [(r, int(before * 1000)) for r in undecodable])
    keys = {k for k, _ in good}
    assert {p for p, _ in positions} == {0, 1}

    queries = start_map(spark, cfg, name, metrics=listening.metrics)
    try:
        queries.process_all_available()
    finally:
        queries.stop()
    samples = listening.scrape_after(queries.queries)
    after = time.time()

    def rows(direction: str, query: str) -> float | None:
        return value(samples, f"materializer_rows_{direction}_total", map=name, query=query)

    total = len(good) + len(undecodable)
    # Everything was in the topic before the fold started: its first batch took it all.
    assert [p["numInputRows"] for p in queries.fold.recentProgress if p["numInputRows"]] == [total]
    assert rows("in", "fold") == total  # every record read, undecodable ones too
    assert rows("out", "fold") == len(keys)  # one entity change per key of the batch
    assert rows("in", "delta") == rows("out", "delta") == len(keys)
    # The fold's one read of the topic sends the dead letters too: no query of their own.
    assert rows("in", "dead_letter") is None
    assert rows("out", "dead_letter") == len(undecodable)
    assert value(samples, "materializer_dead_letters_total", map=name) == len(undecodable)
    for partition in ("0", "1"):
        lag = value(samples, "materializer_lag_records", map=name, topic=topic, partition=partition)
        assert lag == 0
    freshness = value(samples, "materializer_freshness_seconds", map=name)
    assert freshness is not None and 3600 <= freshness <= 3600 + after - before
    for query in ("fold", "delta"):
        finished = value(
            samples, "materializer_last_batch_timestamp_seconds", map=name, query=query
        )
        assert finished is not None and before <= finished <= after
