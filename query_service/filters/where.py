"""A SQL ``WHERE`` expression from a caller, checked and written anew.

The text is tokenized and parsed with sqlglot, then the syntax tree is walked
against an allow-list: columns of this one table, literals, comparison,
boolean and arithmetic operators, ``IN`` lists, ``BETWEEN``, ``LIKE``,
``IS [NOT] NULL``, ``CAST`` to simple types and a few scalar functions. Every
node kind not listed, and every listed node with a clause this module does not
render (``LIKE ... ESCAPE``, ``IN (SELECT ...)``), is refused, so nothing the
caller wrote is silently dropped or passed through. Comments and ``;`` are
refused outright: a filter has no use for them.

The SQL that runs is rendered here from the checked tree, each composite
parenthesized so precedence is the tree's, identifiers quoted and literals
escaped (``query_service.filters.sql``); the caller's text never reaches the
engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sqlglot import TokenType, exp, tokens
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError

from query_service.errors import InvalidArgument, ResourceExhausted
from query_service.filters import sql
from query_service.filters.columns import Columns

MAX_WHERE_CHARS = 65_536
"""Longer expressions are refused before parsing (RESOURCE_EXHAUSTED)."""
MAX_DEPTH = 64
"""Nesting of operators and functions; deeper is refused rather than recursed into."""
FIELD = "where"


class MaterializerFilter(Dialect):
    """sqlglot's generic SQL, with backquoted identifiers as well as double-quoted ones.

    Strings are ``'...'`` with ``''`` for a quote and no backslash escapes, as
    in DataFusion; `` `a.b` `` is accepted as in the pipeline's Spark SQL.
    """

    class Tokenizer(tokens.Tokenizer):
        """Adds the backquote to the identifier quotes."""

        IDENTIFIERS = ['"', "`"]


_DIALECT = MaterializerFilter()
_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")

_BINARY: dict[type[exp.Expr], str] = {
    exp.And: "AND",
    exp.Or: "OR",
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.NullSafeEQ: "IS NOT DISTINCT FROM",
    exp.NullSafeNEQ: "IS DISTINCT FROM",
    exp.Add: "+",
    exp.Sub: "-",
    exp.Mul: "*",
    exp.Div: "/",
    exp.Mod: "%",
    exp.DPipe: "||",
}
_IGNORED_FLAGS: dict[type[exp.Expr], frozenset[str]] = {
    # Dialect hints sqlglot records on these nodes; the generic dialect's meaning is the SQL one.
    exp.Div: frozenset({"typed", "safe"}),
    exp.DPipe: frozenset({"safe"}),
}

_FUNCTIONS: dict[type[exp.Expr], tuple[str, tuple[str, ...]]] = {
    # node: (DataFusion function, the node's arguments in call order)
    exp.Lower: ("lower", ("this",)),
    exp.Upper: ("upper", ("this",)),
    exp.Length: ("character_length", ("this",)),
    exp.Abs: ("abs", ("this",)),
    exp.Coalesce: ("coalesce", ("this", "expressions")),
    exp.Substring: ("substr", ("this", "start", "length")),
    exp.Trim: ("trim", ("this",)),
    exp.Round: ("round", ("this", "decimals")),
    exp.Floor: ("floor", ("this",)),
    exp.Ceil: ("ceil", ("this",)),
    exp.StartsWith: ("starts_with", ("this", "expression")),
    exp.ArrayContains: ("array_has", ("this", "expression")),
}
FUNCTION_NAMES = (
    "lower, upper, length, abs, coalesce, substr, trim, round, floor, ceil, "
    "starts_with, array_contains"
)

_CAST_TYPES = {
    "INT": "INT",
    "BIGINT": "BIGINT",
    "DOUBLE": "DOUBLE",
    "FLOAT": "DOUBLE",
    "VARCHAR": "VARCHAR",
    "TEXT": "VARCHAR",
    "BOOLEAN": "BOOLEAN",
    "DATE": "DATE",
    "TIMESTAMP": "TIMESTAMP",
}


def render_where(text: str, columns: Columns) -> str:
    """The DataFusion SQL of a caller's WHERE expression over ``columns``.

    Raises ``InvalidArgument`` naming what is not allowed (or does not parse),
    and ``ResourceExhausted`` beyond ``MAX_WHERE_CHARS``.
    """
    if len(text) > MAX_WHERE_CHARS:
        raise ResourceExhausted(
            f"{FIELD}: {len(text)} characters, at most {MAX_WHERE_CHARS} allowed"
        )
    tree = _parse(text)
    return _Renderer(columns).render(tree, 0)


def _parse(text: str) -> exp.Expr:
    try:
        raw = _DIALECT.tokenize(text)
    except TokenError:
        raise InvalidArgument(f"{FIELD}: unterminated string, identifier or comment") from None
    for token in raw:
        if token.comments:
            raise InvalidArgument(f"{FIELD}: comments are not allowed")
        if token.token_type == TokenType.SEMICOLON:
            raise InvalidArgument(f"{FIELD}: `;` is not allowed: a filter is one expression")
    try:
        trees = _DIALECT.parser().parse(raw, text)
    except ParseError as exc:
        raise InvalidArgument(f"{FIELD}: does not parse: {_describe(exc)}") from None
    except RecursionError:
        raise InvalidArgument(f"{FIELD}: nested too deeply") from None
    if len(trees) != 1 or trees[0] is None:
        raise InvalidArgument(f"{FIELD}: empty; leave it unset to read every row")
    return trees[0]


def _describe(exc: ParseError) -> str:
    if not exc.errors:
        return "not a SQL expression"
    first = exc.errors[0]
    near = (first.get("highlight") or "").strip()
    at = f"line {first.get('line')}, column {first.get('col')}" + (
        f", near {near!r}" if near else ""
    )
    description = str(first.get("description") or "")
    # Some descriptions speak of sqlglot's own classes; the position says enough then.
    return f"{description} ({at})" if description and "<class" not in description else at


class _Renderer:
    """Walks a parsed expression, checks each node, and writes the SQL that will run."""

    def __init__(self, columns: Columns) -> None:
        self._columns = columns

    def render(self, node: exp.Expr, depth: int) -> str:
        if depth > MAX_DEPTH:
            raise InvalidArgument(f"{FIELD}: nested deeper than {MAX_DEPTH} levels")
        handler = _HANDLERS.get(type(node))
        if handler is not None:
            return handler(self, node, depth)
        if type(node) in _BINARY:
            _only(node, "this", "expression")
            left = self.render(node.this, depth + 1)
            right = self.render(node.expression, depth + 1)
            return f"({left} {_BINARY[type(node)]} {right})"
        if type(node) in _FUNCTIONS:
            return self._function(node, depth)
        raise InvalidArgument(f"{FIELD}: {_not_allowed(node)}")

    def _column(self, node: exp.Expr, depth: int) -> str:
        if node.args.get("table") is not None:
            raise InvalidArgument(
                f"{FIELD}: {node.sql()!r} names another table; only the columns of map "
                f'{self._columns.map_name!r} can be used (quote a name with dots: "a.b")'
            )
        _only(node, "this")
        name = node.this
        if not isinstance(name, exp.Identifier):
            raise InvalidArgument(f"{FIELD}: {node.sql()!r} is not a column name")
        column = self._columns.resolve(name.this, quoted=bool(name.quoted), where=FIELD)
        return self._columns.reference(column)

    def _literal(self, node: exp.Expr, depth: int) -> str:
        _only(node, "this", "is_string")
        text = str(node.this)
        if node.args.get("is_string"):
            return sql.string(text)
        if not _NUMBER.fullmatch(text):
            raise InvalidArgument(f"{FIELD}: {text!r} is not a number")
        return text

    def _constant(self, node: exp.Expr, depth: int) -> str:
        if isinstance(node, exp.Null):
            return "NULL"
        return sql.boolean(bool(node.this))

    def _wrap(self, node: exp.Expr, depth: int) -> str:
        _only(node, "this")
        inner = self.render(node.this, depth + 1)
        if isinstance(node, exp.Neg):
            return f"(- {inner})"
        if isinstance(node, exp.Not):
            return f"(NOT {inner})"
        return f"({inner})"

    def _is(self, node: exp.Expr, depth: int) -> str:
        _only(node, "this", "expression")
        target = node.expression
        if not isinstance(target, exp.Null | exp.Boolean):
            raise InvalidArgument(f"{FIELD}: IS takes NULL, TRUE or FALSE")
        return f"({self.render(node.this, depth + 1)} IS {self._constant(target, depth)})"

    def _in(self, node: exp.Expr, depth: int) -> str:
        _only(node, "this", "expressions")
        listed = ", ".join(self.render(e, depth + 1) for e in node.expressions)
        if not listed:
            raise InvalidArgument(f"{FIELD}: IN needs at least one value")
        return f"({self.render(node.this, depth + 1)} IN ({listed}))"

    def _between(self, node: exp.Expr, depth: int) -> str:
        _only(node, "this", "low", "high")
        value, low, high = (self.render(node.args[k], depth + 1) for k in ("this", "low", "high"))
        return f"({value} BETWEEN {low} AND {high})"

    def _like(self, node: exp.Expr, depth: int) -> str:
        _only(node, "this", "expression", "negate")
        op = "ILIKE" if isinstance(node, exp.ILike) else "LIKE"
        negate = "NOT " if node.args.get("negate") else ""
        value = self.render(node.this, depth + 1)
        pattern = self.render(node.expression, depth + 1)
        return f"({value} {negate}{op} {pattern})"

    def _cast(self, node: exp.Expr, depth: int) -> str:
        _only(node, "this", "to")
        kind = node.args["to"].this  # a sqlglot DataType's enum member
        type_name = str(getattr(kind, "name", kind))
        target = _CAST_TYPES.get(type_name)
        if target is None:
            allowed = ", ".join(sorted(set(_CAST_TYPES.values())))
            raise InvalidArgument(f"{FIELD}: CAST to {type_name} is not allowed ({allowed})")
        return f"CAST({self.render(node.this, depth + 1)} AS {target})"

    def _function(self, node: exp.Expr, depth: int) -> str:
        name, params = _FUNCTIONS[type(node)]
        _only(node, *params)
        args: list[str] = []
        for param in params:
            value = node.args.get(param)
            values = value if isinstance(value, list) else [] if value is None else [value]
            args.extend(self.render(v, depth + 1) for v in values)
        return f"{name}({', '.join(args)})"


_Handler = Callable[[_Renderer, exp.Expr, int], str]
_HANDLERS: dict[type[exp.Expr], _Handler] = {
    exp.Column: _Renderer._column,
    exp.Literal: _Renderer._literal,
    exp.Null: _Renderer._constant,
    exp.Boolean: _Renderer._constant,
    exp.Paren: _Renderer._wrap,
    exp.Neg: _Renderer._wrap,
    exp.Not: _Renderer._wrap,
    exp.Is: _Renderer._is,
    exp.In: _Renderer._in,
    exp.Between: _Renderer._between,
    exp.Like: _Renderer._like,
    exp.ILike: _Renderer._like,
    exp.Cast: _Renderer._cast,
}


def _only(node: exp.Expr, *handled: str) -> None:
    """Refuse a node that carries a clause the renderer would not write out."""
    ignored = _IGNORED_FLAGS.get(type(node), frozenset())
    for key, value in node.args.items():
        if key in handled or key in ignored or value is None or value is False or value == []:
            continue
        raise InvalidArgument(f"{FIELD}: {_clause(node, key)} is not allowed")


def _clause(node: exp.Expr, key: str) -> str:
    if isinstance(node.args[key], exp.Query | exp.Subquery):
        return "a subquery"
    return f"{_kind(node)} with {key.upper()}"


def _not_allowed(node: exp.Expr) -> str:
    if isinstance(node, exp.Query | exp.Subquery | exp.Exists):
        what = "a subquery or statement"
        if isinstance(node, exp.SetOperation):
            what = f"a set operation ({_kind(node)})"
        return f"{what} is not allowed; write a condition on this map's columns"
    if isinstance(node, exp.Table):
        return "other tables are not allowed"
    if isinstance(node, exp.Anonymous):
        return f"function {node.name}() is not allowed (allowed: {FUNCTION_NAMES})"
    if isinstance(node, exp.Func):
        return f"function {node.sql_name().lower()}() is not allowed (allowed: {FUNCTION_NAMES})"
    if isinstance(node, exp.Placeholder | exp.Parameter):
        return "parameters are not allowed; write the value itself"
    return f"{_kind(node)} is not allowed in a filter"


def _kind(node: exp.Expr) -> str:
    return node.key.upper()
