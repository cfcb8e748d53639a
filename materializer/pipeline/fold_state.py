"""The stateful folds, ``merge`` and ``aggregate``: state per key in Spark's state store.

Both run ``transformWithStateInPandas`` grouped by ``__key`` in ``update``
mode, with a value state per key, and honour the fold's output contract: one
row per key touched by the micro-batch, ``__key``, ``__deleted`` and
``__entity`` (a struct; null when deleted), carrying the key's state after the
batch. The state is checkpointed with the source offsets, so a replayed batch
starts again from the state before it.

Why not ``applyInPandasWithState``: in PySpark 4.0.0 its worker reads the
per-group bookkeeping from a struct column that pyarrow >= 2x turns into
floats when the batch has more rows than keys, and every batch where a key has
two events fails (``RecordBatch.slice``: 'float' object cannot be interpreted
as an integer). ``transformWithStateInPandas`` sends plain columns.

Order: within a batch each key's events fold in ``(partition, offset)`` order;
batches fold in the order they come. Kafka orders a partition only, so a key
whose events span partitions folds them in batch order, then partition order.

A delete (a tombstone, or an event matching ``delete_when``) removes the state:
the key's row says ``__deleted`` and a later event starts a fresh entity.

The processors run on the executors and must pickle: module-level classes
holding plain data. They see only strings, integers and booleans; the JVM
encodes each typed value before the fold and decodes the results after it, so
no Spark type is bent by pandas or the pickled state (no float for a big long,
no NaN for a null, no lost microseconds or decimal digits).

``merge``
    The entity is a JSON object; each event is an RFC 7386 merge patch onto it
    (nested objects merge, ``null`` removes a member, arrays and other values
    replace). The patch is the event's decoded fields (after the transforms)
    without their nulls, plus the explicit ``null`` members the raw JSON value
    holds where the decoded field is null too: a decoded record cannot tell
    "absent" from "null", the raw value can. For formats other than JSON the
    raw value is not JSON and the patch is the non-null decoded fields.
    State: the entity as a JSON string. Output ``__entity``: the records'
    entity struct (the same schema as ``latest``), read from that JSON.

``aggregate``
    ``__entity`` is a struct of the declared aggregates, in their declared
    order, and nothing else (the key is ``__key``; declare ``last`` of the key
    field to carry it in the entity). ``count`` counts events (with a
    ``field``, events where it is not null); ``sum``, ``min``, ``max`` ignore
    nulls (null until a non-null value); ``first`` / ``last`` take the field's
    value, null included, at the entity's first / latest event. Types:
    ``count`` LONG; ``sum`` of integers LONG (null if it overflows), of
    FLOAT/DOUBLE DOUBLE, of DECIMAL(p, s) DECIMAL(min(38, p + 10), s);
    ``min`` / ``max`` / ``first`` / ``last`` the field's type. ``min`` / ``max``
    take numbers, strings, booleans, dates and timestamps (NaN is the
    greatest double, as in Spark SQL); ``first`` / ``last`` take any type.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Context, Decimal
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from materializer.config import FoldConfig
from materializer.errors import ConfigError
from materializer.pipeline import columns as c
from materializer.sinks.encoding import JSON_OPTIONS

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.streaming.stateful_processor import TimerValues

_PATCH = "__patch"
_JSON = "__json"
_STATE = "entity"

# ---------------------------------------------------------------- driver side


def _entity_schema(records: DataFrame) -> T.StructType:
    """The entity's fields (every column that is not the pipeline's own) as a struct."""
    return T.StructType([f for f in records.schema.fields if not c.is_internal(f.name)])


def _field(name: str) -> Column:
    """An entity field by its exact name (a flattened ``a.b`` is one column, not a path)."""
    return F.col("`" + name.replace("`", "``") + "`")


def _has_decimal(dtype: T.DataType) -> bool:
    if isinstance(dtype, T.DecimalType):
        return True
    if isinstance(dtype, T.StructType):
        return any(_has_decimal(f.dataType) for f in dtype.fields)
    if isinstance(dtype, T.ArrayType):
        return _has_decimal(dtype.elementType)
    if isinstance(dtype, T.MapType):
        return _has_decimal(dtype.keyType) or _has_decimal(dtype.valueType)
    return False


def _run(
    records: DataFrame, processor: StatefulProcessor, output: list[T.StructField], *inputs: Column
) -> DataFrame:
    """Group by key and run the processor: it reads key, order, delete flag, then ``inputs``."""
    columns = [F.col(c.KEY), F.col(c.PARTITION), F.col(c.OFFSET), F.col(c.DELETED), *inputs]
    schema = T.StructType(
        [
            T.StructField(c.KEY, T.StringType()),
            T.StructField(c.DELETED, T.BooleanType()),
            *output,
        ]
    )
    return (
        records.select(*columns)
        .groupBy(c.KEY)
        .transformWithStateInPandas(processor, schema, outputMode="Update", timeMode="None")
    )


def fold_merge(records: DataFrame, fold: FoldConfig) -> DataFrame:
    """JSON merge patch of each event onto the entity; one row per key touched."""
    schema = _entity_schema(records)
    patch = F.to_json(F.struct(*[_field(f.name) for f in schema.fields]), JSON_OPTIONS)
    folded = _run(
        records,
        MergeFold(_has_decimal(schema)),
        [T.StructField(_JSON, T.StringType())],
        patch.alias(_PATCH),
        F.col(c.VALUE),
    )
    return folded.select(
        c.KEY, c.DELETED, F.from_json(F.col(_JSON), schema, JSON_OPTIONS).alias(c.ENTITY)
    )


@dataclass(frozen=True)
class Aggregate:
    """How one declared aggregate travels: its input column, Python kind and output type.

    ``kind`` is how the Python side reads the encoded value: ``count``,
    ``int``, ``float``, ``decimal``, ``str``, ``bool``, ``day`` (a date as days
    since the epoch), ``micros`` (a timestamp as microseconds since the epoch)
    or ``json`` (``first`` / ``last``: the value as the JSON text ``{"v": ...}``).
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
        return Aggregate(name, fn, "count", col.isNotNull(), T.LongType())
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
    """The JVM side of an aggregate's result: its encoded value back to its output type."""
    if agg.kind == "count":
        return value
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
    plan = [_plan(records, name, s.fn, s.field) for name, s in fold.aggregates.items()]
    specs = tuple((a.fn, a.kind, a.column is not None) for a in plan)
    output = [
        T.StructField(f"__out{i}", T.LongType() if a.kind == "count" else T.StringType())
        for i, a in enumerate(plan)
    ]
    inputs = [a.column.alias(f"__in{i}") for i, a in enumerate(plan) if a.column is not None]
    folded = _run(records, AggregateFold(specs), output, *inputs)
    entity = F.struct(*[_decoded(a, F.col(f"__out{i}")).alias(a.name) for i, a in enumerate(plan)])
    return folded.select(
        c.KEY,
        c.DELETED,
        F.when(F.col(c.DELETED), F.lit(None)).otherwise(entity).alias(c.ENTITY),
    )


