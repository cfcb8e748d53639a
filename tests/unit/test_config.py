from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from materializer.config import load_config, parse_config
from materializer.config.durations import processing_time
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
    doc = {"redis": {"url": "redis://localhost"}, "maps": {"users": MAP}}
    cfg = parse_config(doc)
    assert cfg.redis.url == "redis://elsewhere:6380/1"
    assert cfg.kafka.bootstrap_servers == "k1:9092,k2:9092"
    # The caller's document is left as it was: a template reused by several tests, say.
    assert doc == {"redis": {"url": "redis://localhost"}, "maps": {"users": MAP}}
    # An empty section still takes the override; an empty variable overrides nothing.
    assert parse_config({"redis": None, "maps": {}}).redis.url == "redis://elsewhere:6380/1"
    monkeypatch.setenv("MATERIALIZER_REDIS_URL", "")
    assert parse_config(doc).redis.url == "redis://localhost"


def test_trigger_intervals_are_durations_and_reach_spark_as_milliseconds():
    cfg = parse_config(
        {"spark": {"trigger_interval": "1.5 s"}, "delta": {"trigger_interval": 10}, "maps": {}}
    )
    assert cfg.spark.trigger_interval == timedelta(seconds=1.5)
    assert processing_time(cfg.spark.trigger_interval) == "1500 milliseconds"
    assert processing_time(cfg.delta.trigger_interval) == "10000 milliseconds"
    assert processing_time(parse_config({}).spark.trigger_interval) == "100 milliseconds"
    assert processing_time(timedelta(microseconds=300)) == "1 milliseconds"  # never 0 by rounding
    assert processing_time(timedelta(0)) == "0 milliseconds"
    with pytest.raises(ConfigError, match=r"spark.trigger_interval: must be 0 or more"):
        parse_config({"spark": {"trigger_interval": -5}})
    with pytest.raises(ConfigError) as bad:
        parse_config({"spark": {"trigger_interval": "soon"}})
    assert bad.value.problems == [
        'spark.trigger_interval: must be a duration such as "30 minutes", "500 ms", '
        '"1.5 hours" or a number of seconds (units: ms, s, m, h, d, or their words)'
    ]


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
    assert problems({"format": "json_schema"}) == [
        "maps.m.source: format json_schema needs schema (Spark SQL DDL of the values)"
    ]
    assert problems(
        {"format": "json_schema", "schema": "a INT", "schema_registry_url": "http://r"}
    ) == ["maps.m.source: schema_registry_url does not apply to format json_schema"]
    registry = {"format": "avro", "schema_registry_url": "http://r"}
    assert problems({**registry, "subject_name_strategy": "record"}) == [
        "maps.m.source: subject_name_strategy record needs record_types: the full names of "
        "the record types the topic carries"
    ]
    assert problems({**registry, "record_types": ["a.B"]}) == [
        "maps.m.source: record_types applies with subject_name_strategy record or topic_record only"
    ]
    assert problems(
        {
            "format": "protobuf",
            "schema_registry_url": "http://r",
            "subject_name_strategy": "topic_record",
        }
    ) == [
        "maps.m.source: subject_name_strategy topic_record needs record_types: the full names "
        "of the record types the topic carries"
    ]
    assert problems(
        {
            "format": "protobuf",
            "schema_registry_url": "http://r",
            "subject_name_strategy": "record",
            "record_types": ["shop.A"],
            "message": "shop.A",
        }
    ) == [
        "maps.m.source: message does not apply with subject_name_strategy record or "
        "topic_record: record_types names the messages"
    ]
    assert problems(
        {"format": "json_schema", "schema": "a INT", "subject_name_strategy": "record"}
    ) == [
        "maps.m.source: subject_name_strategy record or topic_record is for format avro or protobuf"
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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30 minutes", timedelta(minutes=30)),
        ("2 seconds", timedelta(seconds=2)),
        ("1 hour", timedelta(hours=1)),
        ("500 ms", timedelta(milliseconds=500)),
        ("7 days", timedelta(days=7)),
        ("1.5h", timedelta(minutes=90)),
        ("10 sec", timedelta(seconds=10)),
        ("3 min", timedelta(minutes=3)),
        ("1 d", timedelta(days=1)),
        (90, timedelta(seconds=90)),
        (0.25, timedelta(milliseconds=250)),
    ],
)
def test_durations_read_as_people_write_them(text, expected):
    cfg = parse_config({"maps": {"users": {**MAP, "ttl": {"redis": text}}}})
    ttl = cfg.maps["users"].ttl
    assert ttl is not None and ttl.redis == expected


