"""Debezium's ``op`` letters, as its envelope writes them."""

from __future__ import annotations

CREATE, READ, UPDATE, DELETE, TRUNCATE = "c", "r", "u", "d", "t"
OPS = (CREATE, READ, UPDATE, DELETE, TRUNCATE)
UPSERTS = (CREATE, READ, UPDATE)
"""The ops whose ``after`` is the entity: a snapshot's read folds as a create does."""


def unknown_op(op: str) -> str:
    """The decode error of an ``op`` Debezium does not write."""
    return f"op {op} is not one of Debezium's ({', '.join(OPS)})"


def without_after(op: str) -> str:
    """The decode error of an upsert whose ``after`` is missing."""
    return f"op {op} without after: no row to fold"
