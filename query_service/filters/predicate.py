"""The structured ``Predicate``: comparisons joined by AND / OR / NOT, rendered as SQL.

Each comparison names a column exactly (no case folding: this is an API, not
SQL text) and carries typed values, so rendering is a matter of quoting.
Errors name the offending part by its path, e.g.
``predicate.and.all[1].comparison.field``.
"""

from __future__ import annotations

from datetime import UTC

from materializer.v1 import map_service_pb2 as pb
from query_service.errors import InvalidArgument
from query_service.filters import sql
from query_service.filters.columns import Columns

MAX_DEPTH = 64
"""Nesting of And / Or / Not; deeper is a malformed request, not a useful filter."""

Op = pb.Comparison.Operator

_BINARY = {Op.EQ: "=", Op.NE: "<>", Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">="}


def render_predicate(predicate: pb.Predicate, columns: Columns) -> str:
    """The predicate as a SQL boolean expression over ``columns``."""
    return _render(predicate, columns, "predicate", 0)


def _render(predicate: pb.Predicate, columns: Columns, path: str, depth: int) -> str:
    if depth > MAX_DEPTH:
        raise InvalidArgument(f"{path}: nested deeper than {MAX_DEPTH} levels")
    kind = predicate.WhichOneof("kind")
    if kind == "comparison":
        return _comparison(predicate.comparison, columns, f"{path}.comparison")
    # `and`, `or` and `not` are Python keywords: protobuf exposes them through getattr only.
    if kind == "and":
        every: pb.Predicate.And = getattr(predicate, "and")
        parts = [
            _render(p, columns, f"{path}.and.all[{i}]", depth + 1) for i, p in enumerate(every.all)
        ]
        return "(" + " AND ".join(parts) + ")" if parts else "TRUE"
    if kind == "or":
        some: pb.Predicate.Or = getattr(predicate, "or")
        parts = [
            _render(p, columns, f"{path}.or.any[{i}]", depth + 1) for i, p in enumerate(some.any)
        ]
        return "(" + " OR ".join(parts) + ")" if parts else "FALSE"
    if kind == "not":
        negated: pb.Predicate = getattr(predicate, "not")
        return f"(NOT {_render(negated, columns, f'{path}.not', depth + 1)})"
    raise InvalidArgument(f"{path}: empty; set one of comparison, and, or, not")


def _comparison(comparison: pb.Comparison, columns: Columns, path: str) -> str:
    column = columns.reference(columns.exact(comparison.field, f"{path}.field"))
    op = comparison.op
    has_value = comparison.HasField("value")
    if op == Op.IN:
        if has_value:
            raise InvalidArgument(f"{path}.value: IN takes its set in `values`")
        if not comparison.values:
            return "FALSE"  # membership in the empty set
        listed = ", ".join(
            _value(v, f"{path}.values[{i}]") for i, v in enumerate(comparison.values)
        )
        return f"({column} IN ({listed}))"
    if comparison.values:
        raise InvalidArgument(f"{path}.values: only IN takes a list of values")
    if op in (Op.IS_NULL, Op.IS_NOT_NULL):
        if has_value:
            raise InvalidArgument(f"{path}.value: {Op.Name(op)} takes no value")
        return f"({column} IS {'NOT ' if op == Op.IS_NOT_NULL else ''}NULL)"
    if op == Op.LIKE:
        if comparison.value.WhichOneof("kind") != "string_value":
            raise InvalidArgument(f"{path}.value: LIKE needs a string_value pattern")
        return f"({column} LIKE {sql.string(comparison.value.string_value)})"
    if op in _BINARY:
        if not has_value:
            raise InvalidArgument(f"{path}.value: {Op.Name(op)} needs a value")
        return f"({column} {_BINARY[op]} {_value(comparison.value, f'{path}.value')})"
    raise InvalidArgument(f"{path}.op: set an operator (EQ, NE, LT, LE, GT, GE, IN, ...)")


def _value(value: pb.Value, path: str) -> str:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return sql.string(value.string_value)
    if kind == "int_value":
        return sql.integer(value.int_value)
    if kind == "double_value":
        return sql.double(value.double_value, path)
    if kind == "bool_value":
        return sql.boolean(value.bool_value)
    if kind == "timestamp_value":
        return sql.timestamp(value.timestamp_value.ToDatetime(tzinfo=UTC))
    raise InvalidArgument(f"{path}: empty; set one of string_value, int_value, ...")
