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
    assert "kafka.bootstrap_server: Extra inputs are not permitted" in problems
    assert "maps.users.fold.mode: Input should be 'latest'" in problems
    assert "maps.users.source.topics: List should have at least 1 item" in problems
    assert "maps.users.source.schema: Field required" in problems
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
