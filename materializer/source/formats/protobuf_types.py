"""Protobuf message descriptors as Spark types, and parsed messages as dicts of those types.

Fields keep their ``.proto`` names. Types:

- ``double`` DOUBLE, ``float`` FLOAT, ``bool`` BOOLEAN, ``string`` STRING,
  ``bytes`` BINARY, ``int32``/``sint32``/``sfixed32`` INT,
  ``uint32``/``fixed32`` LONG, ``int64``/``sint64``/``sfixed64`` LONG,
  ``uint64``/``fixed64`` DECIMAL(20, 0) (every value fits, none wraps negative);
- an enum is STRING, the value's name (an unknown number: the number as text);
- a message is a STRUCT, ``repeated`` an ARRAY, a ``map<K, V>`` a MAP;
- well-known types: ``google.protobuf.Timestamp`` TIMESTAMP, the wrappers
  (``Int64Value``…) their scalar, ``Struct``/``Value``/``ListValue`` STRING
  (their JSON text).

Presence: a field that tracks presence (``optional``, a message, a oneof
member, proto2 fields) is null when unset. A proto3 field without presence
cannot tell unset from its default, so it holds the default (0, "", false,
the enum's first value); repeated fields and maps are empty, never null.

Recursive messages have no Spark type and are refused.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from pyspark.sql.types import DataType, StructType

Convert = Callable[[Any], Any]
_UTC = datetime.UTC

_WRAPPERS = {
    f"google.protobuf.{name}"
    for name in (
        "DoubleValue",
        "FloatValue",
        "Int64Value",
        "UInt64Value",
        "Int32Value",
        "UInt32Value",
        "BoolValue",
        "StringValue",
        "BytesValue",
    )
}
_JSON_TYPES = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}
_TIMESTAMP = "google.protobuf.Timestamp"


class ProtobufSchemaError(ValueError):
    """A message this map cannot read (a recursive one)."""


def _scalar(field: FieldDescriptor) -> DataType:
    from pyspark.sql import types as T

    t = FieldDescriptor
    kinds: dict[int, DataType] = {
        t.TYPE_DOUBLE: T.DoubleType(),
        t.TYPE_FLOAT: T.FloatType(),
        t.TYPE_BOOL: T.BooleanType(),
        t.TYPE_STRING: T.StringType(),
        t.TYPE_BYTES: T.BinaryType(),
        t.TYPE_INT32: T.IntegerType(),
        t.TYPE_SINT32: T.IntegerType(),
        t.TYPE_SFIXED32: T.IntegerType(),
        t.TYPE_UINT32: T.LongType(),
        t.TYPE_FIXED32: T.LongType(),
        t.TYPE_INT64: T.LongType(),
        t.TYPE_SINT64: T.LongType(),
        t.TYPE_SFIXED64: T.LongType(),
        t.TYPE_UINT64: T.DecimalType(20, 0),
        t.TYPE_FIXED64: T.DecimalType(20, 0),
        t.TYPE_ENUM: T.StringType(),
    }
    return kinds[field.type]


def _message_of(field: FieldDescriptor) -> Descriptor:
    """The message type of a message field."""
    message = field.message_type
    if message is None:
        raise ProtobufSchemaError(f"field {field.full_name} has no message type")
    return message


def _is_message(field: FieldDescriptor) -> bool:
    return field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP)


def _is_map(field: FieldDescriptor) -> bool:
    return _is_message(field) and field.is_repeated and _message_of(field).GetOptions().map_entry


def spark_type(message: Descriptor) -> StructType:
    """The Spark struct of a message's fields."""
    from pyspark.sql.types import StructType

    dtype = _message_type(message, [])
    if not isinstance(dtype, StructType):
        raise ProtobufSchemaError(f"{message.full_name} is not a message with fields")
    return dtype


def _message_type(message: Descriptor, entered: list[str]) -> DataType:
    from pyspark.sql import types as T

    name = message.full_name
    if name == _TIMESTAMP:
        return T.TimestampType()
    if name in _WRAPPERS:
        return _single_type(message.fields_by_name["value"], entered)
    if name in _JSON_TYPES:
        return T.StringType()
    if name in entered:
        path = " > ".join([*entered, name])
        raise ProtobufSchemaError(f"message {name} is recursive ({path}): no Spark type holds it")
    entered.append(name)
    fields = [T.StructField(f.name, _field_type(f, entered), True) for f in message.fields]
    entered.pop()
    return T.StructType(fields)


