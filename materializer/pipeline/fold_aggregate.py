"""The ``aggregate`` fold: the declared aggregates per key, in Spark's state store.

It runs ``applyInPandasWithState`` grouped by ``__key`` in ``update`` mode and
honours the fold's output contract: one row per key touched by the
micro-batch, ``__key``, ``__deleted`` and ``__entity`` (a struct; null when
deleted), carrying the key's aggregates after the batch. The state is
checkpointed with the source offsets, so a replayed batch starts again from
the state before it.

``__entity`` is a struct of the declared aggregates, in their declared order,
and nothing else (the key is ``__key``; declare ``last`` of the key field to
carry it in the entity). ``count`` counts events (with a ``field``, events
where it is not null); ``sum``, ``min``, ``max`` ignore nulls (null until a
non-null value); ``first`` / ``last`` take the field's value, null included,
at the entity's first / latest event. Types: ``count`` LONG; ``sum`` of
integers LONG (null if it overflows), of FLOAT/DOUBLE DOUBLE, of
DECIMAL(p, s) DECIMAL(min(38, p + 10), s); ``min`` / ``max`` / ``first`` /
``last`` the field's type. ``min`` / ``max`` take numbers, strings, booleans,
dates and timestamps (NaN is the greatest double, as in Spark SQL); ``first``
/ ``last`` take any type.

Order: within a batch each key's events fold in ``(partition, offset)`` order;
batches fold in the order they come. Kafka orders a partition only, so a key
whose events span partitions folds them in batch order, then partition order.

A delete (a tombstone, or an event matching ``delete_when``) removes the state:
the key's row says ``__deleted`` and a later event starts a fresh entity.

Encoding: the Python side sees only strings. The JVM encodes each typed value
before the fold and decodes the results after it, so no Spark type is bent by
pandas or the pickled state (no float for a big long, no NaN for a null, no
lost microseconds or decimal digits). An integer sum is exact in Python and
becomes null only while it is out of the LONG range.

Why this shape: the fold's cost is per key, not per event. ``applyInPandasWithState``
carries each key's state inside the Arrow batches, where
``transformWithStateInPandas`` (PySpark 4.0.0) makes several socket round trips
to the JVM per key, about 5 ms. Its worker still turns every column of every
key's chunk into a pandas Series of its own, 0.15 to 0.25 ms per column per
key, and builds a DataFrame for the key's state: that fixed cost is most of the
fold's. So each event crosses as one JSON text, ``[order, delete, input 0,
input 1, ...]``, beside the key: two columns whatever the number of
aggregates. The state and the result are one JSON text too, ``[events,
aggregate 0, aggregate 1, ...]`` (null when the entity is deleted), which the
JVM parses back into typed columns. The executor side works on plain lists: no
pandas operation runs per event, and the key's one output row is built from a
2-D object array, the cheapest public way to make a DataFrame. The worker
drains each call's rows before the next key and tells a call nothing about the
keys still to come, so rows cannot be held back and sent for many keys at once.

Requires pyarrow < 21 (see pyproject): newer pyarrow breaks PySpark 4.0.0's
reading of the per-key bookkeeping that travels beside the rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Context, Decimal
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql import functions as F
from pyspark.sql import types as T

from materializer.config import FoldConfig
from materializer.errors import ConfigError
from materializer.pipeline import columns as c
from materializer.sinks.encoding import JSON_OPTIONS

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.streaming.state import GroupState

_IN = "__in"
"""One event as JSON: ``[order, delete, input 0, ...]``, all strings or null."""
_OUT = "__out"
"""A key's aggregates after the batch as JSON, ``[events, aggregate 0, ...]``; null if deleted."""
_STATE = "aggregates"
"""The state's one field: the same JSON as ``_OUT``."""

_ORDER = 0
_DELETE = 1
_FIRST_INPUT = 2
_NO_INPUT = -1

# ---------------------------------------------------------------- driver side


def _entity_schema(records: DataFrame) -> T.StructType:
    """The entity's fields (every column that is not the pipeline's own) as a struct."""
    return T.StructType([f for f in records.schema.fields if not c.is_internal(f.name)])


def _field(name: str) -> Column:
    """An entity field by its exact name (a flattened ``a.b`` is one column, not a path)."""
    return F.col(c.quote(name))


@dataclass(frozen=True)
class Aggregate:
    """How one declared aggregate travels: its input column, Python kind and output type.

    ``kind`` is how the Python side reads the encoded value: ``count``,
    ``int``, ``float``, ``decimal``, ``str``, ``bool``, ``day`` (a date as days
    since the epoch), ``micros`` (a timestamp as microseconds since the epoch)
    or ``json`` (``first`` / ``last``: the value as the JSON text ``{"v": ...}``).
    ``column`` is the input as a string column (null where the event has no
    value), or None for ``count`` without a field.
    """

    name: str
    fn: str
    kind: str
    column: Column | None
    output: T.DataType


