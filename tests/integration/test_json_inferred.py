"""JSON without a declared schema: fields typed per batch, new ones added mid-stream."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from materializer.contract.table_layout import table_path
from materializer.errors import ConfigError
from materializer.job import records, start_map
from materializer.testing import produce
from materializer.testing.reference import fold_latest
from tests.helpers.formats import format_config, letters_of, stores

Records = list[tuple[bytes | None, bytes | None]]


def _events(rng: random.Random, count: int, start: int, with_email: bool) -> Records:
    """Heterogeneous user events: fields come and go; explicit nulls; tombstones."""
    out: Records = []
    for i in range(start, start + count):
        uid = f"u{rng.randrange(12)}"
        if rng.random() < 0.08:
            out.append((uid.encode(), None))
            continue
        doc: dict[str, object] = {"id": uid}
        if rng.random() < 0.7:
            doc["name"] = f"n{i}"
        if rng.random() < 0.5:
            doc["age"] = i
        if rng.random() < 0.3:
            doc["name"] = None  # an explicit null: left out, as in the compact JSON
        if rng.random() < 0.4:
            doc["tags"] = [f"t{i % 3}", "x"]
        if rng.random() < 0.3:
            doc["address"] = {"city": f"c{i % 4}", "zip": f"{i:05d}"}
        if rng.random() < 0.3:
            doc["score"] = i + 0.25
        if with_email and rng.random() < 0.6:
            doc["email"] = f"{uid}@example.org"
        out.append((uid.encode(), orjson.dumps(doc)))
    return out


def test_inferred_json_gains_fields_mid_stream(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    from deltalake import DeltaTable

    topic = new_topic(2)
    cfg = format_config(tmp_path, kafka_bootstrap, redis_url, topic, "inferred", {"format": "json"})
    rng = random.Random(11)
    first = _events(rng, 150, 0, with_email=False)
    bad = [(b"bad", b"{not json"), (b"arr", b"[1, 2]"), (b"num", b"42")]
    first += bad
    second = _events(rng, 150, 1000, with_email=True)
    table = Path(table_path(cfg, "inferred"))

    positions = produce(kafka_bootstrap, topic, first)
    queries = start_map(spark, cfg, "inferred")
    try:
        queries.process_all_available()
        columns = set(DeltaTable(str(table)).to_pyarrow_table().schema.names)
        assert "email" not in columns and {"_key", "id", "name", "age", "tags"} <= columns

        # The new field arrives after the table exists: a column is added, no restart.
        positions += produce(kafka_bootstrap, topic, second)
        queries.process_all_available()
    finally:
        queries.stop()

    events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, first + second, strict=True)]
    fields = ["id", "name", "age", "tags", "address", "score", "email"]
    expected = fold_latest(events, "id", fields)
    assert any("email" in e for e in expected.values())
    redis, delta = stores(cfg, redis_client, "inferred")
    assert redis == expected
    assert delta == expected

    # Integers stay LONG, fractions DOUBLE, objects STRUCT: the table is typed.
    schema = DeltaTable(str(table)).to_pyarrow_table().schema
    assert str(schema.field("age").type) == "int64"
    assert str(schema.field("score").type) == "double"
    assert str(schema.field("address").type) == "struct<city: string, zip: string>"
    assert str(schema.field("email").type) == "string"

    letters = letters_of(kafka_bootstrap, cfg, "inferred")
    assert set(letters) == {pos for pos, rec in zip(positions, first, strict=False) if rec in bad}
    messages = sorted(h["x-error-message"] for _, _, h in letters.values())
    assert messages == [
        "value is JSON but not a JSON object",
        "value is JSON but not a JSON object",
        "value is not JSON",
    ]
    assert {h["x-error-stage"] for _, _, h in letters.values()} == {"decode"}


def test_inferred_json_refuses_what_needs_declared_fields(
    spark, kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    topic = new_topic()
    cfg = format_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        "agg",
        {"format": "json"},
        fold={"mode": "aggregate", "aggregates": {"n": {"fn": "count"}}, "delete_when": "gone"},
    )
    with pytest.raises(ConfigError) as info:
        records(spark, cfg, "agg")
    assert [p.split(":")[0] for p in info.value.problems] == [
        "maps.agg.fold.mode",
        "maps.agg.fold.delete_when",
    ]
    assert info.value.problems[0].startswith("maps.agg.fold.mode: aggregate needs source.schema")
    merge = format_config(
        tmp_path, kafka_bootstrap, redis_url, topic, "m", {"format": "json"}, fold={"mode": "merge"}
    )
    with pytest.raises(ConfigError, match="fold.mode: merge needs source.schema"):
        records(spark, merge, "m")
