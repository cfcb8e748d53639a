"""Which of a filter's conditions a map's index serves: the spans of its entries to read.

A filter arrives checked and written as SQL (``query_service.filters``), whatever form
the caller sent it in, so one walk of that SQL serves both. Its top-level conjuncts of
the forms ``field = v``, ``field IN (v, ...)`` (any index), and ``field < v``, ``<=``,
``>``, ``>=``, ``BETWEEN`` (a ``sorted`` index) on an indexed field name entries of one
value, or of a range of them; the first equality an index serves is taken, else the
bounds of the first sorted field. A literal must be of the column's own kind (a string
for a string column, a number for a number, a boolean for a boolean): anything else is
left to the engine, and so is a filter where nothing is served.

The spans are a superset of the rows the filter keeps: ranges are read inclusive
whatever the comparison, and numbers compare as doubles in the index. The reader
applies the whole filter to the entities it reads (``index_entries``).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from materializer.contract.index_entries import END, Scalar, value_prefix

_INTEGER = re.compile(r"[+-]?\d+")
_KIND_START = {bool: b"b", float: b"n", str: b"s"}
_KIND_END = {bool: b"c", float: b"o", str: b"t"}
"""Where each kind's entries begin and end: its tag byte, and the one after it."""


NON_FINITE = ("NaN", "Infinity", "-Infinity")
"""How the pipeline writes a double's non-finite values in an entity's JSON: strings,
which a range on the column may keep (``x > 10`` keeps infinity, and NaN sorts last)."""
EXACT_INTEGERS = 2**53
"""Integers below this in magnitude are doubles of their own: no other shares their entry."""


@dataclass(frozen=True)
class IndexScan:
    """The entries of one index to read: spans ``[start, end)`` of entry bytes, in order."""

    field: str
    spans: tuple[tuple[bytes, bytes], ...]
    exact: bool = False
    """The entries are the filter's answer: it is one equality or ``IN`` whose values no
    other value shares an entry with (not a decimal, nor an integer past 2^53)."""


def index_scan(
    filter_sql: str | None,
    indexes: Mapping[str, str],
    types: Mapping[str, pa.DataType],
    params: Sequence[object] = (),
) -> IndexScan | None:
    """The index scan serving ``filter_sql`` (``None``: none does). ``indexes``: the map's
    ready indexes, field to kind; ``types``: the table's column types; ``params``: the
    values of its parameters ``@1``, ``@2``, … (a SQL statement's ``$1``, ``$2``, …)."""
    if not filter_sql or not indexes:
        return None
    conjuncts = _parsed(filter_sql)
    bounds: dict[str, tuple[list[bytes], list[bytes]]] = {}
    for conjunct in conjuncts:
        found = _condition(conjunct, params)
        if found is None:
            continue
        field, op, values = found
        kind = _kind(types.get(field))
        if field not in indexes or kind is None or any(_kind_of(v) is not kind for v in values):
            continue
        if op == "in":
            prefixes = sorted({value_prefix(v) for v in values})
            exact = len(conjuncts) == 1 and _exact(types[field], values)
            return IndexScan(field, tuple((p, p + END) for p in prefixes), exact)
        if indexes[field] != "sorted":
            continue
        lows, highs = bounds.setdefault(field, ([_KIND_START[kind]], [_KIND_END[kind]]))
        if op in (">", ">=", "between"):
            lows.append(value_prefix(values[0]))
        if op in ("<", "<="):
            highs.append(value_prefix(values[0]) + END)
        if op == "between":
            highs.append(value_prefix(values[1]) + END)
    for field, (lows, highs) in bounds.items():
        low, high = max(lows), min(highs)
        spans: tuple[tuple[bytes, bytes], ...] = ((low, high),) if low < high else ()
        if pa.types.is_floating(types[field]):  # its JSON holds non-finite doubles as text
            spans += tuple((p, p + END) for p in sorted(value_prefix(t) for t in NON_FINITE))
        return IndexScan(field, spans)
    return None


@functools.lru_cache(maxsize=1024)
def _parsed(filter_sql: str) -> tuple[exp.Expr, ...]:
    """The filter's top-level conjuncts (none when it does not parse), parsed once per text:
    a statement's parameters are not in it, so one text serves every call."""
    try:
        return tuple(_conjuncts(sqlglot.parse_one(filter_sql)))
    except ParseError:
        return ()