_MIN_MAX_TYPES = "numbers, strings, booleans, dates and timestamps"


def _plan(records: DataFrame, name: str, fn: str, field: str | None) -> Aggregate:
    """Check one aggregate against the records' fields and pick its encoding."""
    where = f"fold.aggregates.{name}"
    if field is None:
        return Aggregate(name, fn, "count", None, T.LongType())
    fields = _entity_schema(records)
    if field not in fields.names:
        known = ", ".join(fields.names)
        raise ConfigError("", [f"{where}.field: no field {field!r} in the records ({known})"])
    col = _field(field)
    dtype = fields[field].dataType
    if fn == "count":
        # Only whether the field is set matters; any type counts.
        return Aggregate(name, fn, "count", F.when(col.isNotNull(), F.lit("1")), T.LongType())
    if fn in ("first", "last"):
        wrapped = F.to_json(F.struct(col.alias("v")), JSON_OPTIONS)
        return Aggregate(name, fn, "json", wrapped, dtype)
    # (kind, encoded input, type of a sum) of the types each function takes
    encoded: tuple[str, Column, T.DataType] | None = None
    if isinstance(dtype, T.IntegralType):
        encoded = ("int", col.cast("string"), T.LongType())
    elif isinstance(dtype, T.FloatType | T.DoubleType):
        encoded = ("float", col.cast("double").cast("string"), T.DoubleType())
    elif isinstance(dtype, T.DecimalType):
        total = T.DecimalType(min(38, dtype.precision + 10), dtype.scale)
        encoded = ("decimal", col.cast("string"), total)
    elif fn != "sum" and isinstance(dtype, T.StringType):
        encoded = ("str", col, dtype)
    elif fn != "sum" and isinstance(dtype, T.BooleanType):
        encoded = ("bool", col.cast("string"), dtype)
    elif fn != "sum" and isinstance(dtype, T.DateType):
        encoded = ("day", F.unix_date(col).cast("string"), dtype)
    elif fn != "sum" and type(dtype) is T.TimestampType:
        encoded = ("micros", F.unix_micros(col).cast("string"), dtype)
    if encoded is None:
        needs = "a numeric field" if fn == "sum" else _MIN_MAX_TYPES
        raise ConfigError(
            "", [f"{where}.field: {fn} takes {needs}; {field} is {dtype.simpleString()}"]
        )
    kind, column, total_type = encoded
    return Aggregate(name, fn, kind, column, total_type if fn == "sum" else dtype)


def _decoded(agg: Aggregate, value: Column) -> Column:
    """The JVM side of an aggregate's result: its encoded text back to its output type."""
    if agg.kind == "count":
        return value.cast("long")
    if agg.kind == "json":
        wrapper = T.StructType([T.StructField("v", agg.output)])
        return F.from_json(value, wrapper, JSON_OPTIONS).getField("v")
    if agg.kind == "day":
        return F.date_from_unix_date(value.cast("int"))
    if agg.kind == "micros":
        return F.timestamp_micros(value.cast("long"))
    if agg.kind == "float":
        return value.cast("double").cast(agg.output)
    return value.try_cast(agg.output)