# ------------------------------------------------------------- executor side


def _events(pdfs: Iterator[pd.DataFrame]) -> pd.DataFrame:
    """One key's rows of the batch, in (partition, offset) order."""
    import pandas as pd

    chunks = list(pdfs)
    rows = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
    return rows.sort_values([c.PARTITION, c.OFFSET], kind="stable")


def _row(columns: dict[str, Any]) -> pd.DataFrame:
    """The one output row of a key."""
    import pandas as pd

    return pd.DataFrame({name: [value] for name, value in columns.items()})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: ``patch`` applied to ``target`` (which it may modify); the result."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for name, value in patch.items():
        if value is None:
            target.pop(name, None)
        else:
            target[name] = merge_patch(target.get(name), value)
    return target


def with_explicit_nulls(patch: dict[str, Any], raw: dict[str, Any]) -> None:
    """Add to ``patch`` the null members of ``raw`` that the patch lacks, at every depth."""
    for name, value in raw.items():
        if value is None:
            patch.setdefault(name, None)
        elif isinstance(value, dict):
            inner = patch.get(name)
            if isinstance(inner, dict):
                with_explicit_nulls(inner, value)


def _raw_object(value: bytes | None) -> dict[str, Any] | None:
    """The raw value as a JSON object, if it is one."""
    if not value or value.lstrip()[:1] != b"{":
        return None
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _int_or_decimal(text: str) -> int | Decimal:
    return int(text) if len(text) < 19 else Decimal(text)


def _as_fragment(value: Any) -> orjson.Fragment:
    if isinstance(value, int | Decimal):
        return orjson.Fragment(str(value))
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _loads(text: str, precise: bool) -> Any:
    """JSON text to Python; ``precise`` keeps decimals and big integers exact."""
    if precise:
        return json.loads(text, parse_float=Decimal, parse_int=_int_or_decimal)
    return orjson.loads(text)


def _dumps(doc: Any) -> str:
    return orjson.dumps(doc, default=_as_fragment).decode()


