"""A caller's SQL statement, checked before any engine sees it.

One ``SELECT`` or ``WITH`` statement, reading maps only: each table it names
is a map (by its name), and the caller must be granted every one of them
(``query_service.auth``, through ``requested_maps``). Everything else is
refused with a message naming what was refused: another kind of statement,
a second statement, a statement that writes inside a ``WITH``, a table
function (``read_parquet(...)``, ``generate_series(...)``), a function that
reads files or the network, a table in another schema
(``information_schema.tables``). Parameters are ``$1``, ``$2``…, bound by
the engine, never spliced into the text.

The check is sqlglot's parse of the text; the engine then runs the caller's
own text, in a session that knows only the statement's maps and refuses DDL,
DML and ``SET`` itself, so a statement sqlglot reads differently from the
engine still reaches nothing else.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from sqlglot import exp, parse
from sqlglot.errors import ParseError, TokenError

from materializer.contract.table_layout import TABLE_KEY
from query_service.errors import InvalidArgument, ResourceExhausted

MAX_SQL_CHARS = 100_000
"""Longer statements are refused before parsing (RESOURCE_EXHAUSTED)."""
MAX_NESTING = 32
"""Parentheses within parentheses, and operators in a row, refused beyond this before
parsing: the parser recurses on them, and Python's recursion limit is not a refusal to
rely on."""
_DEEP = re.compile(rf"(?:(?:\bnot\b|[-+~])\s*){{{MAX_NESTING}}}", re.IGNORECASE)
DIALECT = "postgres"
"""sqlglot's reading of the text: DataFusion's SQL is PostgreSQL's in what a query uses
(``$1`` parameters, ``'...'`` strings, ``"..."`` identifiers, lower-cased bare names)."""

PUBLIC = "public"
"""The one schema, where SQL clients' catalogs (Flight SQL's GetTables) list the maps:
``public.users`` is ``users``, as the engine reads it."""

_WRITES: tuple[type[exp.Expr], ...] = (
    exp.Insert,
    exp.Update,
    exp.Delete,
    exp.Merge,
    exp.Create,
    exp.Drop,
    exp.Alter,
    exp.Copy,
    exp.Command,
    exp.Set,
    exp.Use,
    exp.Describe,
    exp.Transaction,
    exp.Commit,
    exp.Rollback,
    exp.LoadData,
    exp.Into,
)
_UNSAFE_FUNCTION = re.compile(
    r"^(read_|scan_|parquet_|csv_|json_|http|url|file|load|copy|pg_read|lo_)", re.IGNORECASE
)
"""Function names of file, network and catalog readers in engines' SQL dialects."""


@dataclass(frozen=True)
class KeyLookup:
    """A statement that reads one map's entities by key and nothing else:
    ``SELECT * | <columns> FROM <map> WHERE _key = <string | $n>``."""

    map_name: str
    columns: tuple[str, ...] | None
    """The columns asked for, in order; ``None`` for ``*``."""
    key: str | None
    """The key written in the statement, or ``None`` when it is the parameter ``param``."""
    param: int | None


@dataclass(frozen=True)
class Selection:
    """A statement over one map's rows that some ``WHERE`` narrows, and nothing else:
    ``SELECT <anything> FROM <map> WHERE <condition> [GROUP BY, ORDER BY, LIMIT …]`` with
    no join, subquery or ``WITH``. Whatever it computes, it computes from the rows the
    condition keeps; so those rows, read through an index (``sql.indexed``), give the
    answer the whole table gives."""

    map_name: str
    where: str
    """The condition in the index planner's SQL (``indexes.plan``): names as the engine
    resolves them, each quoted; parameters as ``@1``, ``@2``, …"""
    columns: frozenset[str]
    """Every column name the statement mentions (the engine's reading of each)."""
    star: bool
    """It asks for ``*``: every column of the table."""


@dataclass(frozen=True)
class Statement:
    """A statement that passed the check: its text, the maps it reads, its parameters."""

    text: str
    maps: tuple[str, ...]
    """The maps the statement reads, each once, sorted."""
    parameters: int
    """The highest ``$n`` it uses; every one up to it must be bound."""
    key_lookup: KeyLookup | None = None
    selection: Selection | None = None


def check(text: str) -> Statement:
    """The statement in ``text``, or ``InvalidArgument`` naming what was refused.

    Cached by text: the authorization of a call and its execution check it once.
    """
    if len(text) > MAX_SQL_CHARS:
        raise ResourceExhausted(f"sql: {len(text)} characters, at most {MAX_SQL_CHARS}")
    return _check(text)


@functools.lru_cache(maxsize=1024)
def _check(text: str) -> Statement:
    if not text.strip():
        raise InvalidArgument("sql: empty; send one SELECT or WITH statement")
    if _nesting(text) > MAX_NESTING or _DEEP.search(text):
        raise InvalidArgument(f"sql: the statement is nested more than {MAX_NESTING} deep")
    try:
        trees = [t for t in parse(text, read=DIALECT) if t is not None]
    except (ParseError, TokenError) as exc:
        raise InvalidArgument(f"sql: cannot parse the statement: {_first_line(exc)}") from None
    except RecursionError:
        raise InvalidArgument("sql: the statement is nested too deeply") from None
    if len(trees) != 1:
        raise InvalidArgument(
            f"sql: {len(trees) or 'no'} statements; send exactly one statement per call"
        )
    tree = trees[0]
    if not isinstance(tree, exp.Query):
        raise InvalidArgument(
            f"sql: {_kind(tree)} statements are refused; only SELECT and WITH are allowed"
        )
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    maps: set[str] = set()
    highest = 0
    for node in tree.walk():
        if isinstance(node, _WRITES):
            raise InvalidArgument(f"sql: {_kind(node)} is refused; statements only read")
        if isinstance(node, exp.Table):
            name = _table(node, ctes)
            if name is not None:
                maps.add(name)
        elif isinstance(node, exp.Func) and _UNSAFE_FUNCTION.match(_function_name(node)):
            raise InvalidArgument(
                f"sql: the function {_function_name(node)}() is refused: "
                "statements read the maps' tables only"
            )
        elif isinstance(node, exp.Placeholder | exp.Parameter):
            highest = max(highest, _parameter(node))
    lookup = _key_lookup(tree, maps)
    selection = None if lookup is not None else _selection(tree, maps)
    return Statement(text, tuple(sorted(maps)), highest, lookup, selection)


