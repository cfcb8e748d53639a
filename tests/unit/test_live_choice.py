"""Which maps fold on the real-time path, and how its failures reach a map's lifecycle."""

from __future__ import annotations

from typing import Any

import pytest

from materializer.config import parse_config
from materializer.errors import ConfigError
from materializer.redis.functions import CopyLost
from materializer.run.lifecycle import FENCED_ERROR, RECOVERABLE
from materializer.run.live import group_with_room
from materializer.run.shared_fold import in_lifecycle_terms
from materializer.spark.slots import local_live_slots


def config(spark: dict[str, Any] | None = None, **maps: dict[str, Any]) -> Any:
    doc: dict[str, Any] = {"maps": {}}
    if spark is not None:
        doc["spark"] = spark
    for name, extra in maps.items():
        doc["maps"][name] = {
            "source": {"topics": [f"{name}-events"], "format": "json", "schema": "id STRING"},
            "key": "id",
            **extra,
        }
    return parse_config(doc)


FOLD_COUNT = {"mode": "aggregate", "aggregates": {"n": {"fn": "count"}}}


def test_the_run_path_is_real_time_unless_asked_otherwise() -> None:
    cfg = config(plain={}, own={"path": "microbatch"}, kept={"history": True})
    assert cfg.fold_path("plain") == "realtime"
    assert cfg.fold_path("own") == "microbatch"
    assert cfg.fold_path("kept") == "microbatch"
    everyone = config({"path": "microbatch"}, plain={}, own={"path": "realtime"})
    assert everyone.fold_path("plain") == "microbatch"
    assert everyone.fold_path("own") == "realtime"


def test_the_run_default_takes_the_maps_the_real_time_path_can_fold() -> None:
    cfg = config(
        None,
        latest={},
        merged={"fold": {"mode": "merge"}},
        counted={"fold": FOLD_COUNT},
        kept={"history": True},
        strict={"on_error": "fail"},
        opted_out={"path": "microbatch"},
    )
    paths = {name: cfg.fold_path(name) for name in cfg.maps}
    assert paths == {
        "latest": "realtime",
        "merged": "realtime",
        "counted": "realtime",
        "kept": "microbatch",
        "strict": "microbatch",
        "opted_out": "microbatch",
    }


def test_a_map_that_asks_for_what_the_real_time_path_cannot_fold_is_refused() -> None:
    with pytest.raises(ConfigError) as bad:
        config(m={"path": "realtime", "fold": FOLD_COUNT, "history": True})
    assert bad.value.problems == [
        "maps.m.path: realtime cannot fold this map: it writes no history (history: true)"
    ]


def test_a_map_on_a_redis_cluster_stays_on_micro_batches() -> None:
    with pytest.raises(ConfigError, match=r"maps.m.path: realtime folds into one Redis server"):
        parse_config(
            {
                "redis": {"cluster": True},
                "maps": {
                    "m": {
                        "source": {"topics": ["t"], "format": "json", "schema": "id STRING"},
                        "key": "id",
                        "path": "realtime",
                    }
                },
            }
        )
    cfg = parse_config(
        {**config({"path": "realtime"}, m={}).model_dump(), "redis": {"cluster": True}}
    )
    assert cfg.fold_path("m") == "microbatch"


def test_the_writers_failures_are_mended_as_the_micro_batch_folds_are() -> None:
    fenced = "MATERIALIZER_LIVE_MAP m : MATERIALIZER_FENCED epoch 5 is no longer the map's owner"
    assert in_lifecycle_terms(fenced).startswith(FENCED_ERROR)
    producer = (
        "Kafka did not commit a transaction: org.apache.kafka.common.errors.ProducerFencedException"
    )
    assert in_lifecycle_terms(producer).startswith(FENCED_ERROR)
    lost = "MATERIALIZER_LIVE_MAP m : MATERIALIZER_LOST this server has no marker of the map"
    assert in_lifecycle_terms(lost).startswith(f"{CopyLost.__module__}.{CopyLost.__name__}")
    away = "redis.clients.jedis.exceptions.JedisConnectionException: Unexpected end of stream."
    assert any(name in in_lifecycle_terms(away) for name in RECOVERABLE)
    other = "MATERIALIZER_LIVE_MAP m : ERR unknown function"
    assert in_lifecycle_terms(other) == other


def test_a_local_master_leaves_the_real_time_query_its_slots_beyond_the_cores() -> None:
    import os

    cores = os.cpu_count() or 1
    assert local_live_slots(f"local[{cores + 10}]") == 10
    assert local_live_slots("local[1]") == max(0, 1 - cores)
    assert local_live_slots("local") == 0
    assert local_live_slots("spark://host:7077") is None


def test_a_joining_map_goes_to_the_first_group_with_room_else_the_lowest_free_number() -> None:
    assert group_with_room({}, 8) == 0
    assert group_with_room({0: 7}, 8) == 0
    assert group_with_room({0: 8}, 8) == 1
    assert group_with_room({0: 8, 1: 3}, 8) == 1
    assert group_with_room({2: 1, 1: 8}, 8) == 2  # by number, not by age
    assert group_with_room({0: 8, 2: 8}, 8) == 1  # a group that went is numbered again
    assert group_with_room({0: 1, 1: 1}, 1) == 2


def test_maps_spark_decodes_in_python_stay_on_micro_batches() -> None:
    registry = {"topics": ["t"], "format": "avro", "schema_registry_url": "http://registry:8080"}
    protobuf = {**registry, "format": "protobuf", "message": "shop.Order"}
    avro_file = {"topics": ["t"], "format": "avro", "schema_file": "order.avsc"}
    doc = {
        "maps": {
            name: {"source": source, "key": "id"}
            for name, source in {"avro": registry, "proto": protobuf, "file": avro_file}.items()
        }
    }
    cfg = parse_config(doc)
    paths = {name: cfg.fold_path(name) for name in cfg.maps}
    assert paths == {"avro": "microbatch", "proto": "microbatch", "file": "realtime"}
    doc["maps"]["avro"]["path"] = "realtime"
    with pytest.raises(ConfigError) as bad:
        parse_config(doc)
    assert bad.value.problems == [
        "maps.avro.path: realtime cannot fold this map: it decodes avro in Python (mapInArrow), "
        "which Spark's Real-time Mode does not run (source.format)"
    ]
