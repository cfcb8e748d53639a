"""Debezium's Avro change events, decoded on the executors (``formats.avro_registry``).

The reader is the latest envelope schema of ``<topic>-value``; the map's fields are its
``after`` record's, typed by their Connect names (``formats.avro_types``). The key is
Confluent's wire format too, read with the schema it names (``keys.key_text``). A value
that is not such an envelope is a decode error naming why.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, cast

from materializer import record_columns as c
from materializer.config import MapConfig
from materializer.errors import ConfigError
from materializer.source.debezium.keys import key_text
from materializer.source.debezium.ops import DELETE, OPS, UPSERTS, unknown_op, without_after
from materializer.source.debezium.types import UNAVAILABLE_VALUE
from materializer.source.formats.arrow_decode import (
    DecodeFailure,
    ValueDecoder,
    decode_in_python,
    nullable,
)
from materializer.source.formats.avro_registry import AvroRegistryDecoder, Reader, parse_avro
from materializer.source.formats.avro_types import AvroSchemaError, spark_type
from materializer.source.formats.registry import (
    WireFormatError,
    reader_schema,
    split_header,
    value_subject,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

_PLACEHOLDERS = (UNAVAILABLE_VALUE, UNAVAILABLE_VALUE.encode())


class DebeziumAvroDecoder(ValueDecoder):
    """Executor side: the envelope through the registry's reader, then the row and the
    envelope's columns (``record_columns.OP`` and the rest)."""

    reads_key = True

    def __init__(self, url: str, reader: Reader) -> None:
        self.values = AvroRegistryDecoder(url, [reader])

    def decode(self, value: bytes) -> dict[str, Any]:
        """The row of one change event."""
        return self.decode_record(None, value)

    def decode_record(self, key: bytes | None, value: bytes) -> dict[str, Any]:
        """The row of one change event, with the key's text."""
        envelope = self.values.decode(value)
        op = envelope.get("op")
        if op not in OPS:
            raise DecodeFailure(unknown_op(str(op)))
        before, after = envelope.get("before"), envelope.get("after")
        if op in UPSERTS and after is None:
            raise DecodeFailure(without_after(op))
        row = dict((before if op == DELETE else after) or {})
        unavailable = [] if op == DELETE else [n for n, v in row.items() if _missing(v)]
        for name in unavailable:
            row[name] = None
        source = envelope.get("source")
        row |= {
            c.OP: op,
            c.BEFORE: before,
            c.TS_MS: envelope.get("ts_ms"),
            c.SOURCE_TS_MS: source.get("ts_ms") if isinstance(source, dict) else None,
            c.UNAVAILABLE: unavailable,
            c.VALUE_KEY: None if key is None else self._key(key),
        }
        return row

    def _key(self, key: bytes) -> str | None:
        import fastavro

        try:
            schema_id, payload = split_header(key)
        except WireFormatError:
            return None
        writer = self.values.writer(schema_id)
        struct = fastavro.schemaless_reader(io.BytesIO(payload), writer, None)
        return key_text(struct if isinstance(struct, dict) else None)


def _missing(value: Any) -> bool:
    return isinstance(value, str | bytes) and value in _PLACEHOLDERS


def decode_debezium_avro(raw: DataFrame, map_config: MapConfig) -> DataFrame:
    """The envelope's reader from the registry now; every record decoded on the executors."""
    from pyspark.sql import types as T

    src = map_config.source
    url = src.schema_registry_url or ""
    latest = reader_schema(url, src.topics[0], "AVRO")
    reader = Reader(None, latest.id, latest.text, value_subject(src.topics[0]), row="after")
    try:
        envelope = spark_type(parse_avro(latest.text))
    except (AvroSchemaError, ValueError) as exc:
        raise ConfigError(
            "", [f"source.schema_registry_url: reader schema id {latest.id}: {exc}"]
        ) from None
    names = envelope.fieldNames()
    if "after" not in names or not isinstance(envelope["after"].dataType, T.StructType):
        raise ConfigError(
            "",
            [
                f"source.envelope: reader schema id {latest.id} of {src.topics[0]}-value is not "
                f"Debezium's change event (fields: {', '.join(names)})"
            ],
        )
    row: StructType = envelope["after"].dataType
    own = T.StructType(
        [
            T.StructField(c.OP, T.StringType()),
            T.StructField(c.BEFORE, row),
            T.StructField(c.TS_MS, T.LongType()),
            T.StructField(c.SOURCE_TS_MS, T.LongType()),
            T.StructField(c.UNAVAILABLE, T.ArrayType(T.StringType())),
            T.StructField(c.VALUE_KEY, T.StringType()),
        ]
    )
    own = cast("StructType", nullable(own))
    return decode_in_python(raw, row, DebeziumAvroDecoder(url, reader), own)
