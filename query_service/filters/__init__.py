"""Filters over a map's Delta table, checked and rendered as DataFusion SQL.

A request's filter (a structured ``Predicate`` or a SQL ``WHERE`` string) is
never passed on as the caller wrote it: it is parsed, every column is checked
against the table, and the SQL is written anew from what was checked, with
quoted identifiers and escaped literals. Nothing but a boolean expression over
one table's columns can reach the query engine.
"""

from __future__ import annotations

from materializer.v1 import map_service_pb2 as pb
from query_service.filters.columns import Columns
from query_service.filters.predicate import render_predicate
from query_service.filters.where import render_where

__all__ = ["Columns", "render_filter", "render_predicate", "render_where"]


def render_filter(request: pb.QueryRequest | pb.WatchRequest, columns: Columns) -> str | None:
    """The request's filter as SQL over ``columns``; ``None`` when it sets none (every row)."""
    kind = request.WhichOneof("filter")
    if kind == "predicate":
        return render_predicate(request.predicate, columns)
    if kind == "where":
        return render_where(request.where, columns)
    return None
