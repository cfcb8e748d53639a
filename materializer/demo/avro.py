"""The demo's events as Avro in Confluent's wire format, through a real schema registry.

With ``materializer demo --schema-registry`` the two topics carry what most
production topics carry: values written by Confluent's own ``AvroSerializer``,
their schemas registered under ``<topic>-value`` (TopicNameStrategy), and the
maps read them with ``format: avro`` and ``schema_registry_url`` instead of
JSON with a declared schema. The Avro schemas say what the JSON schemas of
``domain`` say, field for field, so the maps hold the very same entities:
timestamps are ``timestamp-micros``, amounts ``decimal(10, 2)``, and every
field but the key may be null, which a profile change leaves its untouched
fields.

The schemas are registered before the pipeline starts, since a map reads its
reader schema (the subject's latest version) when it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

import orjson

from materializer.demo.domain import ORDERS, USER_EVENTS
from materializer.demo.events import DemoEvent

TIMESTAMP: dict[str, Any] = {"type": "long", "logicalType": "timestamp-micros"}
MONEY: dict[str, Any] = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}


def _record(name: str, key: str, fields: list[tuple[str, Any]]) -> dict[str, Any]:
    """An Avro record whose fields other than ``key`` are nullable, null by default."""
    return {
        "type": "record",
        "name": name,
        "namespace": "materializer.demo",
        "fields": [
            {"name": f, "type": t}
            if f == key
            else {"name": f, "type": ["null", t], "default": None}
            for f, t in fields
        ],
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    USER_EVENTS: _record(
        "UserEvent",
        "id",
        [
            ("id", "string"),
            ("name", "string"),
            ("email", "string"),
            ("country", "string"),
            ("plan", "string"),
            ("signed_up_at", TIMESTAMP),
            ("updated_at", TIMESTAMP),
        ],
    ),
    ORDERS: _record(
        "Order",
        "order_id",
        [
            ("order_id", "string"),
            ("user_id", "string"),
            ("amount", MONEY),
            ("status", "string"),
            ("ordered_at", TIMESTAMP),
        ],
    ),
}
"""The Avro schema of each topic's values, mirroring ``USER_SCHEMA`` and ``ORDER_SCHEMA``."""

_CONVERT: dict[str, Callable[[Any], Any]] = {
    "signed_up_at": datetime.fromisoformat,
    "updated_at": datetime.fromisoformat,
    "ordered_at": datetime.fromisoformat,
    "amount": lambda amount: Decimal(f"{amount:.2f}"),
}
"""The JSON event's values that Avro types differently: ISO times, float amounts."""


class AvroValues:
    """Encodes demo events with Confluent's ``AvroSerializer`` against one registry."""

    def __init__(self, registry_url: str) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroSerializer

        self.registry_url = registry_url
        self._client = SchemaRegistryClient({"url": registry_url})
        self._serializers = {
            topic: AvroSerializer(self._client, orjson.dumps(schema).decode())
            for topic, schema in SCHEMAS.items()
        }

    def register(self) -> dict[str, int]:
        """Register each topic's schema under its value subject; the schema ids."""
        from confluent_kafka.schema_registry import Schema

        return {
            topic: self._client.register_schema(
                f"{topic}-value", Schema(orjson.dumps(schema).decode(), "AVRO")
            )
            for topic, schema in SCHEMAS.items()
        }

    def __call__(self, event: DemoEvent) -> bytes | None:
        """The Kafka value of ``event``: the wire format, or ``None`` for a tombstone."""
        if event.value is None:
            return None
        from confluent_kafka.serialization import MessageField, SerializationContext

        record = {f: _CONVERT[f](v) if f in _CONVERT else v for f, v in event.value.items()}
        value: bytes = self._serializers[event.topic](
            record, SerializationContext(event.topic, MessageField.VALUE)
        )
        return value
