"""Single-message transforms: a chain of every kind end to end against a plain-Python
reference, each kind's edge cases on real Spark frames, and config errors with key paths."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from materializer import record_columns as c
from materializer.config import parse_config
from materializer.config.names import dead_letter_topic
from materializer.contract.table_layout import table_path
from materializer.errors import ConfigError
from materializer.job import records, start_map
from materializer.source.transforms import apply_transforms
from materializer.testing import produce
from materializer.testing.reference import fold_latest
from tests.helpers.slices import (
    config,
    delta_map_rs,
    delta_map_spark,
    read_topic,
    redis_map,
    slice_config,
)

EVENT_SCHEMA = (
    "type STRING, user STRUCT<id: STRING, first: STRING, ssn: STRING, age: STRING,"
    " signup: STRING, address: STRUCT<city: STRING, zip: STRING>, junk: STRING>"
)
CHAIN: list[dict[str, Any]] = [
    {"type": "filter", "condition": "type <> 'heartbeat'"},
    {"type": "extract_field", "field": "user"},
    {"type": "rename", "fields": {"first": "name"}},
    {"type": "mask", "fields": ["ssn"]},
    {"type": "cast", "fields": {"age": "INT"}},
    {"type": "flatten"},  # Kafka Connect's default delimiter: "address.city"
    {
        "type": "timestamp_convert",
        "field": "signup",
        "target": "unix_millis",
        "format": "yyyy-MM-dd HH:mm:ss",
    },
    {"type": "drop", "fields": ["junk"]},
    {"type": "insert_field", "field": "source_offset", "from": "offset"},
    {"type": "insert_field", "field": "tier", "value": "gold"},
    {"type": "compute", "fields": {"name_upper": "upper(name)", "age_next": "age + 1"}},
    {"type": "value_to_key", "fields": ["id"]},
    {
        "type": "keep",
        "fields": [
            "id",
            "name",
            "ssn",
            "age",
            "address.city",
            "signup",
            "source_offset",
            "tier",
            "name_upper",
            "age_next",
        ],
    },
]
KEPT = CHAIN[-1]["fields"]


class CastFailed(Exception):
    """The reference's view of a record the pipeline dead-letters at stage ``transform``."""


