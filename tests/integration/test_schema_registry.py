"""Avro in Confluent's wire format: records from Confluent's own serializer through a real
registry (Apicurio), and the faults of a registry of the tests' own (unknown ids, an
outage mid-stream)."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest
from confluent_kafka.schema_registry import (
    SchemaRegistryClient,
    topic_record_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from materializer.errors import SetupError
from materializer.job import records, start_map
from materializer.testing import free_port, produce
from materializer.testing.reference import fold_latest
from materializer.testing.registry import ApicurioRegistry, register, wire_value
from tests.helpers.formats import fold_all, format_config, letters_of, stores

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
# v2 drops the optional name; a v1 reader gives it its default (Avro schema resolution).
V2 = {**V1, "fields": [V1["fields"][0], V1["fields"][2]]}
V3 = {**V2, "fields": [*V2["fields"], {"name": "vip", "type": "boolean", "default": False}]}
FIELDS = ["id", "name", "age"]
Records = list[tuple[bytes | None, bytes | None]]
Doc = dict[str, Any] | None


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
        doc: dict[str, Any] = {"id": uid, "age": i}
        if schema is V1:
            doc["name"] = None if i % 5 == 0 else f"n{i}"
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
    with ApicurioRegistry() as registry:
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
            # A new version that drops a field, registered and used mid-stream, decodes
            # with no restart (a version that adds fields is test_schema_moves').
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
    assert any(d is not None and "name" not in d for d in docs)
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
    assert "No content with id/hash 'contentId-9999'" in messages[b"unknown"]
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


def test_avro_from_confluents_serializer_through_a_real_registry(
    spark, kafka_bootstrap, redis_url, redis_client, schema_registry_url, new_topic, tmp_path: Path
):
    """Confluent's AvroSerializer registers each writer schema with Apicurio and frames the
    records; the map decodes both versions, the second registered mid-stream."""
    topic = new_topic(2)
    registry = SchemaRegistryClient({"url": schema_registry_url})
    context = SerializationContext(topic, MessageField.VALUE)
    rng = random.Random(8)
    cfg = format_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        "real_avro",
        {"format": "avro", "schema_registry_url": schema_registry_url},
    )

    def users(schema: dict[str, Any], count: int, start: int) -> tuple[Records, list[Doc]]:
        serialize = AvroSerializer(registry, orjson.dumps(schema).decode())
        records, docs = _users(rng, count, start, schema, 0)
        framed = [
            (k, None if d is None else serialize(d, context))
            for (k, _), d in zip(records, docs, strict=True)
        ]
        return framed, docs

    first, first_docs = users(V1, 120, 0)
    positions = produce(kafka_bootstrap, topic, first)
    queries = start_map(spark, cfg, "real_avro")
    try:
        queries.process_all_available()
        second, second_docs = users(V2, 120, 1000)
        positions += produce(kafka_bootstrap, topic, second)
        queries.process_all_available()
    finally:
        queries.stop()
    ids = {bytes(v[1:5]) for _, v in first + second if v is not None}
    assert len(ids) == 2  # two writer schemas, as the registry numbered them

    as_json = [
        (p, o, k, None if d is None else orjson.dumps(d))
        for (p, o), (k, _), d in zip(
            positions, first + second, first_docs + second_docs, strict=True
        )
    ]
    reference = fold_latest(as_json, "id", FIELDS)
    redis, delta = stores(cfg, redis_client, "real_avro")
    assert redis == reference
    assert delta == reference
    assert letters_of(kafka_bootstrap, cfg, "real_avro") == {}


USER_JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "User",
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "name": {"type": ["string", "null"]},
        "age": {"type": "integer"},
    },
    "required": ["id", "age"],
}


def test_json_schema_wire_format_from_confluents_serializer(
    spark, kafka_bootstrap, redis_url, redis_client, schema_registry_url, new_topic, tmp_path: Path
):
    """``format: json_schema``: Confluent's JSONSerializer validates each record against the
    schema it registers with Apicurio and frames it; values without the frame are dead
    letters that say why."""
    topic = new_topic(2)
    serialize = JSONSerializer(
        orjson.dumps(USER_JSON_SCHEMA).decode(), SchemaRegistryClient({"url": schema_registry_url})
    )
    context = SerializationContext(topic, MessageField.VALUE)
    cfg = format_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        "json_wire",
        {"format": "json_schema", "schema": "id STRING, name STRING, age INT"},
    )
    records, docs = _users(random.Random(6), 150, 0, V1, 0)
    framed = [
        (k, None if d is None else serialize(d, context))
        for (k, _), d in zip(records, docs, strict=True)
    ]
    bad = [(b"plain", b'{"id": "plain", "age": 1}'), (b"short", b"\x00\x00\x01")]
    positions = produce(kafka_bootstrap, topic, framed + bad)
    fold_all(spark, cfg, "json_wire")

    as_json = [
        (p, o, k, None if d is None else orjson.dumps(d))
        for (p, o), (k, _), d in zip(positions, framed, docs, strict=False)
    ]
    reference = fold_latest(as_json, "id", FIELDS)
    redis, delta = stores(cfg, redis_client, "json_wire")
    assert redis == reference
    assert delta == reference
    letters = letters_of(kafka_bootstrap, cfg, "json_wire")
    messages = {key: headers["x-error-message"] for key, _, headers in letters.values()}
    assert messages == {
        b"plain": "not in Confluent's wire format: magic byte 0x7b, expected 0x00",
        b"short": "not in Confluent's wire format: 3 bytes, fewer than its 5-byte header",
    }


ADMIN = {
    "type": "record",
    "name": "Admin",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "age", "type": "int"},
        {"name": "role", "type": "string"},
    ],
}
GUEST = {
    "type": "record",
    "name": "Guest",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "string"}],
}


def test_one_topic_of_two_record_types_folds_into_one_map(
    spark, kafka_bootstrap, redis_url, redis_client, schema_registry_url, new_topic, tmp_path: Path
):
    """TopicRecordNameStrategy: users and admins in one topic, each under its own subject;
    the map's fields are both types' fields, a type's missing ones null; a third type is
    a dead letter that names it."""
    topic = new_topic(2)
    registry = SchemaRegistryClient({"url": schema_registry_url})
    context = SerializationContext(topic, MessageField.VALUE)
    strategy = {"subject.name.strategy": topic_record_subject_name_strategy}

    def serializer(schema: dict[str, Any]) -> AvroSerializer:
        return AvroSerializer(registry, orjson.dumps(schema).decode(), conf=strategy)

    as_user, as_admin, as_guest = serializer(V1), serializer(ADMIN), serializer(GUEST)
    rng = random.Random(12)
    records: Records = []
    docs: list[Doc] = []
    for i in range(200):
        uid = f"p{rng.randrange(25)}"
        if i % 3 == 0:
            doc: dict[str, Any] = {"id": uid, "age": i, "role": f"r{i}"}
            records.append((uid.encode(), as_admin(doc, context)))
        else:
            doc = {"id": uid, "name": f"n{i}", "age": i}
            records.append((uid.encode(), as_user(doc, context)))
        docs.append(doc)
    guest = (b"g1", as_guest({"id": "g1"}, context))
    cfg = format_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        "two_types",
        {
            "format": "avro",
            "schema_registry_url": schema_registry_url,
            "subject_name_strategy": "topic_record",
            "record_types": ["shop.User", "shop.Admin"],
        },
    )
    positions = produce(kafka_bootstrap, topic, [*records, guest])
    fold_all(spark, cfg, "two_types")

    as_json = [
        (p, o, k, orjson.dumps(d))
        for (p, o), (k, _), d in zip(positions, records, docs, strict=False)
    ]
    reference = fold_latest(as_json, "id", ["id", "name", "age", "role"])
    assert {"role"} < set().union(*reference.values()) and any(
        "name" in e for e in reference.values()
    )
    redis, delta = stores(cfg, redis_client, "two_types")
    assert redis == reference
    assert delta == reference
    letters = letters_of(kafka_bootstrap, cfg, "two_types")
    assert [(key, headers["x-error-message"]) for key, _, headers in letters.values()] == [
        (
            b"g1",
            f"record type shop.Guest (writer schema id {int.from_bytes(guest[1][1:5], 'big')}) "
            "is not one the map reads (record_types: shop.User, shop.Admin)",
        )
    ]
