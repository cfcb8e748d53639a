"""Raw Kafka records to decoded records, with every failure kept as data.

Decoding never drops or raises: a record either yields the entity's fields (as
top-level columns) or carries ``__error_stage`` / ``__error_message`` and goes
the way of the map's error policy. A tombstone (null value) decodes to null
fields and no error. Each format lives in ``source.formats``:

======================================  =====================================================
``json`` with ``schema``                ``formats.json``: ``from_json`` in the JVM
``json_schema``                         ``formats.json``: the same, after the wire format's header
``json`` without ``schema``             ``formats.json_inferred``: a VARIANT document, typed
                                        per batch by ``fold.entity_types``
``avro`` with ``schema_file``           ``formats.avro_file``: ``from_avro`` in the JVM
``avro`` with ``schema_registry_url``   ``formats.avro_registry``: fastavro on the executors
``protobuf`` with ``descriptor_file``   ``formats.protobuf_file``: protobuf on the executors
``protobuf`` with registry              ``formats.protobuf_registry``: the same, wire format
``string``                              the value as one string field
======================================  =====================================================

With ``source.envelope: debezium`` the format decodes Debezium's change event, and
``source.debezium`` says what it means (its row as the fields, deletes, tombstones).

Problems found while building the decoder (an unreadable schema file, a
registry that cannot be reached) are raised when the map starts, as
ConfigError or SetupError naming the ``source`` key at fault.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.config import MapConfig
from materializer.errors import ConfigError
from materializer.source.debezium.envelope import decode_debezium
from materializer.source.formats.avro_file import avro_schema, decode_avro_file
from materializer.source.formats.avro_registry import decode_avro_registry
from materializer.source.formats.json import decode_json, json_schema
from materializer.source.formats.json_inferred import decode_inferred_json
from materializer.source.formats.protobuf_file import decode_protobuf_file
from materializer.source.formats.protobuf_registry import decode_protobuf_registry
from materializer.source.record_errors import with_error, without_errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["decode", "with_error"]


def _decode_string(raw: DataFrame, field: str) -> DataFrame:
    from pyspark.sql import functions as F

    return without_errors(raw).withColumn(field, F.col(c.VALUE).cast("string"))


def decode(raw: DataFrame, map_config: MapConfig) -> DataFrame:
    """Add the entity's fields and the error columns to raw records."""
    src = map_config.source
    if src.envelope == "debezium":
        return decode_debezium(raw, map_config)
    if src.format == "json" and src.schema_ is not None:
        return decode_json(raw, json_schema(map_config))
    if src.format == "json_schema":
        return decode_json(raw, json_schema(map_config), wire_format=True)
    if src.format == "json":
        return decode_inferred_json(raw, map_config)
    if src.format == "avro" and src.schema_file:
        return decode_avro_file(raw, avro_schema(map_config))
    if src.format == "avro":
        return decode_avro_registry(raw, map_config)
    if src.format == "protobuf" and src.schema_registry_url:
        return decode_protobuf_registry(raw, map_config)
    if src.format == "protobuf":
        return decode_protobuf_file(raw, map_config)
    if src.format == "string":
        return _decode_string(raw, src.string_field)
    raise ConfigError("", [f"source.format: unknown format {src.format!r}"])
