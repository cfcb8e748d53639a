"""The ``aggregate`` fold: the declared aggregates per key.

``__entity`` is a struct of the declared aggregates, in their declared order,
and nothing else (the key is ``__key``; declare ``last`` of the key field to
carry it in the entity). ``count`` counts events (with a ``field``, events
where it is not null); ``sum``, ``min``, ``max`` ignore nulls (null until a
non-null value); ``first`` / ``last`` take the field's value, null included,
at the entity's first / latest event. Types: ``count`` LONG; ``sum`` of
integers LONG (null while it is out of the LONG range), of FLOAT/DOUBLE
DOUBLE, of DECIMAL(p, s) DECIMAL(min(38, p + 10), s) (null while it has more
digits); ``min`` / ``max`` / ``first`` / ``last`` the field's type. ``min`` /
``max`` take numbers, strings, booleans, dates and timestamps (NaN is the
greatest double, as in Spark SQL); ``first`` / ``last`` take any type.

Order: within a batch each key's events fold in ``(partition, offset)`` order;
batches fold in the order they come. Kafka orders a partition only, so a key
whose events span partitions folds them in batch order, then partition order.

A delete (a tombstone, or an event matching ``delete_when``) removes the
aggregates: the entity is deleted and a later event starts a fresh one.

Why a replay is safe: an aggregate is not idempotent (a count folded twice
counts twice), so the state keeps, per topic and partition, the last offset
it folded, and an event at or below it is skipped. Redis stores state and
entity together, so a batch's events of a key are folded all or none.

Encoding: Python sees only text. Spark encodes each typed value before the
fold (a decimal or a long as its digits, a date or timestamp as its number
and its JSON), so no value is bent on the way (no double for a big long, no
lost microseconds or decimal digits); an integer sum is exact in Python.
The state is ``{"p": {"topic:partition": offset}, "n": events folded since
the entity began, "v": [encoded aggregate, ...]}`` (no ``v`` when deleted);
the entity's JSON is rendered from it as Spark would write it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Context, Decimal
from typing import TYPE_CHECKING, Any

import orjson

from materializer import record_columns as c
from materializer.encoding import JSON_OPTIONS
from materializer.errors import ConfigError
from materializer.fold.base import Event, FoldMode, position

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql import types as T

_NO_INPUT = -1

# ---------------------------------------------------------------- driver side


def _entity_schema(records: DataFrame) -> T.StructType:
    """The entity's fields (every column that is not the pipeline's own) as a struct."""
    from pyspark.sql import types as T

    return T.StructType([f for f in records.schema.fields if not c.is_internal(f.name)])


def _field(name: str) -> Column:
    """An entity field by its exact name (a flattened ``a.b`` is one column, not a path)."""
    from pyspark.sql import functions as F

    return F.col(c.quote(name))


@dataclass(frozen=True)
class Aggregate:
    """How one declared aggregate travels: its input column, Python kind and output type.

    ``kind`` is how the Python side reads the encoded value: ``count``,
    ``int``, ``float``, ``decimal``, ``str``, ``bool``, ``day`` (a date as days
    since the epoch, a space, its JSON ``{"v": ...}``), ``micros`` (a
    timestamp likewise, as microseconds since the epoch) or ``json``
    (``first`` / ``last``: the value as the JSON text ``{"v": ...}``).
    ``column`` is the input as a string column (null where the event has no
    value), or None for ``count`` without a field.
    """

    name: str
    fn: str
    kind: str
    column: Column | None
    output: T.DataType


_MIN_MAX_TYPES = "numbers, strings, booleans, dates and timestamps"


def _wrapped(col: Column) -> Column:
    """The value as the JSON text ``{"v": ...}``, as the entity's JSON writes it."""
    from pyspark.sql import functions as F

    return F.to_json(F.struct(col.alias("v")), JSON_OPTIONS)


