"""Table rows as entity JSON, byte for byte the encoding the materializer writes to Redis.

The pipeline serializes entities with Spark's ``to_json`` and
``materializer.sinks.encoding.JSON_OPTIONS`` in a UTC session: null fields left
out (in nested structs too; array elements and map values stay), timestamps as
``yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX`` (``Z`` for UTC), timestamps without a zone
without the offset, dates as ``yyyy-MM-dd``, binary as base64, non-finite
doubles as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``. Rows read
back from the Delta table are encoded the same way here, so a query's entity
and a lookup's entity can be compared. Decimals become JSON numbers through
``float``, which may round beyond 15 significant digits.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import orjson
import pyarrow as pa

Convert = Callable[[Any], Any]
"""One non-null Python value (as pyarrow gives it) into what orjson writes as Spark would."""


def encode_rows(table: pa.Table, key_column: str) -> list[tuple[str, bytes]]:
    """``(key, entity JSON)`` per row; the entity holds every column but ``key_column``."""
    keys = table.column(key_column).to_pylist()
    fields = [f for f in table.schema if f.name != key_column]
    columns = [(f.name, _converter(f.type), table.column(f.name).to_pylist()) for f in fields]
    out: list[tuple[str, bytes]] = []
    for i, key in enumerate(keys):
        entity = {
            name: convert(values[i]) for name, convert, values in columns if values[i] is not None
        }
        out.append((str(key), orjson.dumps(entity)))
    return out


def _converter(kind: pa.DataType) -> Convert:
    if pa.types.is_timestamp(kind):
        return _timestamp if kind.tz is not None else _timestamp_ntz
    if pa.types.is_date(kind):
        return _date
    if pa.types.is_floating(kind):
        return _double
    if pa.types.is_decimal(kind):
        return _decimal
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or _is(kind, "binary_view"):
        return _binary
    if pa.types.is_map(kind):
        item = _converter(kind.item_type)
        return lambda pairs: {str(k): _nullable(item, v) for k, v in pairs}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or _is(kind, "list_view"):
        element = _converter(kind.value_type)
        return lambda items: [_nullable(element, v) for v in items]
    if pa.types.is_struct(kind):
        members = {
            kind.field(i).name: _converter(kind.field(i).type) for i in range(kind.num_fields)
        }
        return lambda row: {k: members[k](v) for k, v in row.items() if v is not None}
    return _same


def _is(kind: pa.DataType, name: str) -> bool:
    check = getattr(pa.types, f"is_{name}", None)
    return bool(check and check(kind))


def _nullable(convert: Convert, value: Any) -> Any:
    return None if value is None else convert(value)


def _same(value: Any) -> Any:
    return value


def _timestamp(value: datetime) -> str:
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _timestamp_ntz(value: datetime) -> str:
    return value.isoformat(timespec="microseconds")


def _date(value: date) -> str:
    return value.isoformat()


def _double(value: float) -> float | str:
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _decimal(value: Decimal) -> float:
    return float(value)


def _binary(value: bytes) -> str:
    return base64.b64encode(value).decode()
