"""Avro schemas as Spark types, and fastavro's values as values Arrow takes for those types.

The mapping follows Spark's own ``from_avro``, so a map reads the same
entity from a schema file as from a registry:

- ``boolean``, ``int``, ``long``, ``float``, ``double``, ``string``,
  ``bytes``/``fixed`` (BINARY), ``enum`` (STRING, the symbol);
- logical types: ``decimal`` (DECIMAL(p, s)), ``date`` (DATE),
  ``timestamp-millis``/``-micros`` (TIMESTAMP), ``local-timestamp-millis``/
  ``-micros`` (TIMESTAMP_NTZ), ``time-millis`` (INT) / ``time-micros``
  (LONG) of the day, ``uuid`` (STRING);
- ``record`` STRUCT, ``array`` ARRAY, ``map`` MAP<STRING, …>;
- unions: ``[null, T]`` is a nullable T; ``int``/``long`` only is LONG,
  ``float``/``double`` only is DOUBLE; any other union is a struct with one
  nullable field per non-null branch, ``member0``, ``member1``… in order,
  the branch the value took set and the others null. fastavro returns the
  bare value, so the branch is told by the value's Python type (the first
  branch that takes it wins).

Kafka Connect's and Debezium's types, as their Avro converters name them in
``connect.name`` (so a change event's row, or a row Debezium's unwrap transform sent,
reads as the table's types): ``io.debezium.time.Date`` DATE;
``io.debezium.time.Timestamp``/``MicroTimestamp``/``NanoTimestamp`` (a timestamp
without a time zone) TIMESTAMP_NTZ; ``io.debezium.time.ZonedTimestamp`` (ISO-8601 text)
TIMESTAMP; ``io.debezium.data.VariableScaleDecimal`` (a numeric without a precision)
DECIMAL(38, 10); Connect's ``Decimal`` without Avro's logical type DECIMAL by its
parameters. Times of day stay the numbers they are, as Avro's own do; JSON, UUID and
XML are text.

Recursive records have no Spark type and are refused.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

Convert = Callable[[Any], Any]
"""A value as fastavro reads it to the value Arrow takes; ``None`` in place of one: no change."""

_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")


class AvroSchemaError(ValueError):
    """An Avro schema this map cannot read (recursive, unknown name, no Spark type)."""


class _Walk:
    """One walk of a parsed schema: named types by full name, records being entered."""

    def __init__(self) -> None:
        self.names: dict[str, dict[str, Any]] = {}
        self.entered: list[str] = []

    def resolve(self, schema: Any) -> Any:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            if schema not in self.names:
                raise AvroSchemaError(f"unknown Avro type name {schema!r}")
            return self.names[schema]
        if (
            isinstance(schema, dict)
            and "name" in schema
            and schema.get("type")
            in (
                "record",
                "error",
                "enum",
                "fixed",
            )
        ):
            self.names.setdefault(schema["name"], schema)
        return schema


def _type_name(schema: Any) -> str:
    return schema if isinstance(schema, str) else str(schema.get("type"))


def _logical(schema: Any) -> str | None:
    return schema.get("logicalType") if isinstance(schema, dict) else None


def spark_type(schema: Any) -> StructType:
    """The Spark struct of a parsed (``fastavro.parse_schema``) top-level record schema."""
    from pyspark.sql.types import StructType

    walk = _Walk()
    dtype, _ = _spark(walk.resolve(schema), walk)
    if not isinstance(dtype, StructType):
        raise AvroSchemaError(f"the top-level type must be a record, not {_type_name(schema)}")
    return dtype


DATE = "io.debezium.time.Date"
MILLIS = ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp")
MICROS = "io.debezium.time.MicroTimestamp"
NANOS = "io.debezium.time.NanoTimestamp"
ZONED = "io.debezium.time.ZonedTimestamp"
VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
VARIABLE_DECIMAL_TYPE = (38, 10)
"""The DECIMAL a numeric without a precision reads as: 28 digits before the point, 10 after;
a value past them is a decode error, not a rounded number."""
CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
EPOCH = datetime.datetime(1970, 1, 1)


def _connect(schema: Any) -> str | None:
    return schema.get("connect.name") if isinstance(schema, dict) else None


def _connect_spark(schema: Any) -> DataType | None:
    """The Spark type of a Connect or Debezium type (``connect.name``); None: not one."""
    from pyspark.sql import types as T

    name, kind = _connect(schema), _type_name(schema)
    if name == DATE and kind == "int":
        return T.DateType()
    if name in (*MILLIS, MICROS, NANOS) and kind == "long" and _logical(schema) is None:
        return T.TimestampNTZType()
    if name == ZONED and kind == "string":
        return T.TimestampType()
    if name == VARIABLE_DECIMAL and kind == "record":
        return T.DecimalType(*VARIABLE_DECIMAL_TYPE)
    if name == CONNECT_DECIMAL and kind == "bytes" and _logical(schema) is None:
        parameters = schema.get("connect.parameters") or {}
        precision = int(parameters.get("connect.decimal.precision", 38))
        return T.DecimalType(min(precision, 38), int(parameters.get("scale", 0)))
    return None


def _connect_convert(schema: Any) -> Convert | None:
    """How a Connect or Debezium type's value becomes its Spark type's (``_connect_spark``)."""
    name, kind = _connect(schema), _type_name(schema)
    if _connect_spark(schema) is None:
        return None
    if name == DATE:
        return lambda v: v if v is None else (EPOCH + datetime.timedelta(days=v)).date()
    if name in MILLIS:
        return lambda v: v if v is None else EPOCH + datetime.timedelta(milliseconds=v)
    if name == MICROS:
        return lambda v: v if v is None else EPOCH + datetime.timedelta(microseconds=v)
    if name == NANOS:
        return lambda v: v if v is None else EPOCH + datetime.timedelta(microseconds=v // 1000)
    if name == ZONED:
        return lambda v: v if v is None else datetime.datetime.fromisoformat(v)
    if kind == "record":
        return lambda v: v if v is None else _scaled(v["value"], v["scale"])
    scale = int((schema.get("connect.parameters") or {}).get("scale", 0))
    return lambda v: _scaled(v, scale) if isinstance(v, bytes) else v


def _scaled(unscaled: bytes, scale: int) -> Decimal:
    """Exact: ``scaleb`` would round to the context's 28 digits."""
    return Decimal(f"{int.from_bytes(unscaled, 'big', signed=True)}E-{scale}")


