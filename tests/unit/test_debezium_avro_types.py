"""Kafka Connect's and Debezium's Avro types (``connect.name``) as Spark types and values,
and the key text of an Avro key struct: checked against values computed here by hand."""

from __future__ import annotations

import datetime
from decimal import Decimal

import fastavro

from materializer.source.debezium.keys import key_text
from materializer.source.formats.avro_types import converter, spark_type

VALUE = {
    "type": "record",
    "name": "Value",
    "fields": [
        {
            "name": "born",
            "type": ["null", {"type": "int", "connect.name": "io.debezium.time.Date"}],
        },
        {
            "name": "seen",
            "type": {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"},
        },
        {"name": "at_ms", "type": {"type": "long", "connect.name": "io.debezium.time.Timestamp"}},
        {
            "name": "at_ns",
            "type": {"type": "long", "connect.name": "io.debezium.time.NanoTimestamp"},
        },
        {
            "name": "zoned",
            "type": {"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"},
        },
        {
            "name": "amount",
            "type": {
                "type": "record",
                "name": "VariableScaleDecimal",
                "namespace": "io.debezium.data",
                "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
                "connect.name": "io.debezium.data.VariableScaleDecimal",
            },
        },
        {
            "name": "price",
            "type": {
                "type": "bytes",
                "connect.name": "org.apache.kafka.connect.data.Decimal",
                "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
            },
        },
        {"name": "t", "type": {"type": "long", "connect.name": "io.debezium.time.MicroTime"}},
    ],
}


def test_connect_names_type_the_fields() -> None:
    fields = {f.name: f.dataType.simpleString() for f in spark_type(fastavro.parse_schema(VALUE))}
    assert fields == {
        "born": "date",
        "seen": "timestamp_ntz",
        "at_ms": "timestamp_ntz",
        "at_ns": "timestamp_ntz",
        "zoned": "timestamp",
        "amount": "decimal(38,10)",
        "price": "decimal(10,2)",
        "t": "bigint",
    }


def test_connect_values_become_the_fields_values() -> None:
    convert = converter(fastavro.parse_schema(VALUE))
    assert convert is not None
    epoch = datetime.datetime(1970, 1, 1)
    row = convert(
        {
            "born": -1,
            "seen": 1_704_164_645_123_456,
            "at_ms": -1_500,
            "at_ns": 1_000_000_999,
            "zoned": "2024-01-02T01:04:05.654321Z",
            "amount": {"scale": 3, "value": (-12345).to_bytes(2, "big", signed=True)},
            "price": (9999).to_bytes(2, "big", signed=True),
            "t": 47_655_500_000,
        }
    )
    assert row == {
        "born": datetime.date(1969, 12, 31),
        "seen": datetime.datetime(2024, 1, 2, 3, 4, 5, 123456),
        "at_ms": epoch - datetime.timedelta(milliseconds=1_500),
        "at_ns": epoch + datetime.timedelta(microseconds=1_000_000),
        "zoned": datetime.datetime(2024, 1, 2, 1, 4, 5, 654321, tzinfo=datetime.UTC),
        "amount": Decimal("-12.345"),
        "price": Decimal("99.99"),
        "t": 47_655_500_000,
    }


def test_key_texts() -> None:
    assert key_text({"id": 42}) == "42"
    assert key_text({"name": "ada"}) == "ada"
    assert key_text({"tenant": "acme", "id": 42}) == '{"id":"42","tenant":"acme"}'
    assert key_text({"ok": True, "id": 1}) == '{"id":"1","ok":"true"}'
    assert key_text(None) is None
    assert key_text({}) is None
