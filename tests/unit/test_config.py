from __future__ import annotations

from pathlib import Path

import pytest

from materializer.config import load_config, parse_config
from materializer.errors import ConfigError

MAP = {"source": {"topics": ["user-events"], "schema": "id STRING, name STRING"}, "key": "id"}


def test_minimal_config_gets_defaults():
    cfg = parse_config({"maps": {"users": MAP}})
    assert cfg.maps["users"].fold.mode == "latest"
    assert cfg.maps["users"].source.starting_offsets == "earliest"
    assert cfg.kafka.bootstrap_servers == "localhost:9092"


def test_every_problem_is_named_by_its_key_path():
    bad = {
        "kafka": {"bootstrap_server": "x"},
        "maps": {"users": {**MAP, "fold": {"mode": "sum"}, "source": {"topics": []}}},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(bad, "maps.yaml")
    problems = "\n".join(info.value.problems)
    assert "kafka.bootstrap_server: unknown key" in problems
    assert "maps.users.fold.mode: must be one of latest, merge, aggregate" in problems
    assert "maps.users.source.topics: List should have at least 1 item" in problems
    assert str(info.value).startswith("invalid configuration maps.yaml:")


def test_bad_map_name_and_unknown_map():
    with pytest.raises(ConfigError, match="map name 'a b'"):
        parse_config({"maps": {"a b": MAP}})
    cfg = parse_config({"maps": {"users": MAP}})
    with pytest.raises(ConfigError, match=r"maps.orders: no such map \(known: users\)"):
        cfg.map("orders")


def test_environment_overrides_connection_settings(monkeypatch):
    monkeypatch.setenv("MATERIALIZER_REDIS_URL", "redis://elsewhere:6380/1")
    monkeypatch.setenv("MATERIALIZER_KAFKA_BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    cfg = parse_config({"redis": {"url": "redis://localhost"}, "maps": {"users": MAP}})
    assert cfg.redis.url == "redis://elsewhere:6380/1"
    assert cfg.kafka.bootstrap_servers == "k1:9092,k2:9092"


def test_load_config_reports_unreadable_and_invalid_yaml(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("maps: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)


def test_format_options_are_checked_per_format():
    def problems(source):
        with pytest.raises(ConfigError) as info:
            parse_config({"maps": {"m": {"source": {"topics": ["t"], **source}, "key": "id"}}})
        return info.value.problems

    # json without a schema is valid: its fields are inferred per micro-batch.
    inferred = parse_config({"maps": {"m": {"source": {"topics": ["t"]}, "key": "id"}}})
    assert inferred.maps["m"].source.schema_ is None
    assert problems({"format": "avro"}) == [
        "maps.m.source: format avro needs exactly one of schema_file, schema_registry_url"
    ]
    assert problems({"format": "string", "schema": "a INT"}) == [
        "maps.m.source: schema does not apply to format string"
    ]
    assert problems({"format": "protobuf", "descriptor_file": "x.desc"}) == [
        "maps.m.source: format protobuf needs descriptor_file and message, or schema_registry_url"
    ]


def test_transforms_and_folds_report_their_own_key_paths():
    doc = {
        **MAP,
        "transforms": [
            {"type": "filter", "condition": "a > 1"},
            {"type": "rename"},
            {"type": "explode"},
            {"type": "insert_field", "field": "x", "value": 1, "from": "topic"},
        ],
        "fold": {"mode": "aggregate", "aggregates": {"total": {"fn": "sum"}}},
        "on_error": "ignore",
    }
    with pytest.raises(ConfigError) as info:
        parse_config({"maps": {"users": doc}})
    assert info.value.problems == [
        "maps.users.transforms.1.fields: required",
        "maps.users.transforms.2: unknown type 'explode': must be one of filter, rename, drop, "
        "keep, mask, cast, flatten, timestamp_convert, value_to_key, extract_field, "
        "insert_field, compute",
        "maps.users.transforms.3: give exactly one of value, from",
        "maps.users.fold.aggregates.total: sum needs field",
        "maps.users.on_error: must be one of dead_letter, fail, skip",
    ]


def test_maps_cannot_share_a_changelog_or_write_into_their_sources():
    def m(**extra):
        return {"source": {"topics": ["events"]}, "key": "id", **extra}

    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "maps": {
                    "a": m(changelog={"topic": "shared"}),
                    "b": m(changelog={"topic": "shared"}),
                    "c": m(changelog={"topic": "events"}, dead_letter={"topic": "events"}),
                }
            }
        )
    assert info.value.problems == [
        "maps.b.changelog.topic: 'shared' is already map a's changelog",
        "maps.c.changelog.topic: 'events' is a source topic",
        "maps.c.dead_letter.topic: 'events' is a source topic",
    ]
