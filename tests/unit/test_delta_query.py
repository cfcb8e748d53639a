"""The Delta query's bound on a batch of changes."""

from __future__ import annotations

import pytest

from materializer.config import parse_config
from materializer.delta.query import changes_per_batch
from materializer.errors import ConfigError

MAP = {"source": {"topics": ["t"], "format": "json", "schema": "id STRING"}, "key": "id"}


@pytest.mark.parametrize(
    ("delta", "spark", "expected"),
    [
        ({}, {}, 1_000_000),
        ({"max_changes_per_batch": 5000}, {}, 5000),
        ({}, {"max_offsets_per_trigger": 2000}, 2000),  # the run's bound is smaller
        ({"max_changes_per_batch": 300}, {"max_offsets_per_trigger": 2000}, 300),
    ],
)
def test_the_smaller_of_the_maps_bound_and_the_runs_wins(delta, spark, expected):
    config = parse_config({"maps": {"users": MAP}, "delta": delta, "spark": spark})
    assert changes_per_batch(config) == expected


def test_a_bound_of_zero_names_its_key():
    with pytest.raises(ConfigError, match="delta.max_changes_per_batch"):
        parse_config({"maps": {"users": MAP}, "delta": {"max_changes_per_batch": 0}})


def test_an_unknown_engine_names_its_key():
    with pytest.raises(ConfigError, match="delta.merge_engine"):
        parse_config({"maps": {"users": MAP}, "delta": {"merge_engine": "duckdb"}})