def test_ttl_defaults_and_vacuum_retention_may_be_zero_or_off():
    ttl = parse_config({"maps": {"users": {**MAP, "ttl": {"delta": "30 days"}}}}).maps["users"].ttl
    assert ttl is not None
    assert (ttl.redis, ttl.delta) == (None, timedelta(days=30))
    assert ttl.cleanup_interval == timedelta(hours=1)
    assert ttl.vacuum_retention == timedelta(hours=168)
    for retention, expected in ((0, timedelta(0)), (None, None)):
        doc = {"delta": "1 day", "vacuum_retention": retention}
        ttl = parse_config({"maps": {"users": {**MAP, "ttl": doc}}}).maps["users"].ttl
        assert ttl is not None and ttl.vacuum_retention == expected
    assert parse_config({"maps": {"users": MAP}}).maps["users"].ttl is None


def test_deleted_retention_defaults_to_a_day_and_must_be_positive():
    fold = parse_config({"maps": {"users": MAP}}).maps["users"].fold
    assert fold.deleted_retention == timedelta(days=1)
    doc = {**MAP, "fold": {"deleted_retention": "10 minutes"}}
    assert parse_config({"maps": {"users": doc}}).maps["users"].fold.deleted_retention == (
        timedelta(minutes=10)
    )
    with pytest.raises(ConfigError) as info:
        parse_config({"maps": {"users": {**MAP, "fold": {"deleted_retention": "0 s"}}}})
    assert info.value.problems == ["maps.users.fold.deleted_retention: must be more than 0"]


def test_ttl_problems_are_named_by_their_key_paths():
    def problems(ttl):
        with pytest.raises(ConfigError) as info:
            parse_config({"maps": {"users": {**MAP, "ttl": ttl}}})
        return info.value.problems

    form = (
        'must be a duration such as "30 minutes", "500 ms", "1.5 hours" or a number of '
        "seconds (units: ms, s, m, h, d, or their words)"
    )
    assert problems({}) == [
        "maps.users.ttl: give redis, delta or both: how long an entity is kept there"
    ]
    assert problems({"cleanup_interval": "1 hour"}) == [
        "maps.users.ttl: give redis, delta or both: how long an entity is kept there"
    ]
    assert problems({"redis": "soon"}) == [f"maps.users.ttl.redis: {form}"]
    assert problems({"redis": "3 weeks"}) == [f"maps.users.ttl.redis: unknown unit 'weeks': {form}"]
    assert problems({"redis": "-1 s", "delta": True}) == [
        f"maps.users.ttl.redis: {form}",
        f"maps.users.ttl.delta: {form}",
    ]
    assert problems({"delta": 0, "cleanup_interval": "0 ms", "vacuum_retention": -1}) == [
        "maps.users.ttl.delta: must be more than 0",
        "maps.users.ttl.cleanup_interval: must be more than 0",
        "maps.users.ttl.vacuum_retention: must be 0 or more",
    ]
    assert problems({"redis": "1 h", "ttl": "1 h"}) == ["maps.users.ttl.ttl: unknown key"]


ENRICHMENT = {
    "source": {"topics": ["orders"]},
    "lookups": [{"map": "users", "key_field": "user_id"}],
    "output": {"topic": "orders.enriched"},
}


def test_an_enrichment_gets_defaults_and_its_miss_policies():
    cfg = parse_config({"maps": {"users": MAP}, "enrichments": {"orders": ENRICHMENT}})
    spec = cfg.enrichments["orders"]
    assert (spec.lookups_from, spec.output.key, spec.output.guarantee) == (
        "redis",
        "$kafka_key",
        "at_least_once",
    )
    assert spec.lookups[0].on_miss == "null"
    policies = [{**ENRICHMENT["lookups"][0], "on_miss": p} for p in ("drop", "dead_letter", "omit")]
    cfg = parse_config(
        {"maps": {"users": MAP}, "enrichments": {"orders": {**ENRICHMENT, "lookups": policies}}}
    )
    assert [lk.on_miss for lk in cfg.enrichments["orders"].lookups] == [
        "drop",
        "dead_letter",
        "omit",
    ]


def test_enrichment_problems_are_named_by_their_key_paths():
    lookups = [
        {"map": "users", "key_field": "user_id", "join": "inner", "on_miss": "dead_letter"},
        {"map": "ghosts", "key_field": "ghost_id", "on_miss": "maybe"},
    ]
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "maps": {"users": MAP},
                "enrichments": {
                    "orders": {
                        **ENRICHMENT,
                        "lookups": lookups,
                        "output": {"topic": "x", "guarantee": "twice"},
                    },
                },
            }
        )
    assert info.value.problems == [
        "enrichments.orders.lookups.0.on_miss: join inner drops an event whose lookup misses; "
        "dead_letter applies to left joins",
        "enrichments.orders.lookups.1.on_miss: must be one of null, omit, drop, dead_letter",
        "enrichments.orders.output.guarantee: must be one of at_least_once, exactly_once",
    ]


