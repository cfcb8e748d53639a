"""Avro in Confluent's wire format, schemas from a schema registry, decoded on the executors.

The reader schema is the latest version of ``<first topic>-value`` when the
map starts; its fields are the map's fields. Each record names its writer
schema by id; the writer schema is fetched once per id and process, and Avro
schema resolution reads the record into the reader's shape: a field the
writer lacks takes the reader's default, a field only the writer has is
skipped. A record of a newer writer with fields the reader lacks, once the
subject's latest version adds them, stops the batch so that the map's queries
start again on that version (``schema_moves``): the new fields reach the
entities and the table with no record read without them.

With ``subject_name_strategy`` ``record`` or ``topic_record`` a topic carries
several record types (``record_types``), each with its own subject and so its
own latest version as reader. A record goes to the reader of its writer
schema's full name; the map's fields are the union of the readers' fields
(one name, one type), and a type without a field leaves it null.

A value without the wire-format header, with an id the registry does not
know, written by a schema that does not resolve against the reader, of a
record type the map does not read, with bytes left over, or met while the
registry is unreachable, is a decode error naming the cause.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from materializer.config import MapConfig
from materializer.errors import ConfigError
from materializer.source.formats.arrow_decode import DecodeFailure, ValueDecoder, decode_in_python
from materializer.source.formats.avro_types import AvroSchemaError, converter, spark_type
from materializer.source.formats.registry import (
    RegistryError,
    WireFormatError,
    client_for,
    reader_schema,
    split_header,
    subject_name,
    union_fields,
)
from materializer.source.formats.schema_moves import check_writer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

_readers: dict[tuple[str, int], tuple[Any, Any]] = {}
"""(url, reader id) → (parsed reader schema, value converter), per process."""
_writers: dict[tuple[str, int], Any] = {}
"""(url, writer id) → parsed writer schema, per process."""


def parse_avro(text: str) -> Any:
    """A schema's text parsed by fastavro."""
    import fastavro

    return fastavro.parse_schema(orjson.loads(text))


@dataclass(frozen=True)
class Reader:
    """A reader schema as registered: for one record type, or (``record_type`` None) for
    every record of the topic."""

    record_type: str | None
    schema_id: int
    text: str
    subject: str
    row: str | None = None
    """The field of the record that holds the map's fields (Debezium's ``after``); None:
    the record's own fields are."""


