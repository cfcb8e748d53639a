"""Avro in Confluent's wire format, schemas from a schema registry, decoded on the executors.

The reader schema is the latest version of ``<first topic>-value`` when the
map starts; its fields are the map's fields. Each record names its writer
schema by id; the writer schema is fetched once per id and process, and Avro
schema resolution reads the record into the reader's shape: a field the
writer lacks takes the reader's default, a field only the writer has is
skipped. So records of a version registered after the map started decode
with no restart; their new fields reach the map when it starts again with the
newer latest version as its reader (a ``latest`` fold keeps the entity's
typed fields in its state, so there a changed reader needs a new checkpoint).

A value without the wire-format header, with an id the registry does not
know, written by a schema that does not resolve against the reader, with
bytes left over, or met while the registry is unreachable, is a decode
error naming the cause.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import orjson

from materializer.config import MapConfig
from materializer.errors import ConfigError
from materializer.pipeline.formats.arrow_decode import DecodeFailure, ValueDecoder, decode_in_python
from materializer.pipeline.formats.avro_types import AvroSchemaError, converter, spark_type
from materializer.pipeline.formats.registry import (
    RegistryError,
    WireFormatError,
    client_for,
    reader_schema,
    split_header,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_readers: dict[tuple[str, int], tuple[Any, Any]] = {}
"""(url, reader id) → (parsed reader schema, value converter), per process."""
_writers: dict[tuple[str, int], Any] = {}
"""(url, writer id) → parsed writer schema, per process."""


def _parse(text: str) -> Any:
    import fastavro

    return fastavro.parse_schema(orjson.loads(text))


class AvroRegistryDecoder(ValueDecoder):
    """Executor side: header, writer schema by id, then fastavro with the reader schema."""

    def __init__(self, url: str, reader_id: int, reader_text: str) -> None:
        self.url = url
        self.reader_id = reader_id
        self.reader_text = reader_text

    def _reader(self) -> tuple[Any, Any]:
        key = (self.url, self.reader_id)
        found = _readers.get(key)
        if found is None:
            parsed = _parse(self.reader_text)
            found = (parsed, converter(parsed))
            _readers[key] = found
        return found

    def _writer(self, schema_id: int) -> Any:
        key = (self.url, schema_id)
        found = _writers.get(key)
        if found is not None:
            return found
        try:
            schema = client_for(self.url).by_id(schema_id)
        except RegistryError as exc:
            raise DecodeFailure(f"writer schema id {schema_id}: {exc}") from None
        if schema.schema_type != "AVRO":
            raise DecodeFailure(f"writer schema id {schema_id} is {schema.schema_type}, not AVRO")
        try:
            found = _parse(schema.text)
        except Exception as exc:  # fastavro raises several types for a bad schema
            raise DecodeFailure(f"writer schema id {schema_id} does not parse: {exc}") from None
        _writers[key] = found
        return found

    def decode(self, value: bytes) -> dict[str, Any]:
        """One wire-format value as the reader schema's fields."""
        import fastavro

        try:
            schema_id, payload = split_header(value)
        except WireFormatError as exc:
            raise DecodeFailure(str(exc)) from None
        reader, convert = self._reader()
        writer = reader if schema_id == self.reader_id else self._writer(schema_id)
        buffer = io.BytesIO(payload)
        try:
            record = fastavro.schemaless_reader(
                buffer, writer, None if writer is reader else reader
            )
        except Exception as exc:  # truncated or corrupt bytes, or schemas that do not resolve
            detail = str(exc) or type(exc).__name__
            raise DecodeFailure(
                f"not Avro of writer schema id {schema_id} read as id {self.reader_id}: {detail}"
            ) from None
        left = len(payload) - buffer.tell()
        if left:
            raise DecodeFailure(
                f"{left} bytes left after the Avro record: not a value of writer schema "
                f"id {schema_id}"
            )
        if not isinstance(record, dict):
            raise DecodeFailure(f"writer schema id {schema_id} is not a record schema")
        return convert(record) if convert is not None else record


def decode_avro_registry(raw: DataFrame, map_config: MapConfig) -> DataFrame:
    """The reader schema from the registry now; every record decoded on the executors."""
    src = map_config.source
    url = src.schema_registry_url or ""
    latest = reader_schema(url, src.topics[0], "AVRO")
    try:
        fields = spark_type(_parse(latest.text))
    except AvroSchemaError as exc:
        raise ConfigError(
            "", [f"source.schema_registry_url: reader schema id {latest.id}: {exc}"]
        ) from None
    except Exception as exc:  # fastavro raises several types for a bad schema
        raise ConfigError(
            "", [f"source.schema_registry_url: reader schema id {latest.id} does not parse: {exc}"]
        ) from None
    return decode_in_python(raw, fields, AvroRegistryDecoder(url, latest.id, latest.text))
