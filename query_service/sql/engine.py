"""The engine's settings, one for every place a statement runs: the statement processes
over the tables, and the service itself over the rows an index read
(``sql.indexed``), so a statement means the same wherever it is answered.

DataFusion is imported where it is used: a statement process starts without it.
"""

from __future__ import annotations

from typing import Any


def session_config(partitions: int) -> Any:
    """A session's settings: ``partitions`` wide, no catalog tables, and number literals
    with a point or an exponent read as exact decimals, as PostgreSQL reads them
    (``credit - 0.01`` stays a DECIMAL)."""
    from datafusion import SessionConfig

    return (
        SessionConfig()
        .with_target_partitions(partitions)
        .with_information_schema(False)
        .set("datafusion.sql_parser.parse_float_as_decimal", "true")
    )


def read_only() -> Any:
    """What a statement may be: no DDL, no DML, no ``SET``."""
    from datafusion import SQLOptions

    return SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)


def parameters(params: list[Any]) -> dict[str, Any] | None:
    """A statement's ``$1``, ``$2``, … as the engine takes them."""
    return {str(i + 1): value for i, value in enumerate(params)} or None