def reference_chain(doc: dict[str, Any], offset: int) -> dict[str, Any] | None:
    """``CHAIN`` in plain Python: the transformed value, or None when filtered out."""
    if doc["type"] == "heartbeat":
        return None
    u = dict(doc["user"])
    u["name"] = u.pop("first", None)
    if u.get("ssn") is not None:
        u["ssn"] = ""
    if u.get("age") is not None:
        if not u["age"].isdigit():
            raise CastFailed
        u["age"] = int(u["age"])
    address = u.pop("address", None) or {}
    u["address.city"] = address.get("city")
    u["address.zip"] = address.get("zip")
    if u.get("signup") is not None:
        when = dt.datetime.strptime(u["signup"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)
        u["signup"] = int(when.timestamp() * 1000)
    u.pop("junk", None)
    u["source_offset"] = offset
    u["tier"] = "gold"
    u["name_upper"] = u["name"].upper() if u.get("name") is not None else None
    u["age_next"] = u["age"] + 1 if u.get("age") is not None else None
    return {k: u.get(k) for k in KEPT}


def chain_events(n: int, keys: int, seed: int) -> list[tuple[bytes | None, bytes | None]]:
    """Users under unrelated Kafka keys (value_to_key re-keys them), heartbeats that would
    overwrite them if the filter let them through, bad ages, tombstones keyed by id."""
    rng = random.Random(seed)
    out: list[tuple[bytes | None, bytes | None]] = []
    for i in range(n):
        uid = f"u{rng.randrange(keys)}"
        if rng.random() < 0.08:
            out.append((uid.encode(), None))
            continue
        user: dict[str, Any] = {
            "id": uid,
            "first": rng.choice(["ann", "bob", None]),
            "ssn": rng.choice([f"{rng.randrange(10**9):09d}", None]),
            "age": rng.choice([str(rng.randrange(90)), str(rng.randrange(90)), None, "abc"]),
            "signup": rng.choice(
                [f"2026-0{rng.randrange(1, 10)}-1{rng.randrange(10)} 0{rng.randrange(10)}:30:00"]
                * 3
                + [None]
            ),
            "address": rng.choice(
                [{"city": f"c{rng.randrange(5)}", "zip": "12345"}, {"zip": "999"}, None]
            ),
            "junk": "x" * rng.randrange(5),
        }
        kind = "heartbeat" if rng.random() < 0.15 else "user"
        out.append((f"k-{i}".encode(), orjson.dumps({"type": kind, "user": user})))
    return out


def test_every_transform_in_one_chain_matches_the_reference(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, "chain")
    doc["maps"]["chain"].update(
        {"key": "$kafka_key", "transforms": CHAIN, "source": {"topics": [topic]}}
    )
    doc["maps"]["chain"]["source"]["schema"] = EVENT_SCHEMA
    cfg = config(doc)
    produced = chain_events(500, 30, seed=7)
    positions = produce(kafka_bootstrap, topic, produced)
    queries = start_map(spark, cfg, "chain")
    try:
        queries.process_all_available()
    finally:
        queries.stop()

    transformed = []
    failed = {}
    for (partition, offset), (key, value) in zip(positions, produced, strict=True):
        if value is None:
            transformed.append((partition, offset, key, None))
            continue
        try:
            out = reference_chain(orjson.loads(value), offset)
        except CastFailed:
            failed[(partition, offset)] = (key, value)
            continue
        if out is not None:
            transformed.append((partition, offset, out["id"].encode(), orjson.dumps(out)))
    expected = fold_latest(transformed, "id", KEPT)
    assert failed, "the events must include ages that do not cast"
    assert any("address.city" in e for e in expected.values())

    table = Path(table_path(cfg, "chain"))
    assert redis_map(redis_client, "chain") == expected
    assert delta_map_rs(table) == expected
    assert delta_map_spark(spark, table) == expected

    letters = read_topic(kafka_bootstrap, dead_letter_topic(cfg, "chain"))
    assert len(letters) == len(failed)
    got = {}
    for m in letters:
        headers = dict(m.headers())
        assert headers["x-error-stage"] == b"transform"
        assert headers["x-error-message"].startswith(b"transforms.4: age: cannot cast '")
        got[(int(headers["x-source-partition"]), int(headers["x-source-offset"]))] = (
            m.key(),
            m.value(),
        )
    # The dead letter holds the record as read: its original key, not the value_to_key one.
    assert got == failed


# ---------------------------------------------------------------- each kind on a real frame


def _frame(spark: Any, schema: str, rows: list[tuple[Any, ...]]) -> Any:
    """Decoded records as the pipeline holds them: fields plus the internal columns."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(rows, schema)
    return df.withColumns(
        {
            c.VALUE: F.lit(b"{}"),
            c.KAFKA_KEY: F.lit(b"k"),
            c.TOPIC: F.lit("t"),
            c.PARTITION: F.lit(3),
            c.OFFSET: F.lit(41).cast("long"),
            c.TIMESTAMP: F.lit("2026-01-02 03:04:05").cast("timestamp"),
            c.ERROR_STAGE: F.lit(None).cast("string"),
            c.ERROR_MESSAGE: F.lit(None).cast("string"),
        }
    )


def _apply(df: Any, *transforms: dict[str, Any], key: str = "s") -> Any:
    doc = {"source": {"topics": ["t"]}, "key": key, "transforms": list(transforms)}
    return apply_transforms(df, parse_config({"maps": {"m": doc}}).maps["m"].transforms)


def _rows(df: Any) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in df.collect()]


def test_mask_gives_each_type_its_empty_value_and_keeps_nulls(spark):
    schema = (
        "s STRING, i INT, d DECIMAL(10,2), b BOOLEAN, bin BINARY, day DATE, ts TIMESTAMP,"
        " a ARRAY<INT>, m MAP<STRING, INT>, st STRUCT<x: STRING, y: DOUBLE>"
    )
    full = (
        "secret",
        7,
        None,
        True,
        b"\x01",
        dt.date(2026, 1, 2),
        dt.datetime(2026, 1, 2, 3, 4, 5),
        [1, 2],
        {"k": 1},
        ("p", 1.5),
    )
    df = _frame(spark, schema, [full])
    names = [f.name for f in df.schema.fields if not c.is_internal(f.name)]
    masked = _apply(df, {"type": "mask", "fields": names})
    assert masked.schema[names[0]].dataType == df.schema[names[0]].dataType
    [row] = _rows(masked.select(*names))
    assert row == {
        "s": "",
        "i": 0,
        "d": None,  # null stays null
        "b": False,
        "bin": bytearray(),
        "day": dt.date(1970, 1, 1),
        "ts": dt.datetime(1970, 1, 1, 0, 0),
        "a": [],
        "m": {},
        "st": {"x": "", "y": 0.0},
    }


def test_timestamp_convert_reads_strings_and_millis_and_writes_every_target(spark):
    df = _frame(
        spark,
        "s STRING, ms BIGINT, bad STRING",
        [("2026-03-04 05:06:07", 1_700_000_000_123, "not a time")],
    )
    fmt = "yyyy-MM-dd HH:mm:ss"
    out = _rows(
        _apply(
            df,
            {"type": "timestamp_convert", "field": "s", "target": "unix_millis", "format": fmt},
            {"type": "timestamp_convert", "field": "ms", "target": "string"},
        ).select("s", "ms")
    )
    assert out == [{"s": 1772600767000, "ms": "2023-11-14T22:13:20.123Z"}]
    as_date = _rows(
        _apply(df, {"type": "timestamp_convert", "field": "s", "target": "date", "format": fmt})
    )
    assert as_date[0]["s"] == dt.date(2026, 3, 4)
    as_ts = _rows(_apply(df, {"type": "timestamp_convert", "field": "ms"}))
    assert as_ts[0]["ms"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000)
    failed = _rows(_apply(df, {"type": "timestamp_convert", "field": "bad", "format": fmt}))
    assert failed[0][c.ERROR_STAGE] == "transform"
    assert failed[0][c.ERROR_MESSAGE] == (
        "transforms.0: bad: cannot read 'not a time' as a timestamp with format "
        "'yyyy-MM-dd HH:mm:ss'"
    )


def test_filter_passes_tombstones_and_failed_records(spark):
    from pyspark.sql import functions as F

    df = _frame(spark, "s STRING, n INT", [("keep", 1), ("drop", 2), ("tomb", 3), ("bad", 4)])
    df = df.withColumns(
        {
            c.VALUE: F.when(F.col("s") == "tomb", F.lit(None)).otherwise(F.col(c.VALUE)),
            c.ERROR_STAGE: F.when(F.col("s") == "bad", F.lit("decode")),
        }
    )
    kept = _apply(df, {"type": "filter", "condition": "n = 1"})
    assert sorted(r["s"] for r in _rows(kept)) == ["bad", "keep", "tomb"]


def test_flatten_rename_insert_and_value_to_key_with_several_fields(spark):
    df = _frame(
        spark, "s STRING, n INT, o STRUCT<a: STRUCT<b: INT>, c: STRING>", [("x", 1, ((2,), "z"))]
    )
    out = _apply(
        df,
        {"type": "flatten", "delimiter": "_"},
        {"type": "rename", "fields": {"o_a_b": "deep"}},
        {"type": "insert_field", "field": "where", "from": "partition"},
        {"type": "insert_field", "field": "when", "from": "timestamp"},
        {"type": "value_to_key", "fields": ["s", "n"]},
        key="$kafka_key",
    )
    [row] = _rows(out)
    assert {k: v for k, v in row.items() if not c.is_internal(k)} == {
        "s": "x",
        "n": 1,
        "deep": 2,
        "o_c": "z",
        "where": 3,
        "when": dt.datetime(2026, 1, 2, 3, 4, 5),
    }
    assert row[c.VALUE_KEY] == '{"s":"x","n":1}'
    assert row[c.KAFKA_KEY] == bytearray(b"k")


# ---------------------------------------------------------------- problems found at start


@pytest.mark.parametrize(
    ("transforms", "key", "problem"),
    [
        (
            [{"type": "rename", "fields": {"nme": "full"}}],
            "id",
            "maps.bad.transforms.0.fields.nme: no such field (fields: id, name, age, tags)",
        ),
        (
            [{"type": "cast", "fields": {"age": "INTEGR"}}],
            "id",
            "maps.bad.transforms.0.fields.age: cannot cast to 'INTEGR'",
        ),
        (
            [{"type": "compute", "fields": {"x": "age +* 1"}}],
            "id",
            "maps.bad.transforms.0.fields.x:",
        ),
        (
            [{"type": "filter", "condition": "age + 1"}],
            "id",
            "maps.bad.transforms.0.condition: must be a condition (true/false), not int",
        ),
        (
            [{"type": "extract_field", "field": "name"}],
            "id",
            "maps.bad.transforms.0.field: name is string, not a struct",
        ),
        (
            [{"type": "drop", "fields": ["age"]}, {"type": "filter", "condition": "age > 1"}],
            "id",
            "maps.bad.transforms.1:",
        ),
        (
            [{"type": "rename", "fields": {"id": "user_id"}}],
            "id",
            "maps.bad.key: no field 'id' (fields: user_id, name, age, tags)",
        ),
        (
            [{"type": "rename", "fields": {"name": "age"}}],
            "id",
            "maps.bad.transforms.0.fields.name: 'age' would name two fields",
        ),
        (
            [{"type": "timestamp_convert", "field": "tags"}],
            "id",
            "maps.bad.transforms.0.field: tags is array<string>; timestamp_convert reads",
        ),
    ],
)
def test_transform_problems_name_their_key_path_when_the_map_starts(
    spark, kafka_bootstrap, redis_url, tmp_path: Path, transforms, key, problem
):
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, "any-topic", "bad")
    doc["maps"]["bad"].update({"transforms": transforms, "key": key})
    with pytest.raises(ConfigError) as info:
        records(spark, config(doc), "bad")
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(problem)


def test_value_to_key_needs_the_kafka_key_as_the_map_key():
    doc = {
        "source": {"topics": ["t"]},
        "key": "id",
        "transforms": [{"type": "value_to_key", "fields": ["id"]}],
    }
    with pytest.raises(ConfigError) as info:
        parse_config({"maps": {"m": doc}})
    assert info.value.problems == [
        "maps.m.transforms.0: value_to_key sets the record key, "
        "which the map reads only with key: $kafka_key"
    ]