def _single_type(field: FieldDescriptor, entered: list[str]) -> DataType:
    if _is_message(field):
        return _message_type(_message_of(field), entered)
    return _scalar(field)


def _field_type(field: FieldDescriptor, entered: list[str]) -> DataType:
    from pyspark.sql import types as T

    if _is_map(field):
        entry = _message_of(field)
        key = _single_type(entry.fields_by_name["key"], entered)
        value = _single_type(entry.fields_by_name["value"], entered)
        return T.MapType(key, value, True)
    if field.is_repeated:
        return T.ArrayType(_single_type(field, entered), True)
    return _single_type(field, entered)


# ---------------------------------------------------------------- values


def _timestamp(value: Any) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(value.seconds, _UTC) + datetime.timedelta(
        microseconds=value.nanos // 1000
    )


def _json_text(value: Any) -> str:
    from google.protobuf.json_format import MessageToDict

    return json.dumps(MessageToDict(value), separators=(",", ":"))


def _single_convert(field: FieldDescriptor) -> Convert | None:
    """How one (non-repeated) value of the field becomes what Arrow takes; None: as is."""
    if _is_message(field):
        return message_converter(_message_of(field))
    if field.type == FieldDescriptor.TYPE_ENUM:
        enum = field.enum_type
        if enum is None:
            raise ProtobufSchemaError(f"field {field.full_name} has no enum type")
        names = {v.number: v.name for v in enum.values}
        return lambda n: names.get(n, str(n))
    if field.type in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return Decimal
    return None


def _field_convert(field: FieldDescriptor) -> Convert | None:
    if _is_map(field):
        entry = _message_of(field)
        key = _single_convert(entry.fields_by_name["key"])
        value = _single_convert(entry.fields_by_name["value"])
        if key is None and value is None:
            return dict
        k = key or (lambda x: x)
        v = value or (lambda x: x)
        return lambda m: {k(a): v(b) for a, b in m.items()}
    one = _single_convert(field)
    if field.is_repeated:
        if one is None:
            return list
        return lambda items: [one(x) for x in items]
    return one


def _default(field: FieldDescriptor) -> Any:
    """A field's value when the message does not list it."""
    if _is_map(field):
        return {}
    if field.is_repeated:
        return []
    if field.has_presence:
        return None
    convert = _single_convert(field)
    return field.default_value if convert is None else convert(field.default_value)


_converters: dict[int, tuple[Descriptor, Callable[[Any], Any]]] = {}
"""Converters by descriptor identity (two pools may hold different messages of one name)."""


def message_converter(message: Descriptor) -> Callable[[Message], Any]:
    """A parsed message to a dict of its fields (or a well-known type's value); cached.

    Walks only the fields the message lists (``ListFields``: set, non-default
    or non-empty); every other field takes its default from a prepared dict.
    """
    name = message.full_name
    cached = _converters.get(id(message))
    if cached is not None:
        return cached[1]
    if name == _TIMESTAMP:
        return _timestamp
    if name in _WRAPPERS:
        inner = _single_convert(message.fields_by_name["value"])
        if inner is None:
            return lambda m: getattr(m, "value")  # noqa: B009 - the wrappers' one field
        return lambda m: inner(getattr(m, "value"))  # noqa: B009
    if name in _JSON_TYPES:
        return _json_text

    defaults: dict[str, Any] = {}
    converts: dict[str, Convert | None] = {}

    def convert(msg: Message) -> dict[str, Any]:
        out = dict(defaults)
        for field, value in msg.ListFields():
            fname = field.name
            if fname not in out:
                continue  # an extension: not a field of the map's schema
            f = converts[fname]
            out[fname] = value if f is None else f(value)
        return out

    # Registered before the fields are walked, so the walk ends at a message it has seen.
    _converters[id(message)] = (message, convert)
    for field in message.fields:
        defaults[field.name] = _default(field)
        converts[field.name] = _field_convert(field)
    return convert
