"""Protobuf values end to end: from a descriptor set file, and in Confluent's wire format."""

from __future__ import annotations

import random
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc_tools
import orjson
from confluent_kafka.schema_registry import SchemaRegistryClient, record_subject_name_strategy
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from materializer.job import start_map
from materializer.testing import produce
from materializer.testing.reference import fold_latest
from materializer.testing.registry import register, serialized_descriptor, wire_value
from tests.helpers.formats import fold_all, format_config, letters_of, stores

ORDER_V1 = """
syntax = "proto3";
package shop.v1;

enum Status { STATUS_UNKNOWN = 0; PAID = 1; SHIPPED = 2; }
message Customer { string name = 1; Status tier = 2; }
message Order {
  string id = 1;
  int64 total = 2;
  optional int32 qty = 3;
  Status status = 4;
  repeated string tags = 5;
  Customer customer = 6;
  uint64 big = 7;
  double price = 8;
}
message Refund { string id = 1; int64 amount = 2; }
"""
# v3 drops a field, which a v1 reader reads as its default (a version that adds fields is
# test_schema_moves').
ORDER_V3 = ORDER_V1.replace("  double price = 8;\n", "  reserved 8;\n")
FIELDS = ["id", "total", "qty", "status", "tags", "customer", "big", "price"]
STATUS = ["STATUS_UNKNOWN", "PAID", "SHIPPED"]


def descriptor_set(tmp: Path, text: str, name: str = "shop.proto") -> bytes:
    """``protoc --descriptor_set_out --include_imports`` of ``text``, by grpc_tools."""
    folder = tmp / f"proto-{abs(hash(text))}"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    out = folder / "set.pb"
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{folder}",
            f"-I{well_known}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            name,
        ],
        check=True,
    )
    return out.read_bytes()


def classes(data: bytes) -> dict[str, Any]:
    """The generated classes of a descriptor set, by message name (independent of the decoder)."""
    pool = descriptor_pool.DescriptorPool()
    files = descriptor_pb2.FileDescriptorSet.FromString(data).file
    for file in files:
        pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"shop.v1.{name}"))
        for name in ("Order", "Refund")
    }


def orders(
    rng: random.Random,
    order_cls: Any,
    count: int,
    start: int,
    priced: bool = True,
) -> tuple[list[tuple[bytes, bytes | None]], list[dict[str, Any] | None]]:
    """Order messages (tombstones among them) and the entity each should fold to."""
    records: list[tuple[bytes, bytes | None]] = []
    expected: list[dict[str, Any] | None] = []
    for i in range(start, start + count):
        oid = f"o{rng.randrange(15)}"
        if rng.random() < 0.1:
            records.append((oid.encode(), None))
            expected.append(None)
            continue
        msg = order_cls(id=oid, total=i * 1000 if i % 4 else 0, status=i % 3)
        entity: dict[str, Any] = {
            "id": oid,
            "total": msg.total,  # no presence: 0 when unset
            "qty": None,  # optional: null when unset
            "status": STATUS[i % 3],
            "tags": [],
            "customer": None,  # a message: null when unset
            "big": 0,
            "price": 0.0,
        }
        if i % 2:
            msg.qty = i
            entity["qty"] = i
        if i % 3 == 0:
            msg.tags.extend([f"t{i}", "x"])
            entity["tags"] = [f"t{i}", "x"]
        if i % 5 == 0:
            msg.customer.name = f"c{i}"
            entity["customer"] = {"name": f"c{i}", "tier": "STATUS_UNKNOWN"}
        if i % 7 == 0:
            msg.big = 2**64 - 1 - i  # beyond a signed LONG: DECIMAL(20, 0) keeps it
            entity["big"] = 2**64 - 1 - i
        if priced:
            msg.price = i + 0.5
            entity["price"] = i + 0.5
        records.append((oid.encode(), msg.SerializeToString()))
        expected.append(entity)
    return records, expected


def _reference(
    positions: list[tuple[int, int]],
    records: list[tuple[bytes, bytes | None]],
    expected: list[dict[str, Any] | None],
) -> dict[str, dict[str, Any]]:
    """The reference fold of the entities as JSON; records expected to fail are skipped."""
    as_json = [
        (p, o, k, None if v is None else (orjson.dumps(e) if e is not None else b"not json"))
        for (p, o), (k, v), e in zip(positions, records, expected, strict=True)
    ]
    return fold_latest(as_json, "id", FIELDS)