class AvroRegistryDecoder(ValueDecoder):
    """Executor side: header, writer schema by id, then fastavro with its reader schema."""

    def __init__(self, url: str, readers: Sequence[Reader]) -> None:
        self.url = url
        self.readers = tuple(readers)
        self._by_type = {r.record_type: r for r in self.readers}
        self._by_id = {r.schema_id: r for r in self.readers}

    def _reader(self, reader: Reader) -> tuple[Any, Any]:
        key = (self.url, reader.schema_id)
        found = _readers.get(key)
        if found is None:
            parsed = parse_avro(reader.text)
            found = (parsed, converter(parsed))
            _readers[key] = found
        return found

    def _pick(self, schema_id: int) -> tuple[Reader, Any]:
        """The reader of a writer schema id, and the parsed writer (None: the reader)."""
        same = self._by_id.get(schema_id)
        if same is not None:
            return same, None
        writer = self.writer(schema_id)
        if None in self._by_type:
            return self._by_type[None], writer
        name = writer.get("name") if isinstance(writer, dict) else None
        reader = self._by_type.get(name)
        if reader is None:
            known = ", ".join(str(r.record_type) for r in self.readers)
            raise DecodeFailure(
                f"record type {name} (writer schema id {schema_id}) is not one the map "
                f"reads (record_types: {known})"
            )
        return reader, writer

    def writer(self, schema_id: int) -> Any:
        """The parsed writer schema of ``schema_id``, fetched once per process."""
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
            found = parse_avro(schema.text)
        except Exception as exc:  # fastavro raises several types for a bad schema
            raise DecodeFailure(f"writer schema id {schema_id} does not parse: {exc}") from None
        _writers[key] = found
        return found

    def _check(self, reader: Reader, writer_id: int, writer: Any) -> None:
        """A writer with fields the reader lacks: the map takes the subject's wider latest
        version first, if it has one (``schema_moves``)."""
        row = reader.row
        try:
            check_writer(
                self.url,
                reader.subject,
                (reader.schema_id, _row(_typed(reader.text), row)),
                (writer_id, lambda: _row(_spark_type(writer), row)),
                lambda latest: _row(_typed(latest.text), row),
            )
        except RegistryError as exc:
            raise DecodeFailure(f"writer schema id {writer_id}: {exc}") from None

    def decode(self, value: bytes) -> dict[str, Any]:
        """One wire-format value as the reader schema's fields."""
        import fastavro

        try:
            schema_id, payload = split_header(value)
        except WireFormatError as exc:
            raise DecodeFailure(str(exc)) from None
        chosen, writer = self._pick(schema_id)
        if writer is not None:
            self._check(chosen, schema_id, writer)
        reader, convert = self._reader(chosen)
        buffer = io.BytesIO(payload)
        try:
            record = fastavro.schemaless_reader(
                buffer, reader if writer is None else writer, None if writer is None else reader
            )
        except Exception as exc:  # truncated or corrupt bytes, or schemas that do not resolve
            detail = str(exc) or type(exc).__name__
            raise DecodeFailure(
                f"not Avro of writer schema id {schema_id} read as id {chosen.schema_id}: {detail}"
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
    """The reader schemas from the registry now; every record decoded on the executors."""
    src = map_config.source
    url = src.schema_registry_url or ""
    topic = src.topics[0]
    types: list[str | None] = [*src.record_types] if src.record_types else [None]
    readers = []
    for record_type in types:
        subject = subject_name(src.subject_name_strategy, topic, record_type)
        latest = reader_schema(url, topic, "AVRO", subject=subject)
        readers.append(Reader(record_type, latest.id, latest.text, subject))
    return decode_in_python(raw, _fields(readers), AvroRegistryDecoder(url, readers))


def _fields(readers: Sequence[Reader]) -> StructType:
    """The union of the readers' fields (``union_fields``)."""
    parts = []
    for reader in readers:
        try:
            fields = spark_type(parse_avro(reader.text))
        except AvroSchemaError as exc:
            raise ConfigError(
                "", [f"source.schema_registry_url: reader schema id {reader.schema_id}: {exc}"]
            ) from None
        except Exception as exc:  # fastavro raises several types for a bad schema
            raise ConfigError(
                "",
                [
                    f"source.schema_registry_url: reader schema id {reader.schema_id} "
                    f"does not parse: {exc}"
                ],
            ) from None
        parts.append((reader.record_type or f"schema id {reader.schema_id}", fields))
    return union_fields(parts)


def _spark_type(parsed: Any) -> StructType:
    """A parsed schema's fields; none for one they cannot type (it adds nothing known)."""
    from pyspark.sql.types import StructType

    try:
        return spark_type(parsed)
    except AvroSchemaError:
        return StructType([])


_typed_texts: dict[str, StructType] = {}


def _typed(text: str) -> StructType:
    """A registered schema's fields, kept per process."""
    from pyspark.sql.types import StructType

    found = _typed_texts.get(text)
    if found is None:
        try:
            found = _spark_type(parse_avro(text))
        except Exception:  # noqa: BLE001 - fastavro raises several types for a bad schema
            found = StructType([])
        _typed_texts[text] = found
    return found


def _row(fields: StructType, row: str | None) -> StructType:
    """The map's fields among a record's: ``row``'s, or the record's own."""
    from pyspark.sql.types import StructType

    if row is None:
        return fields
    found = fields[row].dataType if row in fields.names else None
    return found if isinstance(found, StructType) else StructType([])
