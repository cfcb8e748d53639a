"""What a map of Debezium's change events may declare: the config refuses what would fold
its deletes or truncates wrong, naming the key path."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from materializer.config import MapConfig

SOURCE = {"topics": ["t"], "envelope": "debezium", "schema": "id INT, seen BIGINT"}


def config(**extra: object) -> MapConfig:
    return MapConfig.model_validate({"source": SOURCE, "key": "$kafka_key", **extra})


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"fold": {"mode": "aggregate", "aggregates": {"n": {"fn": "count"}}}}, "not an increment"),
        ({"fold": {"event_time": "seen"}}, "a column of the row"),
        ({"transforms": [{"type": "value_to_key", "fields": ["id"]}]}, "value_to_key re-keys"),
    ],
)
def test_refused(extra: dict, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        config(**extra)


def test_accepted() -> None:
    assert config(fold={"mode": "merge", "event_time": "source.ts_ms"}).fold.mode == "merge"
    assert config(fold={"event_time": "ts_ms"}).fold.event_time == "ts_ms"


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ({"format": "json", "schema": None}, "needs schema"),
        ({"format": "avro", "schema": None, "schema_file": "x.avsc"}, "needs schema_registry_url"),
        ({"format": "string", "schema": None}, "reads format json, json_schema or avro"),
    ],
)
def test_formats(source: dict, problem: str) -> None:
    doc = {k: v for k, v in {**SOURCE, **source}.items() if v is not None}
    with pytest.raises(ValidationError, match=problem):
        MapConfig.model_validate({"source": doc, "key": "$kafka_key"})