def _numbers(entities: dict[str, Any]) -> dict[str, Any]:
    """Delta's DECIMAL(20, 0) values as the integers Redis's JSON holds."""
    return {
        k: {f: int(v) if isinstance(v, Decimal) else v for f, v in e.items()}
        for k, e in entities.items()
    }


def test_protobuf_from_a_descriptor_file(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    data = descriptor_set(tmp_path, ORDER_V1)
    desc = tmp_path / "shop.desc"
    desc.write_bytes(data)
    topic = new_topic(2)
    cfg = format_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        "proto_file",
        {"format": "protobuf", "descriptor_file": str(desc), "message": "shop.v1.Order"},
    )
    records, expected = orders(random.Random(9), classes(data)["Order"], 200, 0)
    junk = [(b"junk", b"\xff\xff\xff\xff")]
    records += junk
    expected.append(None)
    positions = produce(kafka_bootstrap, topic, records)
    fold_all(spark, cfg, "proto_file")

    reference = _reference(positions, records, expected)
    redis, delta = stores(cfg, redis_client, "proto_file")
    assert redis == reference
    assert _numbers(delta) == reference
    letters = letters_of(kafka_bootstrap, cfg, "proto_file")
    (where,) = [pos for pos, rec in zip(positions, records, strict=True) if rec in junk]
    assert list(letters) == [where]
    _, value, headers = letters[where]
    assert value == junk[0][1]
    assert headers["x-error-stage"] == "decode"
    assert headers["x-error-message"].startswith("value is not a protobuf shop.v1.Order")


def test_protobuf_wire_format_via_the_registry(
    spark, kafka_bootstrap, redis_url, redis_client, schema_registry_url, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    subject = f"{topic}-value"
    # v1 as .proto source (the map compiles it), v3 (without price) as a serialized
    # descriptor, as confluent-kafka's serializer registers it.
    v1 = register(schema_registry_url, subject, ORDER_V1, "PROTOBUF")
    v1_classes = classes(descriptor_set(tmp_path, ORDER_V1))
    v2_set = descriptor_set(tmp_path, ORDER_V3)
    v2_file = descriptor_pb2.FileDescriptorSet.FromString(v2_set).file[-1]
    cfg = format_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        "proto_reg",
        {
            "format": "protobuf",
            "schema_registry_url": schema_registry_url,
            "message": "shop.v1.Order",
        },
    )
    rng = random.Random(21)
    first, first_expected = orders(rng, v1_classes["Order"], 120, 0)
    # Order is the schema's second message: its indexes are [1].
    first = [(k, None if v is None else wire_value(v1, v, [1])) for k, v in first]
    positions = produce(kafka_bootstrap, topic, first)
    queries = start_map(spark, cfg, "proto_reg")
    try:
        queries.process_all_available()
        v2 = register(
            schema_registry_url,
            subject,
            serialized_descriptor(v2_file.SerializeToString()),
            "PROTOBUF",
        )
        second, second_expected = orders(rng, classes(v2_set)["Order"], 120, 1000, priced=False)
        second = [(k, None if v is None else wire_value(v2, v, [1])) for k, v in second]
        refund = v1_classes["Refund"](id="o1", amount=5).SerializeToString()
        bad = [
            (b"o1", wire_value(v2, refund, [2])),  # another message of the schema
            (b"unknown", wire_value(9999, b"", [0])),
            (b"magic", b"\x01" + bytes(8)),
        ]
        second += bad
        second_expected += [None] * len(bad)
        positions += produce(kafka_bootstrap, topic, second)
        queries.process_all_available()
    finally:
        queries.stop()

    records = first + second
    reference = _reference(positions, records, first_expected + second_expected)
    redis, delta = stores(cfg, redis_client, "proto_reg")
    assert redis == reference
    assert _numbers(delta) == reference

    letters = letters_of(kafka_bootstrap, cfg, "proto_reg")
    expected = {pos: rec for pos, rec in zip(positions, records, strict=True) if rec in bad}
    assert set(letters) == set(expected)
    messages = {}
    for pos, (key, value, headers) in letters.items():
        assert (key, value) == expected[pos]
        assert headers["x-error-stage"] == "decode"
        messages[key] = headers["x-error-message"]
    assert messages[b"o1"] == (
        f"record holds message shop.v1.Refund (schema id {v2}); the map reads shop.v1.Order"
    )
    assert messages[b"unknown"].startswith("writer schema id 9999:")
    assert messages[b"magic"].startswith("not in Confluent's wire format: magic byte 0x01")


