"""Index entries and the plans that read them, in plain Python: byte order is value order,
every entry gives its key back, and which filters an index serves, exactly or not (the
Lua side of the entries is checked against these in tests/integration/test_redis_indexes.py)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from materializer.contract.index_entries import END, entry, key_of, value_prefix
from query_service.indexes.plan import NON_FINITE, index_scan
from query_service.sql.statement import Selection, check

TYPES = {
    "city": pa.string(),
    "n": pa.int64(),
    "x": pa.float64(),
    "f": pa.float32(),
    "d": pa.decimal128(10, 2),
    "ok": pa.bool_(),
    "at": pa.timestamp("us"),
}
INDEXES = {"city": "hash", "n": "sorted", "x": "sorted", "f": "hash", "d": "hash", "ok": "hash"}


def test_byte_order_is_value_order_then_key_order() -> None:
    rng = random.Random(1)
    numbers = [0, -0.0, 1, -1, 2**53 + 1, -(2**63), 1e-300, -1e300, 10**400, -(10**400)]
    numbers += [rng.uniform(-1e6, 1e6) for _ in range(500)]
    assert sorted(numbers, key=lambda v: entry(v, "k")) == sorted(numbers)
    strings = ["", "a", "a\x00", "a\x00b", "a\x01", "ab", "b", "é", "😀", "\x00"]
    assert sorted(strings, key=lambda v: entry(v, "k")) == sorted(strings, key=str.encode)
    assert entry(False, "k") < entry(True, "k") < entry(-1e300, "k") < entry("", "k")
    assert entry("a", "k1") < entry("a", "k2") < entry("a\x00", "k0")


@pytest.mark.parametrize("value", ["", "a\x00", "a\x00\x00b", 1.5, -3, True, False, 10**400])
@pytest.mark.parametrize("key", ["k", "{tag}k", "ü-1", "a\x00b"])
def test_an_entry_gives_its_key_back_and_lies_in_its_values_span(value: object, key: str) -> None:
    member = entry(value, key)  # type: ignore[arg-type]
    assert key_of(member) == key
    prefix = value_prefix(value)  # type: ignore[arg-type]
    assert prefix <= member < prefix + END


def scan(where: str) -> tuple[str, tuple[tuple[bytes, bytes], ...], bool] | None:
    found = index_scan(where, INDEXES, TYPES)
    return None if found is None else (found.field, found.spans, found.exact)


def span(value: object) -> tuple[bytes, bytes]:
    prefix = value_prefix(value)  # type: ignore[arg-type]
    return prefix, prefix + END


def test_which_filters_an_index_serves() -> None:
    assert scan("(\"city\" = 'Oslo')") == ("city", (span("Oslo"),), True)
    assert scan("\"city\" IN ('b', 'a', 'b')") == ("city", (span("a"), span("b")), True)
    assert scan('(("city" = \'a\') AND ("n" > 3))') == ("city", (span("a"),), False)
    assert scan('("n" = 5)') == ("n", (span(5),), True)
    assert scan('("n" = 9007199254740993)') == ("n", (span(2**53 + 1),), False)
    assert scan('("d" = 1.5)')[2] is False  # type: ignore[index]
    assert scan('("f" = 0.1)')[2] is False  # type: ignore[index]
    # Ranges on a sorted index, inclusive whatever the comparison, literals on either side.
    assert scan('((3 < "n") AND ("n" <= - 2))') == ("n", (), False)
    assert scan('("n" BETWEEN 1 AND 4)') == (
        "n",
        ((value_prefix(1), value_prefix(4) + END),),
        False,
    )
    # A double column's range also reads the text the pipeline writes its non-finite values as.
    field, spans, _ = scan('("x" > 10)')  # type: ignore[misc]
    assert spans == ((value_prefix(10.0), b"o"), *sorted(span(t) for t in NON_FINITE))
    # Not served: an OR at the top, a range on a hash index, a literal of another kind, a
    # column JSON holds as text (a timestamp), a function of the field, no index.
    for where in (
        '(("city" = \'a\') OR ("n" = 1))',
        "(\"city\" > 'a')",
        '("city" = 5)',
        "(\"n\" = '5')",
        "(\"at\" = '2026-01-01')",
        "(lower(\"city\") = 'a')",
        '("id" = 1)',
    ):
        assert scan(where) is None, where
    # A literal past every double reads the entries of infinity; the filter decides.
    assert scan(f'("n" = {10**400})') == ("n", (span(10**400),), False)


def test_an_integer_past_every_double_has_an_entry() -> None:
    assert entry(10**400, "k") > entry(1e308, "k")
    assert entry(-(10**400), "k") < entry(-1e308, "k")


def test_a_statements_parameters_are_read_as_its_literals() -> None:
    def bound(where: str, *params: object) -> object:
        found = index_scan(where, INDEXES, TYPES, params)
        return None if found is None else (found.field, found.spans, found.exact)

    assert bound('"city" = @1', "Oslo") == ("city", (span("Oslo"),), True)
    assert bound('"n" IN (@2, @1)', 4, 2) == ("n", (span(2), span(4)), True)
    assert bound('"n" BETWEEN @1 AND -@2', 1, -4) == (
        "n",
        ((value_prefix(1), value_prefix(4) + END),),
        False,
    )
    # A parameter of another kind, not finite, not bound, or negated text: the engine's.
    for where, params in (
        ('"city" = @1', (5,)),
        ('"n" = @1', ("5",)),
        ('"x" > @1', (float("nan"),)),
        ('"n" = @2', (1,)),
        ('"city" = -@1', ("a",)),
        ('"n" = @1', (None,)),
    ):
        assert bound(where, *params) is None, (where, params)


def test_a_statement_over_one_map_with_a_where_is_a_selection() -> None:
    found = check("SELECT _key, City, count(*) FROM Users WHERE City = $1 AND n > 2 GROUP BY 1, 2")
    assert found.selection == Selection(
        "users", '"city" = @1 AND "n" > 2', frozenset({"_key", "city", "n"}), False
    )
    assert check('SELECT * FROM public."Users" WHERE "N" < 3 LIMIT 2').selection == Selection(
        "Users", '"N" < 3', frozenset({"N"}), True
    )
    found = check("SELECT users.* FROM users WHERE n = 1").selection
    assert found is not None and found.star  # a table's every column, as ``*``
    # A key lookup is one already; a join, a subquery, a WITH, an alias, no WHERE are not.
    for text in (
        "SELECT * FROM users WHERE _key = 'a'",
        "SELECT * FROM users u JOIN orders o ON u._key = o.user_id WHERE u.n = 1",
        "SELECT * FROM users WHERE n > (SELECT min(n) FROM users)",
        "WITH u AS (SELECT * FROM users) SELECT * FROM u WHERE n = 1",
        "SELECT * FROM users u WHERE u.n = 1",
        "SELECT * FROM users",
        "SELECT * FROM users WHERE n = 1 UNION SELECT * FROM users WHERE n = 2",
    ):
        assert check(text).selection is None, text
