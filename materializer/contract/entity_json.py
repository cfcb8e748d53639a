"""Table rows as entity JSON, byte for byte the encoding the materializer writes to Redis.

The pipeline serializes entities with Spark's ``to_json`` and
``materializer.encoding.JSON_OPTIONS`` in a UTC session (Jackson
underneath): null fields left out (in nested structs too; array elements and
map values stay), timestamps as ``yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX`` (``Z`` for
UTC), timestamps without a zone without the offset, dates as ``yyyy-MM-dd``,
binary as base64, doubles and floats as Java prints them (``1.0``, ``1.0E7``,
``9.99E-4``), decimals with their scale (``1.50``), non-finite doubles as the
strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``. Rows read back from the
Delta table are encoded the same way here, so a query's entity and a lookup's
entity can be compared, and ``materializer rehydrate`` can rebuild a Redis map
that ``materializer verify`` finds identical.

One known gap: Java 17's ``Double.toString`` and ``Float.toString`` print
some numbers with more digits than needed (``5.6843418860808015E-14`` for
2^-44, ``1.23456792E8`` for the float 123456792); this encoder prints the
shortest digits, which read back as the same number. Typical values (decimal
fractions, measurements) print alike; random bit patterns differ about once in
300.

Rehydrating a map encodes millions of rows, so the encoding is column-wise:
each flat column becomes its ``,"name":value`` fragments with Arrow compute
kernels (no Python object per value), and the fragments of a row are joined
the same way. Only values Arrow cannot print as Java does (nested types,
binary, decimals, floats, doubles outside ``[1e-3, 1e7)``, strings with control
characters) go through Python, one value at a time.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Collection
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

Convert = Callable[[Any], Any]
"""One non-null Python value (as pyarrow gives it) into what orjson writes as Spark would."""

Data = Any
"""A ``pyarrow.Table`` or ``pyarrow.RecordBatch``."""


def encode_rows(
    table: Data, key_column: str, skip: Collection[str] = ()
) -> list[tuple[str, bytes]]:
    """``(key, entity JSON)`` per row; the entity holds every column but ``key_column`` and
    ``skip`` (the table's own columns, ``materializer.contract.table_layout.table_meta``)."""
    keys, values = encode_columns(table, key_column, skip)
    return list(zip(keys.to_pylist(), values.to_pylist(), strict=True))


def encode_columns(
    data: Data, key_column: str, skip: Collection[str] = ()
) -> tuple[pa.Array, pa.Array]:
    """The keys (string) and entity JSON (binary) of every row, as two Arrow arrays."""
    keys = _flat(data.column(key_column))
    if not pa.types.is_string(keys.type):
        keys = pc.cast(keys, pa.string())
    fields = [f for f in data.schema if f.name != key_column and f.name not in skip]
    if not fields:
        return keys, pa.array([b"{}"] * len(keys), pa.binary())
    fragments = [_fragments(f.name, _flat(data.column(f.name))) for f in fields]
    joined = pc.binary_join_element_wise(b"{", *fragments, b"}", b"")
    # Every present field starts with its comma: the one right after the brace goes.
    return keys, pc.replace_substring(joined, "{,", "{", max_replacements=1)


def _flat(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous array; view types (delta-rs reads strings as views) as plain ones."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = array.type
    if _is(kind, "string_view") or pa.types.is_large_string(kind):
        return pc.cast(array, pa.string())
    if _is(kind, "binary_view") or pa.types.is_large_binary(kind):
        return pc.cast(array, pa.binary())
    return array


def _fragments(name: str, values: pa.Array) -> pa.Array:
    """``,"name":value`` per row (binary), empty where the value is null."""
    prefix = b"," + orjson.dumps(name) + b":"
    text = _json_text(values)
    fragment = pc.binary_join_element_wise(prefix, pc.cast(text, pa.binary()), b"")
    return pc.fill_null(fragment, b"")


def _json_text(values: pa.Array) -> pa.Array:
    """Each value's JSON text (string), null where the value is null."""
    if len(values) == 0:  # numpy's fixed-width layouts cannot shape zero rows
        return pa.array([], pa.string())
    kind = values.type
    if pa.types.is_string(kind):
        return _strings(values)
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return pc.cast(values, pa.string())
    if pa.types.is_float64(kind):
        return _doubles(values)
    if pa.types.is_timestamp(kind):
        return _timestamps(values)
    if pa.types.is_date32(kind):
        return _dates(values)
    return _python(values, _converter(kind))


def _timestamps(values: pa.Array) -> pa.Array:
    """``"yyyy-MM-ddTHH:mm:ss.SSSSSS"`` (``Z`` before the quote when zoned), digit by digit.

    Arrow's ``strftime`` costs microseconds per value, more than the rest of
    a row; the text has a fixed width, so numpy writes its digits instead.
    Years outside 1-9999 (no fixed width) go through Python.
    """
    zoned = values.type.tz is not None
    micros = pc.cast(pc.cast(values, pa.timestamp("us", values.type.tz), safe=False), pa.int64())
    raw = np.asarray(pc.fill_null(micros, 0))
    days, in_day = np.divmod(raw, 86_400_000_000)
    seconds, fraction = np.divmod(in_day, 1_000_000)
    year, month, day = _civil(days)
    layout = '"0000-00-00T00:00:00.000000' + ('Z"' if zoned else '"')
    out = np.frombuffer(layout.encode() * len(raw), np.uint8).reshape(len(raw), -1).copy()
    for column, number, width in (
        (1, year, 4),
        (6, month, 2),
        (9, day, 2),
        (12, seconds // 3600, 2),
        (15, seconds // 60 % 60, 2),
        (18, seconds % 60, 2),
        (21, fraction, 6),
    ):
        _write_digits(out, column, number, width)
    text = _fixed_width(out, micros)
    odd = pc.fill_null(pc.or_(pc.less(year, 1), pc.greater(year, 9999)), False)
    convert = _timestamp if zoned else _timestamp_ntz
    return _patch(text, values, odd, convert)


def _dates(values: pa.Array) -> pa.Array:
    """``"yyyy-MM-dd"``, written as ``_timestamps`` writes its date part."""
    days = np.asarray(pc.fill_null(pc.cast(values, pa.int32()), 0)).astype(np.int64)
    year, month, day = _civil(days)
    out = np.frombuffer(b'"0000-00-00"' * len(days), np.uint8).reshape(len(days), -1).copy()
    for column, number, width in ((1, year, 4), (6, month, 2), (9, day, 2)):
        _write_digits(out, column, number, width)
    text = _fixed_width(out, values)
    odd = pc.fill_null(pc.or_(pc.less(year, 1), pc.greater(year, 9999)), False)
    return _patch(text, values, odd, _date)


def _civil(days: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Year, month, day of days since 1970-01-01 (proleptic Gregorian, H. Hinnant's method)."""
    shifted = days + 719_468
    era = np.floor_divide(shifted, 146_097)
    day_of_era = shifted - era * 146_097
    year_of_era = (
        day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096
    ) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = np.where(shifted_month < 10, shifted_month + 3, shifted_month - 9)
    year = year_of_era + era * 400 + (month <= 2)
    return year, month, day


def _write_digits(out: np.ndarray, column: int, number: np.ndarray, width: int) -> None:
    """Zero-padded decimal digits of ``number`` into ``out[:, column:column + width]``."""
    rest = np.abs(number)
    for position in range(column + width - 1, column - 1, -1):
        out[:, position] = rest % 10 + 48
        rest = rest // 10


def _fixed_width(out: np.ndarray, nulls_of: pa.Array) -> pa.Array:
    """Rows of equal width as a string array, null where ``nulls_of`` is."""
    rows, width = out.shape
    offsets = pa.py_buffer(np.arange(0, (rows + 1) * width, width, dtype=np.int32).tobytes())
    text = pa.Array.from_buffers(pa.string(), rows, [None, offsets, pa.py_buffer(out.tobytes())])
    if nulls_of.null_count:
        return pc.if_else(pc.is_valid(nulls_of), text, pa.scalar(None, pa.string()))
    return text


def _strings(values: pa.Array) -> pa.Array:
    """JSON strings: backslash and quote escaped by Arrow; control characters by orjson.

    Most columns hold neither, and one scan for them costs less than the two
    replacement passes it saves.
    """
    special = pc.fill_null(pc.match_substring_regex(values, '["\\\\\\x00-\\x1f]'), False)
    if not pc.any(special).as_py():
        return pc.binary_join_element_wise('"', values, '"', "")
    escaped = pc.replace_substring(pc.replace_substring(values, "\\", "\\\\"), '"', '\\"')
    text = pc.binary_join_element_wise('"', escaped, '"', "")
    control = pc.fill_null(pc.match_substring_regex(values, "[\\x00-\\x1f]"), False)
    return _patch(text, values, control, _same)


def _doubles(values: pa.Array) -> pa.Array:
    """Java's ``Double.toString``: Arrow's shortest digits within ``[1e-3, 1e7)``, else Python's.

    Inside that range Java prints plain decimals with at least one fraction
    digit, which is Arrow's text plus ``.0`` when it has no point.
    """
    magnitude = pc.abs(values)
    plain = pc.or_(
        pc.and_(pc.greater_equal(magnitude, 1e-3), pc.less(magnitude, 1e7)),
        pc.equal(values, 0.0),
    )
    text = pc.cast(values, pa.string())
    pointless = pc.invert(pc.match_substring(text, "."))
    text = pc.if_else(pointless, pc.binary_join_element_wise(text, ".0", ""), text)
    rest = pc.fill_null(pc.invert(plain), False)
    return _patch(text, values, rest, _double)


def _patch(text: pa.Array, values: pa.Array, mask: pa.Array, convert: Convert) -> pa.Array:
    """``text`` with the rows under ``mask`` encoded from ``values`` in Python instead."""
    if not pc.any(mask).as_py():
        return text
    chosen = pc.filter(values, mask).to_pylist()
    encoded = pa.array([orjson.dumps(convert(v)).decode() for v in chosen], pa.string())
    return pc.replace_with_mask(text, mask, encoded)


def _python(values: pa.Array, convert: Convert) -> pa.Array:
    """Each value through Python and orjson: the types Arrow's kernels cannot print as Java."""
    return pa.array(
        [None if v is None else orjson.dumps(convert(v)).decode() for v in values.to_pylist()],
        pa.string(),
    )


def _converter(kind: pa.DataType) -> Convert:
    if pa.types.is_timestamp(kind):
        return _timestamp if kind.tz is not None else _timestamp_ntz
    if pa.types.is_date(kind):
        return _date
    if pa.types.is_float64(kind):
        return _double
    if pa.types.is_floating(kind):
        return _float
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


def _double(value: float) -> Any:
    if math.isfinite(value):
        return orjson.Fragment(java_number(repr(value)))
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _float(value: float) -> Any:
    """A float column (Spark's FLOAT): Java's ``Float.toString`` of the shortest float digits."""
    if not math.isfinite(value):
        return _double(value)
    return orjson.Fragment(java_number(np.format_float_positional(np.float32(value), unique=True)))


def java_number(shortest: str) -> str:
    """Java's ``Double.toString`` layout of a finite number given by its shortest digits.

    Plain with at least one fraction digit when ``1e-3 <= |x| < 1e7``, else
    ``d.dddE<n>``; zero keeps its sign.
    """
    number = Decimal(shortest)
    sign = "-" if number.is_signed() else ""
    magnitude = abs(number)
    if magnitude == 0:
        return f"{sign}0.0"
    if Decimal("1e-3") <= magnitude < Decimal("1e7"):
        text = format(magnitude, "f")
        return sign + (text if "." in text else f"{text}.0")
    digits, exponent = magnitude.normalize().as_tuple()[1:]
    mantissa = "".join(map(str, digits))
    power = len(digits) + int(exponent) - 1
    return f"{sign}{mantissa[0]}.{mantissa[1:] or '0'}E{power}"


def _decimal(value: Decimal) -> Any:
    """Jackson writes ``BigDecimal.toString``: the scale kept, Python's ``str`` agrees."""
    return orjson.Fragment(str(value))


def _binary(value: bytes) -> str:
    return base64.b64encode(value).decode()