def _plan(records: DataFrame, name: str, fn: str, field: str | None) -> Aggregate:
    """Check one aggregate against the records' fields and pick its encoding."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

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
        return Aggregate(name, fn, "json", _wrapped(col), dtype)
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
        day = F.concat_ws(" ", F.unix_date(col), _wrapped(col))
        encoded = ("day", F.when(col.isNotNull(), day), dtype)
    elif fn != "sum" and type(dtype) is T.TimestampType:
        micros = F.concat_ws(" ", F.unix_micros(col), _wrapped(col))
        encoded = ("micros", F.when(col.isNotNull(), micros), dtype)
    if encoded is None:
        needs = "a numeric field" if fn == "sum" else _MIN_MAX_TYPES
        raise ConfigError(
            "", [f"{where}.field: {fn} takes {needs}; {field} is {dtype.simpleString()}"]
        )
    kind, column, total_type = encoded
    return Aggregate(name, fn, kind, column, total_type if fn == "sum" else dtype)


class AggregateMode(FoldMode):
    """``aggregate``: ordered by position; the payload is the inputs as a JSON array of
    text; ``aux`` is the topic (the replay guard keeps an offset per topic and partition)."""

    def _plans(self, records: DataFrame) -> list[Aggregate]:
        return [_plan(records, n, s.fn, s.field) for n, s in self.fold.aggregates.items()]

    def entity(self, records: DataFrame) -> Column:
        """The aggregates' inputs, a JSON array of text (the payload, not an entity)."""
        from pyspark.sql import functions as F

        inputs = [a.column for a in self._plans(records) if a.column is not None]
        return F.to_json(F.array(*inputs)) if inputs else F.lit("[]")

    def entity_type(self, records: DataFrame) -> T.StructType:
        """The aggregates' output types, in their declared order."""
        from pyspark.sql import types as T

        return T.StructType([T.StructField(a.name, a.output) for a in self._plans(records)])

    def order(self, records: DataFrame) -> Column:
        """Partition and offset only: batches fold in the order they come."""
        return position()

    def payload(self, entity: Column) -> Column:
        """The inputs' JSON array as it is."""
        return entity

    def aux(self, records: DataFrame) -> Column | None:
        """The record's topic: offsets are per topic and partition."""
        from pyspark.sql import functions as F

        return F.col(c.TOPIC)

    def folder(self, records: DataFrame) -> AggregateFolder:
        """The aggregates' specs, each with its input's place in the payload."""
        specs: list[Spec] = []
        inputs = 0
        for a in self._plans(records):
            at = _NO_INPUT if a.column is None else inputs
            inputs += a.column is not None
            specs.append(Spec(a.name, a.fn, a.kind, at, _limit(a.output)))
        return AggregateFolder(specs)


def _limit(output: T.DataType) -> int | None:
    """How many integer digits a decimal output holds; None for other types."""
    from pyspark.sql import types as T

    if isinstance(output, T.DecimalType):
        return output.precision - output.scale
    return None


# ------------------------------------------------------------- executor side


@dataclass(frozen=True)
class Spec:
    """One aggregate on the Python side: ``at`` is its input's index (-1: none)."""

    name: str
    fn: str
    kind: str
    at: int
    digits: int | None = None
    """A decimal sum's integer digits at most (beyond them it is null)."""


_DECIMALS = Context(prec=100)
_LONG = 2**63


def _read(kind: str, text: str) -> Any:
    """An encoded value (input or state) as Python."""
    if kind in ("int",):
        return int(text)
    if kind in ("day", "micros"):
        return int(text.split(" ", 1)[0])
    if kind == "float":
        return float(text)
    if kind == "decimal":
        return Decimal(text)
    if kind == "bool":
        return text == "true"
    return text


def _write(kind: str, value: Any) -> str:
    """A Python value (a sum's) encoded as ``_read`` reads it."""
    if kind == "float":
        return _float_text(value)
    if kind == "decimal":
        return format(value, "f")
    return str(value)


def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def _nan_last(value: float) -> tuple[bool, float]:
    """The sort key of a double: NaN above every other value, as in Spark SQL."""
    return (math.isnan(value), value)


def _fold_one(spec: Spec, current: str | None, events: list[list[Any]], fresh: bool) -> str | None:
    """One aggregate's encoded value after ``events`` (a live run: no delete among them).

    ``current`` is its encoded value before them, ``fresh`` whether the entity
    starts with them. Values combine in event order, the current one first,
    so sums of doubles round as a left fold does and ``min`` / ``max`` keep
    the earliest of equal values (``0.0`` before ``-0.0``).
    """
    fn, kind, at = spec.fn, spec.kind, spec.at
    if fn == "count":
        n = len(events) if at == _NO_INPUT else sum(1 for e in events if e[at] is not None)
        return str(n if current is None else int(current) + n)
    if fn == "last":
        last: str | None = events[-1][at]
        return last
    if fn == "first":
        first: str | None = events[0][at]
        return first if fresh else current
    texts = [e[at] for e in events if e[at] is not None]
    if not texts:
        return current
    if current is not None:
        texts.insert(0, current)
    if fn == "sum":
        total = _read(kind, texts[0])
        for t in texts[1:]:
            v = _read(kind, t)
            total = _DECIMALS.add(total, v) if kind == "decimal" else total + v
        return _write(kind, total)
    # min / max keep the winner's own text: a date or timestamp's JSON travels in it.
    key = (lambda t: _nan_last(float(t))) if kind == "float" else (lambda t: _read(kind, t))
    best: str = min(texts, key=key) if fn == "min" else max(texts, key=key)
    return best