class MergeFold(StatefulProcessor):
    """Executor side of ``merge``: the entity's JSON text in a value state per key.

    ``precise`` (the entity holds decimals) parses JSON with the standard
    library into ``Decimal`` rather than with orjson into floats.
    """

    def __init__(self, precise: bool) -> None:
        self.precise = precise

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state."""
        schema = T.StructType([T.StructField(_STATE, T.StringType())])
        self.state = handle.getValueState(_STATE, schema)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        """Fold one key's events of the batch onto its entity; yield the key's row."""
        events = _events(rows)
        if events.empty:
            return
        saved = self.state.get()
        entity = None if saved is None else _loads(saved[0], self.precise)
        for deleted, patch_text, value in events[[c.DELETED, _PATCH, c.VALUE]].itertuples(
            index=False, name=None
        ):
            if deleted:
                entity = None
                continue
            patch = _loads(patch_text, self.precise)
            raw = _raw_object(value)
            if raw is not None:
                with_explicit_nulls(patch, raw)
            entity = merge_patch(entity, patch)
        text = None if entity is None else _dumps(entity)
        if text is None:
            self.state.clear()
        else:
            self.state.update((text,))
        yield _row({c.KEY: key[0], c.DELETED: text is None, _JSON: text})

    def close(self) -> None:
        """Nothing to release."""


_DECIMALS = Context(prec=100)


def _read(kind: str, text: str | None) -> Any:
    """An encoded value (column or state) as Python."""
    if text is None:
        return None
    if kind in ("int", "day", "micros", "count"):
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "decimal":
        return Decimal(text)
    if kind == "bool":
        return text == "true"
    return text


def _write(kind: str, value: Any) -> str | None:
    """A Python value encoded as the JVM side decodes it."""
    if value is None:
        return None
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


def _order(kind: str, value: Any) -> Any:
    """The sort key of a value: NaN above every double, as in Spark SQL."""
    if kind == "float":
        return (math.isnan(value), value)
    return value


def _step(fn: str, kind: str, current: Any, value: Any, first_event: bool) -> Any:
    """One event's effect on one aggregate."""
    if fn == "count":
        return current + (1 if value is None or value else 0)
    if fn == "last":
        return value
    if fn == "first":
        return value if first_event else current
    if value is None:
        return current
    if current is None:
        return value
    if fn == "sum":
        return _DECIMALS.add(current, value) if kind == "decimal" else current + value
    if fn == "min":
        return value if _order(kind, value) < _order(kind, current) else current
    return value if _order(kind, value) > _order(kind, current) else current


class AggregateFold(StatefulProcessor):
    """Executor side of ``aggregate``: event count and encoded aggregates in a value state.

    ``specs`` holds ``(fn, kind, has_input)`` per aggregate; the inputs are the
    columns ``__in<i>`` of those with an input, in order.
    """

    def __init__(self, specs: Sequence[tuple[str, str, bool]]) -> None:
        self.specs = tuple(specs)

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state: the entity's events, then each aggregate encoded."""
        schema = T.StructType(
            [
                T.StructField("events", T.LongType()),
                *[T.StructField(f"a{i}", T.StringType()) for i in range(len(self.specs))],
            ]
        )
        self.state = handle.getValueState(_STATE, schema)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        """Fold one key's events of the batch into its aggregates; yield the key's row."""
        events = _events(rows)
        if events.empty:
            return
        specs = self.specs
        fresh: list[Any] = [0 if fn == "count" else None for fn, _, _ in specs]
        saved = self.state.get()
        alive = saved is not None
        if saved is None:
            seen, values = 0, list(fresh)
        else:
            seen = saved[0]
            values = [
                _read(kind, text) for (_, kind, _), text in zip(specs, saved[1:], strict=True)
            ]
        inputs = [c.DELETED, *[n for n in events.columns if n.startswith("__in")]]
        for row in events[inputs].itertuples(index=False, name=None):
            if row[0]:
                alive, seen, values = False, 0, list(fresh)
                continue
            column = 1
            for i, (fn, kind, has_input) in enumerate(specs):
                value: Any = None
                if has_input:
                    value = row[column]
                    column += 1
                    if kind not in ("count", "json"):
                        value = _read(kind, value)
                values[i] = _step(fn, kind, values[i], value, seen == 0)
            alive, seen = True, seen + 1
        encoded = [_write(kind, v) for (_, kind, _), v in zip(specs, values, strict=True)]
        if alive:
            self.state.update((seen, *encoded))
        else:
            self.state.clear()
        out: dict[str, Any] = {c.KEY: key[0], c.DELETED: not alive}
        for i, (_, kind, _) in enumerate(specs):
            out[f"__out{i}"] = values[i] if kind == "count" else encoded[i]
        yield _row(out)

    def close(self) -> None:
        """Nothing to release."""