def _nesting(text: str) -> int:
    """The deepest nesting of parentheses (those in quotes count too: a bound, not a
    parse)."""
    depth = deepest = 0
    for char in text:
        if char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth = max(depth - 1, 0)
    return deepest


def _table(node: exp.Table, ctes: set[str]) -> str | None:
    """The map a table reference names; ``None`` for a name a ``WITH`` defines."""
    if not isinstance(node.this, exp.Identifier):
        name = node.this.sql(dialect=DIALECT) if node.this is not None else "?"
        raise InvalidArgument(
            f"sql: the table function {name} is refused; FROM and JOIN name maps only"
        )
    schema = node.args.get("db")
    if node.args.get("catalog") or (schema is not None and schema.name.lower() != PUBLIC):
        raise InvalidArgument(
            f"sql: the table {node.sql(dialect=DIALECT)} is refused; "
            f"tables are maps, named alone or in the schema {PUBLIC}"
        )
    identifier: exp.Identifier = node.this
    # The engine lower-cases a bare name, as PostgreSQL does; a quoted one is kept.
    name = identifier.this if identifier.quoted else identifier.this.lower()
    return None if name.lower() in ctes and not identifier.quoted else name


def _function_name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this)
    return node.sql_name()


def _parameter(node: exp.Expr) -> int:
    text = node.sql(dialect=DIALECT)
    digits = text.lstrip("$")
    if not digits.isdigit() or int(digits) < 1:
        raise InvalidArgument(f"sql: parameter {text}: parameters are $1, $2, …")
    return int(digits)


def _key_lookup(tree: exp.Query, maps: set[str]) -> KeyLookup | None:
    """The statement as a key lookup, when it is exactly one (see ``KeyLookup``)."""
    if not isinstance(tree, exp.Select) or len(maps) != 1:
        return None
    allowed = {"expressions", "from", "where", "from_"}
    if any(tree.args.get(arg) for arg in tree.args if arg not in allowed):
        return None
    where = tree.args.get("where")
    if where is None or not isinstance(where.this, exp.EQ):
        return None
    column, value = where.this.this, where.this.expression
    if isinstance(value, exp.Column):
        column, value = value, column
    if not isinstance(column, exp.Column) or column.table or column.name != TABLE_KEY:
        return None
    columns: list[str] | None = []
    for projection in tree.expressions:
        if isinstance(projection, exp.Star):
            columns = None
        elif isinstance(projection, exp.Column) and not projection.table and columns is not None:
            if not isinstance(projection.this, exp.Identifier):
                return None
            columns.append(projection.name)
        else:
            return None
    if columns is not None and not columns:
        return None
    map_name = next(iter(maps))
    column_tuple = None if columns is None else tuple(columns)
    if isinstance(value, exp.Literal) and value.is_string:
        return KeyLookup(map_name, column_tuple, value.this, None)
    if isinstance(value, exp.Placeholder | exp.Parameter):
        return KeyLookup(map_name, column_tuple, None, _parameter(value))
    return None


def _selection(tree: exp.Query, maps: set[str]) -> Selection | None:
    """The statement as a ``Selection``, when it is one."""
    where = tree.args.get("where")
    if not isinstance(tree, exp.Select) or len(maps) != 1 or where is None:
        return None
    source = tree.args.get("from_") or tree.args.get("from")
    nested = (exp.Join, exp.With, exp.Subquery, exp.SetOperation, exp.Lateral, exp.Unnest)
    if source is None or not isinstance(source.this, exp.Table) or source.this.alias:
        return None
    if any(node is not tree for node in tree.find_all(exp.Select, *nested)):
        return None
    columns = frozenset(_resolved(c.this) for c in tree.find_all(exp.Column) if c.this)
    condition = where.this.copy()
    for identifier in condition.find_all(exp.Identifier):
        identifier.replace(exp.to_identifier(_resolved(identifier), quoted=True))
    star = any(p.is_star for p in tree.expressions)  # ``*``, or a table's ``m.*``
    return Selection(next(iter(maps)), condition.sql(), columns, star)


def _resolved(identifier: exp.Expr) -> str:
    """A name as the engine reads it: a bare one lower-cased (as PostgreSQL does)."""
    if isinstance(identifier, exp.Identifier):
        return str(identifier.this) if identifier.quoted else str(identifier.this).lower()
    return identifier.name


def _kind(node: exp.Expr) -> str:
    """What a statement or clause is, as its keyword (``INSERT``, ``COPY``)."""
    if isinstance(node, exp.Command):
        return str(node.this).upper()
    if isinstance(node, exp.Create | exp.Drop | exp.Alter):
        kind = node.args.get("kind")
        prefix = type(node).__name__.upper()
        return f"{prefix} {kind}" if kind else prefix
    return type(node).__name__.upper()


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split("\n", 1)[0].split())