def _shown(spec: Spec, text: str) -> Any:
    """An aggregate's encoded value as the entity's JSON shows it, or None (left out)."""
    kind = spec.kind
    if kind == "json":
        inner = text[5:-1]  # {"v":...}; {} when null
        return orjson.Fragment(inner) if inner else None
    if kind in ("day", "micros"):
        return orjson.Fragment(text.split(" ", 1)[1][5:-1])
    if kind in ("count", "int"):
        n = int(text)
        return n if -_LONG <= n < _LONG else None
    if kind == "float":
        f = float(text)
        return f if math.isfinite(f) else _float_text(f)
    if kind == "decimal":
        if spec.digits is not None and Decimal(text).adjusted() >= spec.digits:
            return None
        return orjson.Fragment(text)
    if kind == "bool":
        return text == "true"
    return text


_EPOCH_DAY = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Number(str):
    """A JSON number kept as its text."""


def _json(value: Any) -> str:
    """``value`` as JSON, its numbers written as the text they were read from."""
    return orjson.dumps(
        value,
        option=orjson.OPT_PASSTHROUGH_SUBCLASS,
        default=lambda n: orjson.Fragment(str(n)),
    ).decode()


def _encoded(spec: Spec, shown: Any) -> str | None:
    """An aggregate's value as the entity's JSON shows it (numbers as ``_Number``) back to
    its encoded text; the inverse of ``_shown``."""
    if shown is None:
        return None
    kind = spec.kind
    if kind == "json":
        return '{"v":' + _json(shown) + "}"
    if kind == "day":
        days = (date.fromisoformat(shown) - _EPOCH_DAY).days
        return f'{days} {{"v":{_json(shown)}}}'
    if kind == "micros":
        micros = (datetime.fromisoformat(shown) - _EPOCH) // timedelta(microseconds=1)
        return f'{micros} {{"v":{_json(shown)}}}'
    if kind == "bool":
        return "true" if shown else "false"
    return str(shown)


class AggregateFolder:
    """Python side of ``aggregate``: a key's events of a batch folded into its state."""

    def __init__(self, specs: Sequence[Spec]) -> None:
        self.specs = tuple(specs)

    def seed(self, entity: bytes) -> bytes:
        """The entity's aggregates as the state, counted as one event folded before (so
        ``first`` stays); no offsets: the source's position is the checkpoint's."""
        shown = json.loads(entity, parse_float=_Number, parse_int=_Number)
        values = [_encoded(sp, shown.get(sp.name)) for sp in self.specs]
        return orjson.dumps({"p": {}, "n": 1, "v": values})

    def lua_spec(self) -> list[tuple[str, str, str, int, int]]:
        """The aggregates as the Redis Functions' aggregate fold reads them
        (``aggregate.lua``): per aggregate its name, function, kind, its input's place in
        the payload (-1: none) and a decimal sum's integer digits at most (-1: no bound)."""
        return [
            (sp.name, sp.fn, sp.kind, sp.at, -1 if sp.digits is None else sp.digits)
            for sp in self.specs
        ]

    def __call__(self, state: bytes | None, events: list[Event]) -> tuple[bytes, bytes | None]:
        """Skip what was folded before, then fold: a delete starts the aggregates afresh."""
        s: dict[str, Any] = orjson.loads(state) if state else {"p": {}, "n": 0}
        offsets: dict[str, int] = s["p"]
        fresh_events: list[bytes | None] = []
        for order, payload, topic in events:
            partition = f"{topic}:{int(order[:10])}"
            offset = int(order[10:])
            if offset <= offsets.get(partition, -1):
                continue  # folded before: a replay
            offsets[partition] = offset
            fresh_events.append(payload)
        if not fresh_events:
            return state or orjson.dumps(s), None
        last_delete = -1
        for i in range(len(fresh_events) - 1, -1, -1):
            if fresh_events[i] is None:
                last_delete = i
                break
        live = [orjson.loads(p) for p in fresh_events[last_delete + 1 :] if p is not None]
        if last_delete >= 0:
            s["n"] = 0
            s.pop("v", None)
        if live:
            values = s.get("v") or [None] * len(self.specs)
            fresh = s["n"] == 0
            pairs = zip(self.specs, values, strict=True)
            s["v"] = [_fold_one(sp, v, live, fresh) for sp, v in pairs]
            s["n"] += len(live)
        text = orjson.dumps(s)
        if "v" not in s:
            return text, None
        entity = {
            sp.name: shown
            for sp, v in zip(self.specs, s["v"], strict=True)
            if v is not None and (shown := _shown(sp, v)) is not None
        }
        return text, orjson.dumps(entity)