def _spark(schema: Any, walk: _Walk) -> tuple[DataType, bool]:
    """(Spark type, nullable) of one resolved schema node."""
    from pyspark.sql import types as T

    if isinstance(schema, list):
        return _union(schema, walk)
    connect = _connect_spark(schema)
    if connect is not None:
        return connect, False
    kind = _type_name(schema)
    logical = _logical(schema)
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        if precision > 38:
            raise AvroSchemaError(f"decimal precision {precision} is over Spark's 38")
        return T.DecimalType(precision, scale), False
    if logical == "date" and kind == "int":
        return T.DateType(), False
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return T.TimestampType(), False
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return T.TimestampNTZType(), False
    simple: dict[str, DataType] = {
        "null": T.NullType(),
        "boolean": T.BooleanType(),
        "int": T.IntegerType(),
        "long": T.LongType(),
        "float": T.FloatType(),
        "double": T.DoubleType(),
        "bytes": T.BinaryType(),
        "string": T.StringType(),
        "enum": T.StringType(),
        "fixed": T.BinaryType(),
    }
    if kind in simple:
        return simple[kind], kind == "null"
    if kind in ("record", "error"):
        name = schema["name"]
        if name in walk.entered:
            raise AvroSchemaError(f"record {name} is recursive: Spark types cannot nest forever")
        walk.entered.append(name)
        fields = []
        for field in schema["fields"]:
            dtype, nullable = _spark(walk.resolve(field["type"]), walk)
            fields.append(T.StructField(field["name"], dtype, nullable))
        walk.entered.pop()
        return T.StructType(fields), False
    if kind == "array":
        item, nullable = _spark(walk.resolve(schema["items"]), walk)
        return T.ArrayType(item, nullable), False
    if kind == "map":
        value, nullable = _spark(walk.resolve(schema["values"]), walk)
        return T.MapType(T.StringType(), value, nullable), False
    raise AvroSchemaError(f"Avro type {kind!r} has no Spark type")


def _branches(schema: list[Any], walk: _Walk) -> list[Any]:
    return [walk.resolve(b) for b in schema if _type_name(b) != "null"]


def _union(schema: list[Any], walk: _Walk) -> tuple[DataType, bool]:
    from pyspark.sql import types as T

    branches = _branches(schema, walk)
    nullable = len(branches) < len(schema)
    if not branches:
        return T.NullType(), True
    if len(branches) == 1:
        dtype, _ = _spark(branches[0], walk)
        return dtype, nullable
    plain = {_type_name(b) for b in branches if _logical(b) is None}
    if len(plain) == len(branches) and plain <= {"int", "long"}:
        return T.LongType(), nullable
    if len(plain) == len(branches) and plain <= {"float", "double"}:
        return T.DoubleType(), nullable
    members = [
        T.StructField(f"member{i}", _spark(b, walk)[0], True) for i, b in enumerate(branches)
    ]
    return T.StructType(members), nullable


