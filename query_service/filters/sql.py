"""SQL fragments that are safe by construction: quoted identifiers and escaped literals.

DataFusion reads ``'...'`` strings without backslash escapes, so doubling the
quote is the only escaping a string needs; identifiers are double-quoted with
``"`` doubled, which also keeps their case and any dots or spaces.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

from query_service.errors import InvalidArgument


def identifier(name: str) -> str:
    """A column or table name as a quoted identifier."""
    return '"' + name.replace('"', '""') + '"'


def string(text: str) -> str:
    """A string literal."""
    return "'" + text.replace("'", "''") + "'"


def integer(value: int) -> str:
    """An integer literal (``int`` only, so nothing but digits and a sign can appear)."""
    return str(int(value))


def double(value: float, where: str) -> str:
    """A floating-point literal; NaN and infinities have no SQL literal and are refused."""
    if not math.isfinite(value):
        raise InvalidArgument(f"{where}: {value} is not a finite number")
    return repr(float(value))


def boolean(value: bool) -> str:
    """``TRUE`` or ``FALSE``."""
    return "TRUE" if value else "FALSE"


def timestamp(value: datetime) -> str:
    """A UTC instant, as the tables store timestamps (microseconds)."""
    text = value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds")
    return f"CAST({string(text + 'Z')} AS TIMESTAMP)"


def select(
    columns: Sequence[str] | None,
    table: str,
    conditions: Sequence[str],
    *,
    order_by: str | None = None,
    limit: int,
) -> str:
    """``SELECT`` of ``columns`` (``None``: all) from ``table`` where every condition holds.

    Names are quoted here; ``conditions`` must already be SQL built by this
    package (checked filters, quoted identifiers, escaped literals).
    """
    projected = ", ".join(identifier(c) for c in columns) if columns is not None else "*"
    where = f" WHERE {' AND '.join(f'({c})' for c in conditions)}" if conditions else ""
    order = f" ORDER BY {identifier(order_by)}" if order_by else ""
    return f"SELECT {projected} FROM {identifier(table)}{where}{order} LIMIT {int(limit)}"  # noqa: S608
