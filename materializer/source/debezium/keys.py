"""Debezium's record key, the row's primary key as a struct, as the entity's key text.

A primary key of one column is that column's value as text (``42``, ``alice``), as a
lookup names the entity; one of several columns is a JSON object of the columns' values
as text, in the order of their names (``{"id":"42","tenant":"acme"}``). The same text
comes from the JSON converter (with or without its ``schema``/``payload`` wrapper) and
from the Avro one.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import orjson

from materializer import record_columns as c

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


KEY_FIELDS = f"{c.PREFIX}key_fields"
"""The key struct's fields as text, a column of their own: read once per record."""


def with_json_key(records: DataFrame) -> DataFrame:
    """``records`` with ``VALUE_KEY``, the key text of their JSON keys (null for a key that
    is not a JSON object)."""
    from pyspark.sql import functions as F

    # One parse of a key without the wrapper, two of one with it; a key in Confluent's
    # wire format (the JSON Schema converter's) after its 5-byte header.
    key = F.col(c.KAFKA_KEY)
    framed = F.substring(key, 1, 1) == F.unhex(F.lit("00"))
    text = F.when(framed, F.expr(f"substring(`{c.KAFKA_KEY}`, 6)")).otherwise(key)
    top = F.from_json(text.cast("string"), "map<string, string>")
    records = records.withColumn(KEY_FIELDS, top)
    payload = F.col(KEY_FIELDS).getItem("payload")
    wrapped = F.col(KEY_FIELDS).getItem("schema").isNotNull() & payload.isNotNull()
    inner = F.from_json(payload, "map<string, string>")
    records = records.withColumn(KEY_FIELDS, F.when(wrapped, inner).otherwise(F.col(KEY_FIELDS)))
    fields = F.col(KEY_FIELDS)
    by_name = F.map_from_entries(F.array_sort(F.map_entries(fields)))
    key = F.when(F.size(fields) == 1, F.element_at(F.map_values(fields), 1)).when(
        F.size(fields) > 1, F.to_json(by_name)
    )
    return records.withColumn(c.VALUE_KEY, key).drop(KEY_FIELDS)


def key_text(struct: dict[str, Any] | None) -> str | None:
    """The key text of a key struct decoded from Avro (the text ``with_json_key`` gives)."""
    if not isinstance(struct, dict) or not struct:
        return None
    texts = {name: _text(value) for name, value in struct.items()}
    if len(texts) == 1:
        (only,) = texts.values()
        return only
    return orjson.dumps(texts, option=orjson.OPT_SORT_KEYS).decode()


def _text(value: Any) -> str:
    """A value as Spark's JSON reader gives a JSON value read as text."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode()
    return str(value)