# ---------------------------------------------------------------- values


def converter(schema: Any) -> Convert | None:
    """How to turn a value fastavro read with ``schema`` into what Arrow takes; None: as is."""
    walk = _Walk()
    return _convert(walk.resolve(schema), walk)


def _time_millis(value: datetime.time) -> int:
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 1000 + value.microsecond // 1000


def _time_micros(value: datetime.time) -> int:
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond


def _uuid_text(value: Any) -> Any:
    return str(value) if isinstance(value, uuid.UUID) else value


def _convert(schema: Any, walk: _Walk) -> Convert | None:
    if isinstance(schema, list):
        return _convert_union(schema, walk)
    connect = _connect_convert(schema)
    if connect is not None:
        return connect
    kind = _type_name(schema)
    logical = _logical(schema)
    if logical == "uuid":
        return _uuid_text
    if logical == "time-millis" and kind == "int":
        return lambda v: v if v is None else _time_millis(v)
    if logical == "time-micros" and kind == "long":
        return lambda v: v if v is None else _time_micros(v)
    if kind in ("record", "error"):
        name = schema["name"]
        if name in walk.entered:
            return None
        walk.entered.append(name)
        fields = [(f["name"], _convert(walk.resolve(f["type"]), walk)) for f in schema["fields"]]
        walk.entered.pop()
        changing = [(n, f) for n, f in fields if f is not None]
        if not changing:
            return None
        return lambda v: v if v is None else _record(v, changing)
    if kind == "array":
        item = _convert(walk.resolve(schema["items"]), walk)
        if item is None:
            return None
        return lambda v: v if v is None else [item(x) for x in v]
    if kind == "map":
        value = _convert(walk.resolve(schema["values"]), walk)
        if value is None:
            return None
        return lambda v: v if v is None else {k: value(x) for k, x in v.items()}
    return None


def _record(value: dict[str, Any], changing: list[tuple[str, Convert]]) -> dict[str, Any]:
    out = dict(value)
    for name, convert in changing:
        out[name] = convert(out.get(name))
    return out


def _python_check(schema: Any) -> Callable[[Any], bool]:
    """Whether a Python value is one fastavro reads for this branch."""
    kind = _type_name(schema)
    logical = _logical(schema)
    if logical == "decimal":
        return lambda v: isinstance(v, Decimal)
    if logical == "date":
        return lambda v: isinstance(v, datetime.date) and not isinstance(v, datetime.datetime)
    if logical is not None and "timestamp" in logical:
        return lambda v: isinstance(v, datetime.datetime)
    if logical in ("time-millis", "time-micros"):
        return lambda v: isinstance(v, datetime.time)
    if logical == "uuid":
        return lambda v: isinstance(v, uuid.UUID | str)
    checks: dict[str, Callable[[Any], bool]] = {
        "boolean": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "long": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, float),
        "double": lambda v: isinstance(v, float),
        "bytes": lambda v: isinstance(v, bytes),
        "fixed": lambda v: isinstance(v, bytes),
        "string": lambda v: isinstance(v, str),
        "enum": lambda v: isinstance(v, str),
        "array": lambda v: isinstance(v, list),
        "map": lambda v: isinstance(v, dict),
    }
    if kind in ("record", "error"):
        names = {f["name"] for f in schema["fields"]}
        return lambda v: isinstance(v, dict) and set(v) <= names
    return checks.get(kind, lambda v: False)


def _convert_union(schema: list[Any], walk: _Walk) -> Convert | None:
    branches = _branches(schema, walk)
    if len(branches) == 1:
        return _convert(branches[0], walk)
    plain = {_type_name(b) for b in branches if _logical(b) is None}
    if len(plain) == len(branches) and (plain <= {"int", "long"} or plain <= {"float", "double"}):
        return None
    members = [(f"member{i}", _python_check(b), _convert(b, walk)) for i, b in enumerate(branches)]

    def to_members(value: Any) -> Any:
        if value is None:
            return None
        for name, takes, convert in members:
            if takes(value):
                return {name: value if convert is None else convert(value)}
        raise ValueError(f"value of type {type(value).__name__} matches no union branch")

    return to_members