def test_enrichments_name_declared_maps_and_topics_of_their_own():
    with pytest.raises(ConfigError, match="enrichment name 'a b'"):
        parse_config({"maps": {"users": MAP}, "enrichments": {"a b": ENRICHMENT}})
    delta_nested = [
        {"map": "users", "key_field": "user_id", "alias": "user"},
        {"map": "users", "key_field": "user.referrer"},
    ]
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "maps": {"users": MAP},
                "enrichments": {
                    "users": {**ENRICHMENT, "output": {"topic": "orders"}},
                    "a": {**ENRICHMENT, "lookups": [{"map": "ghosts", "key_field": "g"}]},
                },
            }
        )
    assert info.value.problems == [
        "enrichments.a.lookups.0.map: no such map 'ghosts'",
        "enrichments.users: a map has this name (they share checkpoints and metrics)",
        "enrichments.users.output.topic: 'orders' is a source topic",
    ]
    with pytest.raises(ConfigError, match=r"lookups.1.key_field: with lookups_from delta"):
        parse_config(
            {
                "maps": {"users": MAP},
                "enrichments": {
                    "o": {**ENRICHMENT, "lookups": delta_nested, "lookups_from": "delta"}
                },
            }
        )
    with pytest.raises(ConfigError, match=r"enrichments.o.transforms: need source.schema"):
        parse_config(
            {
                "maps": {"users": MAP},
                "enrichments": {
                    "o": {**ENRICHMENT, "transforms": [{"type": "drop", "fields": ["a"]}]}
                },
            }
        )


def test_a_near_cache_cannot_front_a_map_whose_redis_keys_expire():
    doc = {
        "maps": {
            "users": {**MAP, "ttl": {"redis": "1 h"}},
            "orders": {**MAP, "ttl": {"delta": 60}},
        },
        "query": {"near_cache": {"users": {}, "orders": {}}},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert info.value.problems == [
        "query.near_cache.users: map users has ttl.redis, and the near cache would keep serving "
        "the keys Redis expired"
    ]


def test_a_redis_cluster_has_database_zero_only():
    assert parse_config({"redis": {"url": "redis://node:7000", "cluster": True}}).redis.cluster
    with pytest.raises(ConfigError) as info:
        parse_config({"redis": {"url": "redis://node:7000/2", "cluster": True}})
    assert info.value.problems == [
        "redis.url: a Redis Cluster has database 0 only, and the URL selects 2"
    ]


def test_subject_names_follow_confluents_strategies():
    from materializer.source.formats.registry import subject_name

    assert subject_name("topic", "users", "shop.User") == "users-value"
    assert subject_name("record", "users", "shop.User") == "shop.User"
    assert subject_name("topic_record", "users", "shop.User") == "users-shop.User"


def test_indexes_as_the_docs_write_them_and_their_problems_by_key_path():
    # docs/maps.md#indexes: a field's name alone is a hash index.
    docs = (Path(__file__).parents[2] / "docs" / "maps.md").read_text()
    section = docs.split("## Indexes", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    indexes = yaml.safe_load(section)["maps"]["orders"]["indexes"]
    cfg = parse_config({"maps": {"orders": {**MAP, "indexes": indexes}}})
    assert [(i.field, i.kind) for i in cfg.maps["orders"].indexes] == [
        ("status", "hash"),
        ("total", "sorted"),
    ]
    assert parse_config({"maps": {"users": MAP}}).maps["users"].indexes == []
    bad = {"indexes": ["city", {"field": "city", "kind": "sorted"}, {"field": "x", "kind": "tree"}]}
    with pytest.raises(ConfigError) as info:
        parse_config({"maps": {"users": {**MAP, **bad}}})
    problems = "\n".join(info.value.problems)
    assert "maps.users.indexes.2.kind: " in problems
    with pytest.raises(ConfigError) as info:
        parse_config({"maps": {"users": {**MAP, "indexes": ["city", "city"]}}})
    assert "maps.users.indexes: field 'city' is indexed twice" in "\n".join(info.value.problems)
    with pytest.raises(ConfigError) as info:
        parse_config({"maps": {"users": {**MAP, "indexes": [""]}}})
    assert "maps.users.indexes.0.field: " in "\n".join(info.value.problems)
