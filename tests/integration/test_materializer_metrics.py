"""The materializer's Prometheus metrics, read back from the registry's scraped text."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from materializer import record_columns as c
from materializer.pipeline.job import start_map
from materializer.pipeline.listener import QueryListener, listen
from materializer.pipeline.metrics import BatchMetrics, observe_dead_letters, observe_fold_input
from materializer.testing import produce
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


# ---------------------------------------------------------------- observations, no Kafka


def _files(spark, folder: Path, rows: list[dict[str, Any]]) -> Any:
    folder.mkdir()
    (folder / "part-0.json").write_text("\n".join(json.dumps(r) for r in rows))
    frame = spark.readStream.schema("id STRING, bad BOOLEAN, ts TIMESTAMP").json(str(folder))
    return frame.withColumnRenamed("ts", c.TIMESTAMP)


def _run_once(frame: Any, name: str, checkpoint: Path) -> Any:
    query = (
        frame.writeStream.queryName(name)
        .format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def test_fold_and_dead_letter_observations_reach_the_metrics(
    spark, listening: Listening, tmp_path: Path
):
    map_name = f"obs.{uuid.uuid4().hex[:6]}"  # a map name may hold dots
    rows = [
        {"id": "a", "bad": False, "ts": "2024-05-01T10:00:00Z"},
        {"id": "b", "bad": True, "ts": "2024-05-01T10:00:07Z"},
        {"id": "c", "bad": False, "ts": "2024-05-01T10:00:05Z"},
        {"id": "d", "bad": True, "ts": "2024-05-01T09:00:00Z"},
        {"id": "e", "bad": True, "ts": None},
    ]
    newest = 1714557607.0  # 2024-05-01T10:00:07Z
    frame = _files(spark, tmp_path / "in", rows)
    before = time.time()
    fold = _run_once(observe_fold_input(frame), f"{map_name}.fold", tmp_path / "fold")
    letters = _run_once(
        observe_dead_letters(frame.where("bad")), f"{map_name}.dead_letter", tmp_path / "dl"
    )
    # What the projector reports from inside a batch:
    listening.metrics.rows_out(f"{map_name}.fold", 0, 3)
    samples = listening.scrape_after([fold, letters])
    after = time.time()

    assert value(samples, "materializer_rows_in_total", map=map_name, query="fold") == 5
    assert value(samples, "materializer_rows_out_total", map=map_name, query="fold") == 3
    # Rows in are what the source reports: here the file source already skips what the
    # filter drops; the Kafka source of a map reads every record (see the test below).
    read = letters.recentProgress[0]["numInputRows"]
    assert value(samples, "materializer_rows_in_total", map=map_name, query="dead_letter") == read
    assert value(samples, "materializer_rows_out_total", map=map_name, query="dead_letter") == 3
    assert value(samples, "materializer_dead_letters_total", map=map_name) == 3
    freshness = value(samples, "materializer_freshness_seconds", map=map_name)
    assert freshness is not None
    # The batch finished between `before` and `after`; its newest record is `newest`.
    assert before - newest - 1 <= freshness <= after - newest
    for query in ("fold", "dead_letter"):
        finished = value(
            samples, "materializer_last_batch_timestamp_seconds", map=map_name, query=query
        )
        assert finished is not None and before - 1 <= finished <= after
    # A file source has no partitions: no lag is made up for it.
    assert not [
        k for k in samples if k[0] == "materializer_lag_records" and ("map", map_name) in k[1]
    ]


# ---------------------------------------------------------------- a map on Kafka


def test_a_running_map_reports_rows_dead_letters_lag_and_freshness(
    spark, listening: Listening, kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    name = f"met{uuid.uuid4().hex[:8]}"
    cfg = config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name))
    good = [(f"u{i % 7}".encode(), orjson.dumps({"id": f"u{i % 7}", "age": i})) for i in range(30)]
    undecodable = [(f"x{i}".encode(), b"{not json") for i in range(4)]
    before = time.time()
    positions = produce(kafka_bootstrap, topic, good + undecodable)
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
    assert freshness is not None and 0 <= freshness <= after - before
    for query in ("fold", "delta"):
        finished = value(
            samples, "materializer_last_batch_timestamp_seconds", map=name, query=query
        )
        assert finished is not None and before <= finished <= after
