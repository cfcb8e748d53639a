"""Protobuf values of one message from a descriptor set file, decoded on the executors.

``descriptor_file`` is a serialized FileDescriptorSet (``protoc
--descriptor_set_out=FILE --include_imports``) and ``message`` the full name
of the values' message. Each value is that message's bytes alone (no
header); the driver reads the file once and ships its bytes to the
executors, which need no copy of it. Types and presence: ``protobuf_types``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from materializer.config import MapConfig
from materializer.errors import ConfigError
from materializer.source.formats.arrow_decode import DecodeFailure, ValueDecoder, decode_in_python
from materializer.source.formats.protobuf_pool import (
    find_message,
    message_class,
    message_names,
    set_key,
)
from materializer.source.formats.protobuf_types import (
    ProtobufSchemaError,
    message_converter,
    spark_type,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from google.protobuf.message import Message
    from pyspark.sql import DataFrame

_prepared: dict[tuple[str, str], tuple[type[Message], Callable[[Message], Any]]] = {}
"""(set key, message) → (message class, converter), per process."""


def prepared(descriptor_set: bytes, message: str) -> tuple[type[Message], Callable[[Message], Any]]:
    """The message class and converter of a set's message, built once per process."""
    key = (set_key(descriptor_set), message)
    found = _prepared.get(key)
    if found is None:
        descriptor = find_message(descriptor_set, message)
        found = (message_class(descriptor), message_converter(descriptor))
        _prepared[key] = found
    return found


def parse_message(cls: type[Message], payload: bytes) -> Message:
    """The payload as a message of ``cls``; bytes that do not parse are a DecodeFailure."""
    try:
        return cls.FromString(payload)
    except DecodeError as exc:
        raise DecodeFailure(f"value is not a protobuf {cls.DESCRIPTOR.full_name}: {exc}") from None


class ProtobufDecoder(ValueDecoder):
    """Executor side: each value is one message of ``message``."""

    def __init__(self, descriptor_set: bytes, message: str) -> None:
        self.descriptor_set = descriptor_set
        self.message = message

    def decode(self, value: bytes) -> dict[str, Any]:
        """The message's fields."""
        cls, convert = prepared(self.descriptor_set, self.message)
        result: dict[str, Any] = convert(parse_message(cls, value))
        return result


def read_descriptor_set(map_config: MapConfig) -> bytes:
    """The descriptor file's bytes, checked to hold the configured message."""
    src = map_config.source
    path = src.descriptor_file or ""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(
            "", [f"source.descriptor_file: cannot read {path}: {exc.strerror}"]
        ) from None
    try:
        names = message_names(data)
        find_message(data, src.message or "")
    except DecodeError:
        raise ConfigError(
            "",
            [
                f"source.descriptor_file: {path} is not a serialized FileDescriptorSet "
                "(protoc --descriptor_set_out=FILE --include_imports)"
            ],
        ) from None
    except ProtobufSchemaError as exc:
        raise ConfigError("", [f"source.descriptor_file: {path}: {exc}"]) from None
    except KeyError:
        known = ", ".join(names) or "none"
        raise ConfigError(
            "", [f"source.message: no message {src.message!r} in {path} (it has: {known})"]
        ) from None
    return data


def decode_protobuf_file(raw: DataFrame, map_config: MapConfig) -> DataFrame:
    """Each value as the configured message, decoded on the executors."""
    data = read_descriptor_set(map_config)
    message = map_config.source.message or ""
    try:
        fields = spark_type(find_message(data, message))
    except ProtobufSchemaError as exc:
        raise ConfigError("", [f"source.message: {exc}"]) from None
    return decode_in_python(raw, fields, ProtobufDecoder(data, message))