def test_protobuf_from_confluents_serializer_through_a_real_registry(
    spark, kafka_bootstrap, redis_url, redis_client, schema_registry_url, new_topic, tmp_path: Path
):
    """Confluent's ProtobufSerializer registers the schema with Apicurio (a serialized
    descriptor) and frames each record with the message's indexes; the map decodes them."""
    topic = new_topic(2)
    order = classes(descriptor_set(tmp_path, ORDER_V1))["Order"]
    serialize = ProtobufSerializer(order, SchemaRegistryClient({"url": schema_registry_url}))
    context = SerializationContext(topic, MessageField.VALUE)
    cfg = format_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        "real_proto",
        {
            "format": "protobuf",
            "schema_registry_url": schema_registry_url,
            "message": "shop.v1.Order",
        },
    )
    records, expected = orders(random.Random(4), order, 150, 0)
    framed = [
        (k, None if v is None else serialize(order.FromString(v), context)) for k, v in records
    ]
    positions = produce(kafka_bootstrap, topic, framed)
    fold_all(spark, cfg, "real_proto")
    reference = _reference(positions, records, expected)
    redis, delta = stores(cfg, redis_client, "real_proto")
    assert redis == reference
    assert _numbers(delta) == reference
    assert letters_of(kafka_bootstrap, cfg, "real_proto") == {}


def test_one_topic_of_two_protobuf_messages_folds_into_one_map(
    spark, kafka_bootstrap, redis_url, redis_client, schema_registry_url, new_topic, tmp_path: Path
):
    """RecordNameStrategy: orders and refunds in one topic, each message under its own
    subject as Confluent's ProtobufSerializer registers it; the map's fields are both
    messages' fields, a message's missing ones null; a third message is a dead letter."""
    topic = new_topic(2)
    data = descriptor_set(tmp_path, ORDER_V1)
    found = classes(data)
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.Add(file)
    customer = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.v1.Customer"))
    registry = SchemaRegistryClient({"url": schema_registry_url})
    strategy = {"subject.name.strategy": record_subject_name_strategy}
    context = SerializationContext(topic, MessageField.VALUE)
    as_order = ProtobufSerializer(found["Order"], registry, conf=strategy)
    as_refund = ProtobufSerializer(found["Refund"], registry, conf=strategy)
    as_customer = ProtobufSerializer(customer, registry, conf=strategy)
    records, expected = orders(random.Random(8), found["Order"], 150, 0)
    framed: list[tuple[bytes, bytes | None]] = []
    for i, ((key, value), entity) in enumerate(zip(records, expected, strict=True)):
        if value is not None and i % 4 == 0:
            # A refund of the same order replaces it in the map: the latest record wins.
            framed.append((key, as_refund(found["Refund"](id=key.decode(), amount=i + 1), context)))
            expected[i] = {"id": key.decode(), "amount": i + 1}
        elif value is not None:
            framed.append((key, as_order(found["Order"].FromString(value), context)))
            assert entity is not None
            entity["amount"] = None
        else:
            framed.append((key, None))
    stranger = (b"c1", as_customer(customer(name="c1"), context))
    cfg = format_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        "proto_types",
        {
            "format": "protobuf",
            "schema_registry_url": schema_registry_url,
            "subject_name_strategy": "record",
            "record_types": ["shop.v1.Order", "shop.v1.Refund"],
        },
    )
    positions = produce(kafka_bootstrap, topic, [*framed, stranger])
    fold_all(spark, cfg, "proto_types")

    as_json = [
        (p, o, k, None if v is None else orjson.dumps(e))
        for (p, o), (k, v), e in zip(positions, framed, expected, strict=False)
    ]
    reference = fold_latest(as_json, "id", [*FIELDS, "amount"])
    assert any("amount" in e for e in reference.values())
    assert any("total" in e for e in reference.values())
    redis, delta = stores(cfg, redis_client, "proto_types")
    assert redis == reference
    assert _numbers(delta) == reference
    letters = letters_of(kafka_bootstrap, cfg, "proto_types")
    schema_id = int.from_bytes(stranger[1][1:5], "big")
    assert [(key, headers["x-error-message"]) for key, _, headers in letters.values()] == [
        (
            b"c1",
            f"record holds message shop.v1.Customer (schema id {schema_id}); "
            "the map reads shop.v1.Order, shop.v1.Refund",
        )
    ]
