"""Protobuf in Confluent's wire format, schemas from a schema registry, decoded on the executors.

A value is the magic byte, the writer schema id, the message indexes (which
message of the schema's file: a zigzag-varint count, then that many
zigzag-varint indexes into the file's messages and their nested messages;
the single byte 0 stands for the first message) and the message bytes.

The map reads one message: ``source.message`` when given, else the first
message of the latest schema of ``<first topic>-value`` when the map starts;
its fields are the map's fields. With ``subject_name_strategy`` ``record`` or
``topic_record`` it reads the messages of ``record_types`` instead, each from
the latest schema of its own subject, and its fields are all of theirs (a
message without a field leaves it null). A record's writer schema (fetched
once per id and process) tells which message the record holds: a record of a
message the map does not read is a decode error; one the map reads parses
with that message's reader descriptor, so fields it dropped take their
defaults, as protobuf itself reads them. Fields a newer writer added are
skipped only while the subject's latest version lacks them; once it has them
the batch stops and the map's queries start again on it (``schema_moves``).

Schemas come as a FileDescriptorProto when the registry serves
``?format=serialized`` (Confluent's registry does, and it is what
confluent-kafka's serializer registers); a registry answering with ``.proto``
source has it compiled with ``grpc_tools.protoc`` (``pip install
grpcio-tools``). References (imports of other subjects) are fetched the same
way; Google's well-known types come from the protobuf runtime.
"""

from __future__ import annotations

import base64
import binascii
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from materializer.config import MapConfig
from materializer.errors import ConfigError, SetupError
from materializer.source.formats.arrow_decode import DecodeFailure, ValueDecoder, decode_in_python
from materializer.source.formats.protobuf_file import parse_message, prepared
from materializer.source.formats.protobuf_pool import find_message
from materializer.source.formats.protobuf_types import ProtobufSchemaError, spark_type
from materializer.source.formats.registry import (
    RegisteredSchema,
    RegistryError,
    SchemaRegistryClient,
    WireFormatError,
    client_for,
    reader_schema,
    split_header,
    subject_name,
    union_fields,
    value_subject,
)
from materializer.source.formats.schema_moves import check_writer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

FileProto = descriptor_pb2.FileDescriptorProto
MAX_INDEXES = 64


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, position after it)."""
    shift, raw = 0, 0
    while True:
        if pos >= len(data):
            raise DecodeFailure("message indexes end before their varint does")
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise DecodeFailure("message indexes hold a varint longer than 64 bits")


def read_message_indexes(data: bytes) -> tuple[tuple[int, ...], int]:
    """The message indexes at the start of a payload and where the message starts."""
    count, pos = read_varint(data, 0)
    if count == 0:
        return (0,), pos
    if count < 0 or count > MAX_INDEXES:
        raise DecodeFailure(f"message indexes: count {count} is negative or over {MAX_INDEXES}")
    indexes = []
    for _ in range(count):
        index, pos = read_varint(data, pos)
        indexes.append(index)
    return tuple(indexes), pos


def message_at(file: FileProto, indexes: tuple[int, ...]) -> str:
    """The full name of the message the indexes point at in a file."""
    messages = file.message_type
    names = [file.package] if file.package else []
    for index in indexes:
        if not 0 <= index < len(messages):
            raise DecodeFailure(
                f"message indexes {list(indexes)} point past the messages of the schema"
            )
        names.append(messages[index].name)
        messages = messages[index].nested_type
    return ".".join(names)


def _as_descriptor(text: str) -> FileProto | None:
    """A schema served as a base64 FileDescriptorProto, or None for ``.proto`` source."""
    try:
        data = base64.b64decode(text, validate=True)
        return FileProto.FromString(data)
    except (binascii.Error, ValueError, DecodeError):
        return None


def _compile(text: str, name: str, imports: list[FileProto]) -> FileProto:
    """``.proto`` source compiled by ``grpc_tools.protoc``, its imports given as descriptors."""
    try:
        import grpc_tools
    except ImportError:
        raise ProtobufSchemaError(
            "the registry serves this schema as .proto source: compiling it needs grpcio-tools "
            "(pip install grpcio-tools)"
        ) from None
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="materializer-proto-") as tmp:
        root = Path(tmp)
        source = root / "src" / name
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(text)
        out = root / "out.pb"
        args = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{root / 'src'}",
            f"-I{well_known}",
            f"--descriptor_set_out={out}",
        ]
        if imports:
            deps = root / "imports.pb"
            deps.write_bytes(descriptor_pb2.FileDescriptorSet(file=imports).SerializeToString())
            args.append(f"--descriptor_set_in={deps}")
        try:
            done = subprocess.run([*args, name], capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise ProtobufSchemaError(f"protoc did not finish compiling {name} in 120 s") from None
        if done.returncode != 0:
            raise ProtobufSchemaError(f"protoc cannot compile {name}: {done.stderr.strip()}")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return files[-1]


def schema_files(
    client: SchemaRegistryClient, schema: RegisteredSchema, name: str
) -> list[FileProto]:
    """A registered protobuf schema's file, after the files of its references."""
    files: list[FileProto] = []
    for ref in schema.references:
        referenced = client.version(ref.subject, ref.version, fmt="serialized")
        for file in schema_files(client, referenced, ref.name):
            if all(f.name != file.name for f in files):
                files.append(file)
    main = _as_descriptor(schema.text)
    if main is None:
        main = _compile(schema.text, name, files)
    elif not main.name:
        main.name = name
    return [*files, main]


