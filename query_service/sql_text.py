"""An SQL answer and its parameters as text, the same wherever they are shown: the JSON
answer's parts (``columns``, ``rows``, ``table_json``, ``dumps``) that the HTTP front
answers and ``materializer sql --format json`` prints, a value's text in a cell
(``text_of``: the console's table, the CLI's table and CSV), and a parameter typed from
text (``text_param``: the CLI's ``--param``, the console's lines).

It sits beside the client, on the published side: it takes the client's ``TableRead``,
and imports nothing of the service's servers, so a command line reaches it without them.
"""

from __future__ import annotations

import base64
import re
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import orjson
import pyarrow as pa

from query_service.client import TableRead

_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


def columns(schema: pa.Schema) -> list[dict[str, str]]:
    """Each column's answer name (``_names``) and Arrow type."""
    return [
        {"name": name, "type": str(field.type)}
        for name, field in zip(_names(schema), schema, strict=True)
    ]


def _names(schema: pa.Schema) -> list[str]:
    """The column names, a repeated one numbered (``_key``, ``_key_2``): a JSON object
    holds a name once, and a join of two maps repeats ``_key``."""
    seen: dict[str, int] = {}
    names = []
    for name in schema.names:
        count = seen.get(name, 0) + 1
        seen[name] = count
        names.append(name if count == 1 else f"{name}_{count}")
    return names


def rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The batch's rows as objects keyed by their answer names (``_names``)."""
    names = _names(batch.schema)
    values = [_pylist(column) for column in batch.columns]
    return [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)]


def _pylist(column: pa.Array) -> list[Any]:
    try:
        values: list[Any] = column.to_pylist()
    except OverflowError:
        # A date or time outside Python's years 1 to 9999: Arrow's own text of it.
        values = column.cast(pa.string()).to_pylist()
    return values


def table_json(table: TableRead) -> dict[str, Any]:
    """One table read, as the HTTP front's ``TableRead``: offsets by topic, then by
    partition, both sorted."""
    mark = table.watermark
    watermark = None
    if mark is not None:
        offsets: dict[str, dict[str, int]] = {}
        for (topic, partition), offset in sorted(mark.offsets.items()):
            offsets.setdefault(topic, {})[str(partition)] = offset
        watermark = {
            "batch_id": mark.batch_id,
            "offsets": offsets,
            "updated_at": _iso_ms(mark.updated_at_ms) if mark.updated_at_ms else None,
        }
    return {
        "map": table.map,
        "version": table.version,
        "watermark": watermark,
        "redis": table.redis,
        "index": table.index,
    }


def text_of(value: Any) -> str:
    """A value as a person reads it in a cell (the console's table, the CLI's table and
    CSV): text as it is, binary as base64, decimals exactly, times in ISO 8601, nested
    values as JSON; SQL NULL as ``null``."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    return dumps(value).decode()


def text_param(text: str) -> None | bool | int | float | str:
    """A parameter typed as text, as the CLI's ``--param`` and the console take one: a JSON
    number, ``true``, ``false``, ``null`` or a JSON string (``"42"`` stays text); anything
    else is the text as it is. An integer stays exact, however long (one past 64 bits
    is refused by the client's ``sql_param``, not rounded to a float)."""
    if _INTEGER.fullmatch(text.strip()):
        return int(text)
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return text


def dumps(body: Any) -> bytes:
    """JSON of an answer or a part of it: decimals as text, binary as base64 (``_value``)."""
    return orjson.dumps(body, default=_value, option=orjson.OPT_PASSTHROUGH_DATACLASS)


def _value(value: Any) -> Any:
    """What orjson cannot write: decimals exactly, as text; bytes as base64; a
    nanosecond timestamp (pandas' ``datetime`` subclass, which ``now()`` gives) in
    ISO 8601 with its nanoseconds; an interval as its months, days and nanoseconds."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, pa.MonthDayNano):
        return {"months": value.months, "days": value.days, "nanoseconds": value.nanoseconds}
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