def _exact(column: pa.DataType, values: list[Scalar]) -> bool:
    """Whether these values' entries hold exactly the column's values equal to them (a
    float32 column compares its own rounding of a literal; a decimal its digits)."""
    if pa.types.is_decimal(column) or (
        pa.types.is_floating(column) and not pa.types.is_float64(column)
    ):
        return False
    return all(isinstance(v, str | bool | float) or abs(v) < EXACT_INTEGERS for v in values)


def _conjuncts(node: exp.Expr) -> Iterator[exp.Expr]:
    """The conditions a filter's top-level ``AND`` joins."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        yield from _conjuncts(node.this)
        yield from _conjuncts(node.expression)
    else:
        yield node


_FLIPPED = {">": "<", ">=": "<=", "<": ">", "<=": ">=", "=": "="}
_COMPARISONS: dict[type[exp.Expr], str] = {
    exp.EQ: "=",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.LT: "<",
    exp.LTE: "<=",
}


def _condition(node: exp.Expr, params: Sequence[object]) -> tuple[str, str, list[Scalar]] | None:
    """``(field, op, values)`` of a condition an index may serve (``=`` and ``IN`` as
    ``in``), else ``None``."""
    if type(node) in _COMPARISONS:
        op = _COMPARISONS[type(node)]
        field, value = _column(node.this), _literal(node.expression, params)
        if field is None:
            field, op = _column(node.expression), _FLIPPED[op]
            value = _literal(node.this, params)
        if field is None or value is None:
            return None
        return (field, "in", [value]) if op == "=" else (field, op, [value])
    if isinstance(node, exp.In) and not node.args.get("query"):
        field = _column(node.this)
        values = [_literal(v, params) for v in node.expressions]
        if field is None or not values or any(v is None for v in values):
            return None
        return field, "in", [v for v in values if v is not None]
    if isinstance(node, exp.Between):
        field = _column(node.this)
        low, high = _literal(node.args["low"], params), _literal(node.args["high"], params)
        if field is None or low is None or high is None:
            return None
        return field, "between", [low, high]
    return None


def _column(node: exp.Expr) -> str | None:
    """A top-level column's name."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Column) and not node.table and isinstance(node.this, exp.Identifier):
        return str(node.this.this)
    return None


def _literal(node: exp.Expr, params: Sequence[object]) -> Scalar | None:
    """A string, number or boolean literal's value, or a parameter's of those kinds."""
    negative = False
    while isinstance(node, exp.Paren | exp.Neg):
        negative ^= isinstance(node, exp.Neg)
        node = node.this
    if isinstance(node, exp.Parameter) and isinstance(node.this, exp.Literal):
        value = _bound(str(node.this.this), params)
        if not negative or value is None:
            return value
        return None if isinstance(value, str | bool) else -value
    if isinstance(node, exp.Boolean) and not negative:
        return bool(node.this)
    if not isinstance(node, exp.Literal):
        return None
    text = str(node.this)
    if node.is_string:
        return None if negative else text
    try:
        number: int | float = int(text) if _INTEGER.fullmatch(text) else float(text)
    except ValueError:
        return None
    return -number if negative else number


def _bound(number: str, params: Sequence[object]) -> Scalar | None:
    """Parameter ``number``'s value when it is a string, a boolean, an integer or a finite
    double (what an index entry holds as the table compares it); else ``None``."""
    if not number.isdigit() or not 1 <= int(number) <= len(params):
        return None
    value = params[int(number) - 1]
    if isinstance(value, str | bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return None


def _kind_of(value: Scalar) -> type:
    if isinstance(value, bool):
        return bool
    return str if isinstance(value, str) else float


def _kind(column: pa.DataType | None) -> type | None:
    """The kind of literal a column compares with in the index, ``None`` for a column no
    index entry holds as the table does (timestamps, dates and binary are text in JSON)."""
    if column is None:
        return None
    if pa.types.is_boolean(column):
        return bool
    if pa.types.is_integer(column) or pa.types.is_floating(column) or pa.types.is_decimal(column):
        return float
    if pa.types.is_string(column) or pa.types.is_large_string(column):
        return str
    return None