def _file_name(schema_id: int) -> str:
    return f"schema_{schema_id}.proto"


_writer_files: dict[tuple[str, int], FileProto] = {}
"""(url, writer id) → the writer schema's own file, per process."""
_bad_writers: dict[tuple[str, int], str] = {}
"""(url, writer id) → why that schema cannot be read: schemas never change, so every record
of the id fails alike without asking the registry or protoc again."""


@dataclass(frozen=True)
class MessageReader:
    """One message the map reads, with the registered schema (and its imports) it was
    read from: the reader of every record holding that message."""

    message: str
    schema_id: int
    files: bytes
    """A serialized FileDescriptorSet: the schema's imports, then its own file."""
    subject: str


class ProtobufRegistryDecoder(ValueDecoder):
    """Executor side: header, message indexes, then the reader of that message parses it."""

    def __init__(self, url: str, readers: Sequence[MessageReader]) -> None:
        self.url = url
        self.readers = tuple(readers)
        self._by_message = {r.message: r for r in self.readers}
        self._by_id = {r.schema_id: r for r in self.readers}

    def _writer_file(self, schema_id: int) -> FileProto:
        key = (self.url, schema_id)
        found = _writer_files.get(key)
        if found is not None:
            return found
        bad = _bad_writers.get(key)
        if bad is not None:
            raise DecodeFailure(bad)
        reader = self._by_id.get(schema_id)
        if reader is not None:
            found = descriptor_pb2.FileDescriptorSet.FromString(reader.files).file[-1]
            _writer_files[key] = found
            return found
        client = client_for(self.url)
        bad = None
        try:
            schema = client.by_id(schema_id, fmt="serialized")
            if schema.schema_type != "PROTOBUF":
                bad = f"writer schema id {schema_id} is {schema.schema_type}, not PROTOBUF"
            else:
                found = schema_files(client, schema, _file_name(schema_id))[-1]
        except RegistryError as exc:  # an outage passes; the client remembers it briefly
            raise DecodeFailure(f"writer schema id {schema_id}: {exc}") from None
        except ProtobufSchemaError as exc:
            bad = f"writer schema id {schema_id}: {exc}"
        if bad is not None or found is None:
            _bad_writers[key] = bad or f"writer schema id {schema_id} holds no file"
            raise DecodeFailure(_bad_writers[key])
        _writer_files[key] = found
        return found

    def _check(self, reader: MessageReader, writer_id: int) -> None:
        """A writer whose message has fields the reader's lacks: the map takes the subject's
        wider latest version first, if it has one (``schema_moves``)."""
        from pyspark.sql.types import StructType

        client = client_for(self.url)

        def fields(schema: RegisteredSchema) -> StructType:
            """The message's fields in a registered schema; none in one that does not
            compile or type (it adds nothing known)."""
            try:
                files = schema_files(client, schema, _file_name(schema.id))
                found = descriptor_pb2.FileDescriptorSet(file=files).SerializeToString()
                return _message_fields(found, reader.message)
            except (ProtobufSchemaError, TypeError):
                return StructType([])

        try:
            check_writer(
                self.url,
                reader.subject,
                (reader.schema_id, _message_fields(reader.files, reader.message)),
                (writer_id, lambda: fields(client.by_id(writer_id, fmt="serialized"))),
                fields,
                fmt="serialized",
            )
        except RegistryError as exc:
            raise DecodeFailure(f"writer schema id {writer_id}: {exc}") from None

    def decode(self, value: bytes) -> dict[str, Any]:
        """One wire-format value as its reader message's fields."""
        try:
            schema_id, payload = split_header(value)
        except WireFormatError as exc:
            raise DecodeFailure(str(exc)) from None
        indexes, start = read_message_indexes(payload)
        written = message_at(self._writer_file(schema_id), indexes)
        reader = self._by_message.get(written)
        if reader is None:
            reads = ", ".join(r.message for r in self.readers)
            raise DecodeFailure(
                f"record holds message {written} (schema id {schema_id}); the map reads {reads}"
            )
        if schema_id != reader.schema_id:
            self._check(reader, schema_id)
        cls, convert = prepared(reader.files, reader.message)
        result: dict[str, Any] = convert(parse_message(cls, payload[start:]))
        return result


