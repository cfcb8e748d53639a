"""The stateful fold modes end to end: merge and aggregate, state carried across batches."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from materializer.contract.table_layout import table_path
from materializer.job import start_map
from materializer.testing import produce
from materializer.testing.reference import fold_aggregate, fold_merge, json_merge_patch
from tests.helpers.slices import config, delta_map_rs, delta_map_spark, redis_map, slice_config

Records = list[tuple[bytes | None, bytes | None]]

MERGE_SCHEMA = (
    "id STRING, name STRING, age INT, tags ARRAY<STRING>,"
    " address STRUCT<city: STRING, zip: STRING>, score DOUBLE"
)
MERGE_FIELDS = ["id", "name", "age", "tags", "address", "score"]

AGG_SCHEMA = "id STRING, kind STRING, amount INT, price DOUBLE, label STRING, tags ARRAY<STRING>"
AGGREGATES: dict[str, tuple[str, str | None]] = {
    "events": ("count", None),
    "priced": ("count", "price"),
    "total": ("sum", "amount"),
    "spent": ("sum", "price"),
    "low": ("min", "amount"),
    "high": ("max", "label"),
    "first_label": ("first", "label"),
    "last_tags": ("last", "tags"),
    "who": ("last", "id"),
}


def _without_nulls(value: Any) -> Any:
    """A Delta row as the compact JSON shows it: null struct fields left out, at every depth."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _run_two_waves(
    spark: Any,
    cfg: Any,
    map_name: str,
    kafka: str,
    topic: str,
    first: Records,
    second: Records,
    restart: bool = False,
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Fold ``first``, then ``second`` in later batches; the produced events, positioned.

    With ``restart`` the second wave is folded by a new run of the map, which
    must take its state up from the checkpoint.
    """
    positions = produce(kafka, topic, first)
    queries = start_map(spark, cfg, map_name)
    try:
        queries.process_all_available()
        if restart:
            queries.stop()
            queries = start_map(spark, cfg, map_name)
        positions += produce(kafka, topic, second)
        queries.process_all_available()
    finally:
        queries.stop()
    records = first + second
    return [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]


def _assert_stores_match(spark: Any, redis_client: Any, cfg: Any, map_name: str, expected: Any):
    table = Path(table_path(cfg, map_name))
    assert redis_map(redis_client, map_name) == expected
    assert _without_nulls(delta_map_rs(table)) == expected
    assert _without_nulls(delta_map_spark(spark, table)) == expected


# RFC 7386, Appendix A: (original, patch, result).
RFC_7386_EXAMPLES = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("original", "patch", "result"), RFC_7386_EXAMPLES)
def test_reference_merge_patch_follows_rfc_7386(original: Any, patch: Any, result: Any):
    assert json_merge_patch(original, patch) == result


def merge_patches(n: int, keys: int, seed: int) -> Records:
    """Partial documents over ``keys`` ids: nested objects, explicit nulls, tombstones."""
    rng = random.Random(seed)
    out: Records = []
    for i in range(n):
        uid = f"m{rng.randrange(keys)}"
        if rng.random() < 0.07:
            out.append((uid.encode(), None))
            continue
        doc: dict[str, Any] = {"id": uid}
        if rng.random() < 0.5:
            doc["name"] = None if rng.random() < 0.2 else f"name-{i}"
        if rng.random() < 0.4:
            doc["age"] = None if rng.random() < 0.2 else rng.randrange(100)
        if rng.random() < 0.3:
            doc["tags"] = [f"t{rng.randrange(5)}" for _ in range(rng.randrange(3))]
        if rng.random() < 0.5:
            choice = rng.randrange(5)
            doc["address"] = [
                {"city": f"c{rng.randrange(9)}"},
                {"zip": f"{rng.randrange(10000):05d}"},
                {"zip": None},
                {"city": f"c{rng.randrange(9)}", "zip": None},
                None,
            ][choice]
        if rng.random() < 0.3:
            doc["score"] = None if rng.random() < 0.2 else rng.randrange(400) / 4
        out.append((uid.encode(), orjson.dumps(doc)))
    return out


def test_merge_folds_json_patches_across_batches(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    doc = slice_config(
        tmp_path, kafka_bootstrap, redis_url, topic, map_name="merged", on_error="skip"
    )
    doc["maps"]["merged"]["source"]["schema"] = MERGE_SCHEMA
    doc["maps"]["merged"]["fold"] = {"mode": "merge"}
    cfg = config(doc)
    first = merge_patches(260, 30, seed=11)
    # The second wave deletes two live keys, then patches one of them anew.
    second = merge_patches(140, 30, seed=12) + [
        (b"m1", None),
        (b"m2", None),
        (b"m2", orjson.dumps({"id": "m2", "address": {"city": "again", "zip": None}})),
    ]
    events = _run_two_waves(spark, cfg, "merged", kafka_bootstrap, topic, first, second)

    expected = fold_merge(events, "id", MERGE_FIELDS)
    assert "m1" not in expected
    assert expected["m2"] == {"id": "m2", "address": {"city": "again"}}
    # The data exercise what they should: nested merges and removed members.
    assert any(e.get("address", {}).keys() == {"city", "zip"} for e in expected.values())
    assert any("name" not in e for e in expected.values())
    _assert_stores_match(spark, redis_client, cfg, "merged", expected)


def aggregate_events(n: int, keys: int, seed: int) -> Records:
    """Purchases over ``keys`` ids with null fields, ``close`` events and tombstones."""
    rng = random.Random(seed)
    out: Records = []
    for _ in range(n):
        uid = f"a{rng.randrange(keys)}"
        if rng.random() < 0.05:
            out.append((uid.encode(), None))
            continue
        doc: dict[str, Any] = {"id": uid, "kind": "close" if rng.random() < 0.05 else "buy"}
        if rng.random() < 0.8:
            doc["amount"] = rng.randrange(-50, 1000)
        if rng.random() < 0.6:
            doc["price"] = rng.randrange(4000) / 4
        if rng.random() < 0.7:
            doc["label"] = f"l{rng.randrange(50):02d}"
        if rng.random() < 0.3:
            doc["tags"] = [f"t{rng.randrange(5)}" for _ in range(rng.randrange(3))]
        out.append((uid.encode(), orjson.dumps(doc)))
    return out


def test_aggregate_folds_declared_aggregates_across_batches(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    aggregates = {name: {"fn": fn, "field": field} for name, (fn, field) in AGGREGATES.items()}
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name="agg", on_error="skip")
    doc["maps"]["agg"]["source"]["schema"] = AGG_SCHEMA
    doc["maps"]["agg"]["fold"] = {
        "mode": "aggregate",
        "aggregates": aggregates,
        "delete_when": "kind = 'close'",
    }
    cfg = config(doc)
    first = aggregate_events(260, 30, seed=21)
    # A close, then a fresh start for the same key: counts start from zero again.
    restart = {"id": "a3", "kind": "buy", "amount": 7, "label": "new"}
    second = aggregate_events(140, 30, seed=22) + [
        (b"a3", orjson.dumps({"id": "a3", "kind": "close"})),
        (b"a3", orjson.dumps(restart)),
        (b"a4", None),
    ]
    events = _run_two_waves(spark, cfg, "agg", kafka_bootstrap, topic, first, second, restart=True)

    expected = fold_aggregate(events, "id", AGGREGATES, deletes=lambda d: d.get("kind") == "close")
    assert "a4" not in expected
    assert expected["a3"] == {
        "events": 1,
        "priced": 0,
        "total": 7,
        "low": 7,
        "high": "new",
        "first_label": "new",
        "who": "a3",
    }
    assert max(e["events"] for e in expected.values()) > 10
    _assert_stores_match(spark, redis_client, cfg, "agg", expected)


def _merge_plan(spark, kafka_bootstrap, redis_url, new_topic, tmp_path: Path):
    """A ``merge`` map's events and their plan as Spark's optimizer leaves it."""
    from materializer.job import records
    from materializer.redis.functions import FoldTarget
    from materializer.redis.sink import RedisFold

    topic = new_topic(1)
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name="parsed")
    doc["maps"]["parsed"]["source"]["schema"] = MERGE_SCHEMA
    doc["maps"]["parsed"]["fold"] = {"mode": "merge"}
    cfg = config(doc)
    target = FoldTarget(
        redis=cfg.redis,
        map_name="parsed",
        changelog_topic="parsed.changelog",
        producer=(),
        dead_letter_topic=None,
        ttl_ms=None,
        changes_max_len=1000,
        deleted_retention_ms=1000,
    )
    fold = RedisFold(target, cfg.map("parsed").fold)
    events = fold.events(records(spark, cfg, "parsed"))
    # A streaming plan runs only in a query: Spark's optimizer applied to it directly.
    analyzed = events._jdf.queryExecution().analyzed()
    plan = spark._jsparkSession.sessionState().optimizer().execute(analyzed).toString()
    return events, plan


def test_merge_parses_each_raw_object_once_per_record(
    spark, kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    """The explicit-null search reads the member names of the root and of ``address``;
    each is computed once per record, not once per field that asks (several times the
    fold's own cost: docs/decisions/0015-merge-null-search-once-per-object.md)."""
    events, plan = _merge_plan(spark, kafka_bootstrap, redis_url, new_topic, tmp_path)
    assert plan.count("jsonObjectKeys(") == 2  # json_object_keys, as Spark plans it
    assert not [n for n in events.columns if "members" in n]  # the shared columns are gone


def test_merge_plan_holds_nothing_of_the_batch(
    spark, kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    """The batch's timestamp in ``merge``'s order is put in by the fold, not by the plan:
    Spark would put a batch's ``current_timestamp()`` in as a literal after optimising,
    into generated code then compiled again every batch."""
    events, _ = _merge_plan(spark, kafka_bootstrap, redis_url, new_topic, tmp_path)
    # As analysed: the optimiser would replace a current_timestamp() with this moment.
    plan = events._jdf.queryExecution().analyzed().toString()
    assert "__order" in plan
    assert "current_timestamp" not in plan.lower()
