"""Avro in Confluent's wire format, writer schemas from a real (test) schema registry."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest
from format_helpers import format_config, letters_of, stores

from materializer.errors import SetupError
from materializer.pipeline.job import records, start_map
from materializer.testing import free_port, produce
from materializer.testing.reference import fold_latest
from materializer.testing.schema_registry import SchemaRegistry, register, wire_value

pytestmark = pytest.mark.integration

V1 = {
    "type": "record",
    "name": "User",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "age", "type": "int"},
    ],
}
# v2 adds fields; a v1 reader skips them (Avro schema resolution).
V2 = {
    **V1,
    "fields": [
        *V1["fields"],
        {"name": "email", "type": ["null", "string"], "default": None},
        {"name": "plan", "type": "string", "default": "free"},
    ],
}
V3 = {**V2, "fields": [*V2["fields"], {"name": "vip", "type": "boolean", "default": False}]}
FIELDS = ["id", "name", "age"]


def _avro(schema: dict[str, Any], doc: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), doc)
    return out.getvalue()


def _users(
    rng: random.Random, count: int, start: int, schema: dict[str, Any], schema_id: int
) -> tuple[list[tuple[bytes | None, bytes | None]], list[dict[str, Any] | None]]:
    """Wire-format records of ``schema`` (tombstones among them) and the documents they hold."""
    records: list[tuple[bytes | None, bytes | None]] = []
    docs: list[dict[str, Any] | None] = []
    for i in range(start, start + count):
        uid = f"a{rng.randrange(15)}"
        if rng.random() < 0.1:
            records.append((uid.encode(), None))
            docs.append(None)
            continue
        doc: dict[str, Any] = {"id": uid, "name": None if i % 5 == 0 else f"n{i}", "age": i}
        if schema is not V1:
            doc["email"] = f"{uid}@example.org"
            doc["plan"] = "pro"
        if schema is V3:
            doc["vip"] = True
        records.append((uid.encode(), wire_value(schema_id, _avro(schema, doc))))
        docs.append(doc)
    return records, docs


def test_avro_wire_format_versions_unknown_ids_and_an_outage(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    subject = f"{topic}-value"
    rng = random.Random(3)
    # A registry of this test's own: it goes down mid-stream.
    with SchemaRegistry() as registry:
        v1 = register(registry.url, subject, orjson.dumps(V1).decode())
        cfg = format_config(
            tmp_path,
            kafka_bootstrap,
            redis_url,
            topic,
            "reg_avro",
            {"format": "avro", "schema_registry_url": registry.url},
        )
        first, first_docs = _users(rng, 120, 0, V1, v1)
        user = {"id": "x", "name": None, "age": 1}
        bad = [
            (b"magic", b'{"id": "x"}'),  # not the wire format
            (b"unknown", wire_value(9999, _avro(V1, user))),  # an id the registry lacks
            (b"short", wire_value(v1, b"\x02")),  # truncated Avro
        ]
        first += bad
        first_docs += [None] * len(bad)
        positions = produce(kafka_bootstrap, topic, first)
        queries = start_map(spark, cfg, "reg_avro")
        try:
            queries.process_all_available()
            # A new version registered and used mid-stream decodes with no restart.
            v2 = register(registry.url, subject, orjson.dumps(V2).decode())
            second, second_docs = _users(rng, 120, 1000, V2, v2)
            positions += produce(kafka_bootstrap, topic, second)
            queries.process_all_available()
            # The registry goes away: known ids still decode, an unseen one is a dead letter.
            v3 = register(registry.url, subject, orjson.dumps(V3).decode())
            registry.stop()
            third, third_docs = _users(rng, 40, 2000, V1, v1)
            outage = [(b"a1", wire_value(v3, _avro(V3, {**user, "id": "a1", "vip": True})))]
            third += outage
            third_docs.append(None)
            positions += produce(kafka_bootstrap, topic, third)
            queries.process_all_available()
        finally:
            queries.stop()

    produced = first + second + third
    docs = first_docs + second_docs + third_docs
    as_json = [
        (p, o, k, None if v is None else (orjson.dumps(d) if d is not None else b"not json"))
        for (p, o), (k, v), d in zip(positions, produced, docs, strict=True)
    ]
    reference = fold_latest(as_json, "id", FIELDS)
    assert any(d is not None and "email" in d for d in docs)
    redis, delta = stores(cfg, redis_client, "reg_avro")
    assert redis == reference
    assert delta == reference

    letters = letters_of(kafka_bootstrap, cfg, "reg_avro")
    failing = bad + outage
    expected = {pos: rec for pos, rec in zip(positions, produced, strict=True) if rec in failing}
    assert set(letters) == set(expected)
    messages = {}
    for pos, (key, value, headers) in letters.items():
        assert (key, value) == expected[pos]
        assert headers["x-error-stage"] == "decode"
        messages[key] = headers["x-error-message"]
    assert messages[b"magic"] == "not in Confluent's wire format: magic byte 0x7b, expected 0x00"
    assert messages[b"unknown"].startswith("writer schema id 9999: /schemas/ids/9999:")
    assert "Schema not found" in messages[b"unknown"]
    assert messages[b"short"].startswith(f"not Avro of writer schema id {v1}")
    assert messages[b"a1"].startswith(f"writer schema id {v3}: schema registry")
    assert "unreachable" in messages[b"a1"]


def test_a_registry_unreachable_at_start_stops_the_map_with_its_key(
    spark, kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    topic = new_topic()
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = format_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        "no_registry",
        {"format": "avro", "schema_registry_url": dead},
    )
    with pytest.raises(
        SetupError, match=r"^source\.schema_registry_url: schema registry .* unreachable"
    ):
        records(spark, cfg, "no_registry")