_typed_messages: dict[tuple[bytes, str], StructType] = {}


def _message_fields(files: bytes, message: str) -> StructType:
    """A message's fields in a serialized FileDescriptorSet (none when it lacks the
    message or they do not type), kept per process."""
    from pyspark.sql.types import StructType

    found = _typed_messages.get((files, message))
    if found is None:
        try:
            found = spark_type(find_message(files, message))
        except (KeyError, ProtobufSchemaError, TypeError):
            found = StructType([])
        _typed_messages[(files, message)] = found
    return found


def _message_reader(
    url: str, topic: str, subject: str, message: str | None, key: str
) -> tuple[MessageReader, StructType]:
    """The latest schema of ``subject`` as the reader of ``message`` (default: the schema's
    first message), and that message's fields; ``key`` is the config key that named it."""
    latest = reader_schema(url, topic, "PROTOBUF", fmt="serialized", subject=subject)
    try:
        files = schema_files(client_for(url), latest, _file_name(latest.id))
    except RegistryError as exc:
        raise SetupError(
            f"source.schema_registry_url: reader schema id {latest.id}: {exc}"
        ) from None
    except ProtobufSchemaError as exc:
        raise ConfigError(
            "", [f"source.schema_registry_url: reader schema id {latest.id}: {exc}"]
        ) from None
    main = files[-1]
    if message is None:
        if not main.message_type:
            raise ConfigError(
                "",
                [f"source.schema_registry_url: reader schema id {latest.id} declares no message"],
            )
        message = f"{main.package}.{main.message_type[0].name}".lstrip(".")
    reader_set = descriptor_pb2.FileDescriptorSet(file=files).SerializeToString()
    try:
        fields = spark_type(find_message(reader_set, message))
    except KeyError:
        raise ConfigError(
            "",
            [
                f"source.{key}: no message {message!r} in reader schema id {latest.id} "
                f"(subject {subject})"
            ],
        ) from None
    except ProtobufSchemaError as exc:
        raise ConfigError("", [f"source.{key}: message {message}: {exc}"]) from None
    return MessageReader(message, latest.id, reader_set, subject), fields


def decode_protobuf_registry(raw: DataFrame, map_config: MapConfig) -> DataFrame:
    """The readers' messages from the registry now; every record decoded on the executors.

    With ``record_types`` each message has its own subject (``subject_name_strategy``)
    and the map's fields are all of theirs.
    """
    src = map_config.source
    url = src.schema_registry_url or ""
    topic = src.topics[0]
    wanted: list[tuple[str, str | None, str]]
    if src.record_types:
        strategy = src.subject_name_strategy
        wanted = [(subject_name(strategy, topic, m), m, "record_types") for m in src.record_types]
    else:
        key = "message" if src.message else "schema_registry_url"
        wanted = [(value_subject(topic), src.message, key)]
    readers = [_message_reader(url, topic, *want) for want in wanted]
    fields = union_fields([(reader.message, fields) for reader, fields in readers])
    return decode_in_python(
        raw, fields, ProtobufRegistryDecoder(url, [reader for reader, _ in readers])
    )