def fold_aggregate(records: DataFrame, fold: FoldConfig) -> DataFrame:
    """The declared aggregates per key; one row per key touched."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    plan = [_plan(records, name, s.fn, s.field) for name, s in fold.aggregates.items()]
    specs: list[tuple[str, str, int]] = []
    inputs: list[Column] = []
    for a in plan:
        if a.column is None:
            specs.append((a.fn, a.kind, _NO_INPUT))
        else:
            specs.append((a.fn, a.kind, _FIRST_INPUT + len(inputs)))
            inputs.append(a.column)
    # Fixed-width digits: the text's order is (partition, offset) order.
    order = F.format_string("%010d%019d", F.col(c.PARTITION), F.col(c.OFFSET))
    delete = F.when(F.col(c.DELETED), F.lit("1"))
    event = F.to_json(F.array(order, delete, *inputs))
    output = T.StructType(
        [T.StructField(c.KEY, T.StringType()), T.StructField(_OUT, T.StringType())]
    )
    state = T.StructType([T.StructField(_STATE, T.StringType())])
    folded = (
        records.select(F.col(c.KEY), event.alias(_IN))
        .groupBy(c.KEY)
        .applyInPandasWithState(
            AggregateFold(specs), output, state, "Update", GroupStateTimeout.NoTimeout
        )
    )
    result = F.from_json(F.col(_OUT), T.ArrayType(T.StringType()))
    entity = F.struct(
        *[_decoded(a, result.getItem(i + 1)).alias(a.name) for i, a in enumerate(plan)]
    )
    deleted = F.col(_OUT).isNull()
    return folded.select(
        c.KEY,
        deleted.alias(c.DELETED),
        F.when(deleted, F.lit(None)).otherwise(entity).alias(c.ENTITY),
    )


# ------------------------------------------------------------- executor side


_DECIMALS = Context(prec=100)


def _read(kind: str, text: str) -> Any:
    """An encoded value (input or state) as Python."""
    if kind in ("int", "day", "micros"):
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "decimal":
        return Decimal(text)
    if kind == "bool":
        return text == "true"
    return text


def _write(kind: str, value: Any) -> str:
    """A Python value encoded as the JVM side decodes it."""
    if kind == "float":
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if kind == "bool":
        return "true" if value else "false"
    if kind == "decimal":
        return format(value, "f")
    return str(value)


def _nan_last(value: float) -> tuple[bool, float]:
    """The sort key of a double: NaN above every other value, as in Spark SQL."""
    return (math.isnan(value), value)


def _fold_one(
    fn: str, kind: str, at: int, current: str | None, events: list[list[Any]], fresh: bool
) -> str | None:
    """One aggregate's encoded value after ``events`` (a live run: no delete among them).

    ``current`` is its encoded value before them, ``fresh`` whether the entity
    starts with them. Values combine in event order, the current one first,
    so sums of doubles round as a left fold does and ``min`` / ``max`` keep
    the earliest of equal values (``0.0`` before ``-0.0``).
    """
    if fn == "count":
        n = len(events) if at == _NO_INPUT else sum(1 for e in events if e[at] is not None)
        return str(n if current is None else int(current) + n)
    if fn == "last":
        value: str | None = events[-1][at]
        return value
    if fn == "first":
        return events[0][at] if fresh else current
    present = [_read(kind, e[at]) for e in events if e[at] is not None]
    if not present:
        return current
    if current is not None:
        present.insert(0, _read(kind, current))
    if fn == "sum":
        total = present[0]
        for v in present[1:]:
            total = _DECIMALS.add(total, v) if kind == "decimal" else total + v
        return _write(kind, total)
    key = _nan_last if kind == "float" else None
    best = min(present, key=key) if fn == "min" else max(present, key=key)
    return _write(kind, best)


_FRAME: tuple[Any, Any] | None = None
"""The (index, columns) every output row shares, built on first use on each executor."""


def _frame(key: str, result: str | None) -> pd.DataFrame:
    """The key's one output row, built from a 2-D array: no per-column inference."""
    global _FRAME
    import numpy as np
    import pandas as pd

    if _FRAME is None:
        _FRAME = (pd.RangeIndex(1), pd.Index([c.KEY, _OUT]))
    row = np.empty((1, 2), dtype=object)
    row[0, 0] = key
    row[0, 1] = result
    return pd.DataFrame(row, index=_FRAME[0], columns=_FRAME[1], copy=False)


class AggregateFold:
    """Executor side: one key's events of a batch folded into its aggregates.

    ``specs`` holds ``(fn, kind, at)`` per aggregate, ``at`` the index of its
    input in an event's JSON array (-1 for ``count`` without a field). A plain
    class rather than a closure: it pickles by reference with its specs.
    """

    def __init__(self, specs: Sequence[tuple[str, str, int]]) -> None:
        self.specs = tuple(specs)

    def __call__(
        self, key: tuple[Any, ...], chunks: Iterable[pd.DataFrame], state: GroupState
    ) -> Iterable[pd.DataFrame]:
        """Fold the key's events into its state; the key's one row, as a one-element list.

        PySpark takes any iterable of DataFrames: a list skips a generator's
        overhead. A key's events may come in several chunks (a group larger
        than an Arrow batch); they are joined, then put in order. ``sort`` is
        stable and, on events already in order (the usual case), one linear
        pass that moves nothing.
        """
        events: list[list[Any]] = []
        for chunk in chunks:
            events.extend(map(orjson.loads, chunk[_IN].tolist()))
        if not events:
            return []
        events.sort(key=itemgetter(_ORDER))
        last_delete = -1
        for i in range(len(events) - 1, -1, -1):
            if events[i][_DELETE] is not None:
                last_delete = i
                break
        live = events[last_delete + 1 :]
        if not live:
            state.remove()
            return [_frame(key[0], None)]
        saved = None if last_delete >= 0 else state.getOption
        values: list[str | None]
        if saved is None:
            seen, values = 0, [None] * len(self.specs)
        else:
            seen, *values = orjson.loads(saved[0])
        fresh = seen == 0
        for i, (fn, kind, at) in enumerate(self.specs):
            values[i] = _fold_one(fn, kind, at, values[i], live, fresh)
        text = orjson.dumps([seen + len(live), *values]).decode()
        state.update((text,))
        return [_frame(key[0], text)]
