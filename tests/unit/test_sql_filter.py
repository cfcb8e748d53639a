"""Query filters: WHERE text and structured predicates, checked and rendered as SQL.

The golden renderings pin what reaches DataFusion; the refusals pin that
nothing but a condition over the map's own columns gets through; the
round-trip tests run the rendered literals through DataFusion itself.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from materializer.v1 import map_service_pb2 as pb
from query_service.errors import InvalidArgument, ResourceExhausted
from query_service.filters import Columns, render_filter, render_predicate, render_where
from query_service.filters import sql as sql_text
from query_service.filters.where import MAX_WHERE_CHARS

COLUMNS = Columns("users", ("_key", "id", "name", "age", "tags", "joined", "a.b", "Mixed"))
Op = pb.Comparison.Operator


def where(text: str) -> str:
    return render_where(text, COLUMNS)


def refused(text: str) -> str:
    with pytest.raises(InvalidArgument) as info:
        where(text)
    return str(info.value)


@pytest.mark.parametrize(
    ("text", "rendered"),
    [
        ("age >= 18 AND name = 'Oslo'", """(("age" >= 18) AND ("name" = 'Oslo'))"""),
        ("age > 1 OR NOT (age < 5)", """(("age" > 1) OR (NOT (("age" < 5))))"""),
        ("id IN ('u1', 'u2')", """("id" IN ('u1', 'u2'))"""),
        ("id NOT IN ('u1')", """(NOT ("id" IN ('u1')))"""),
        ("age BETWEEN 1 AND 2", """("age" BETWEEN 1 AND 2)"""),
        ("name LIKE 'a%'", """("name" LIKE 'a%')"""),
        ("name NOT ILIKE 'a%'", """("name" NOT ILIKE 'a%')"""),
        ("name IS NULL", """("name" IS NULL)"""),
        ("name IS NOT NULL", """(NOT ("name" IS NULL))"""),
        ("age IS DISTINCT FROM 3", """("age" IS DISTINCT FROM 3)"""),
        ("age - -1 = 2", """(("age" - (- 1)) = 2)"""),
        ("age % 2 = 0", """(("age" % 2) = 0)"""),
        ("age / 2 * 3 + 1 > 4.5e1", """(((("age" / 2) * 3) + 1) > 4.5e1)"""),
        ("name || 'x' = 'yx'", """(("name" || 'x') = 'yx')"""),
        ("lower(name) = upper(name)", """(lower("name") = upper("name"))"""),
        ("length(name) > 3", """(character_length("name") > 3)"""),
        ("substr(name, 1, 2) = 'ab'", """(substr("name", 1, 2) = 'ab')"""),
        ("coalesce(age, 0) = 0", """(coalesce("age", 0) = 0)"""),
        ("abs(age) = round(age, 1)", """(abs("age") = round("age", 1))"""),
        ("array_contains(tags, 't1')", """array_has("tags", 't1')"""),
        ("CAST(age AS VARCHAR) = '3'", """(CAST("age" AS VARCHAR) = '3')"""),
        (
            "joined > TIMESTAMP '2026-01-01 00:00:00'",
            """("joined" > CAST('2026-01-01 00:00:00' AS TIMESTAMP))""",
        ),
        ("_key > 'u'", """("_key" > 'u')"""),
        ("TRUE AND age IS NOT NULL", """(TRUE AND (NOT ("age" IS NULL)))"""),
    ],
)
def test_allowed_expressions_render_with_quoted_identifiers(text: str, rendered: str):
    assert where(text) == rendered


def test_literals_are_escaped_not_spliced():
    assert where("name = 'it''s'") == """("name" = 'it''s')"""
    # DataFusion has no backslash escapes: a backslash is an ordinary character.
    assert where("name = 'a\\'") == """("name" = 'a\\')"""
    assert where("name = 'x'' OR ''1''=''1'") == """("name" = 'x'' OR ''1''=''1')"""


def test_column_names_resolve_like_sql():
    assert where("AGE = 1") == """("age" = 1)"""  # unquoted: case-insensitive
    assert where("mixed = 1") == """("Mixed" = 1)"""
    assert where('"Mixed" = 1') == """("Mixed" = 1)"""
    assert where('"a.b" = 1') == where("`a.b` = 1") == """("a.b" = 1)"""
    assert "unknown column 'mixed'" in refused('"mixed" = 1')  # quoted: exact


def test_columns_without_statistics_are_read_through_a_function():
    """delta-rs 1.5 fails a scan whose skipping predicate names a list, map or struct column."""
    columns = Columns("users", ("_key", "tags", "age"), frozenset({"tags"}))
    assert render_where("tags IS NOT NULL AND age > 1", columns) == (
        """((NOT (coalesce("tags", NULL) IS NULL)) AND ("age" > 1))"""
    )
    is_null = comparison("tags", Op.IS_NULL)
    assert render_predicate(is_null, columns) == """(coalesce("tags", NULL) IS NULL)"""


def test_unknown_column_is_named_with_the_columns_there_are():
    message = refused("salary > 1")
    assert "unknown column 'salary'" in message
    assert "users" in message and "age" in message


def test_ambiguous_unquoted_column_asks_for_quotes():
    columns = Columns("m", ("_key", "Name", "NAME"))
    with pytest.raises(InvalidArgument, match="ambiguous"):
        render_where("name = 'x'", columns)


@pytest.mark.parametrize(
    ("text", "mentions"),
    [
        ("1=1; DROP TABLE users", ";"),
        ("age > 1;", ";"),
        ("id IN (SELECT id FROM users)", "subquery"),
        ("age = (SELECT max(age) FROM users)", "subquery"),
        ("EXISTS (SELECT 1)", "subquery"),
        ("age > 1 UNION SELECT * FROM users", "UNION"),
        ("age > 1 INTERSECT SELECT 1", "INTERSECT"),
        ("SELECT * FROM users", "statement"),
        ("DROP TABLE users", ""),
        ("other.age > 1", "another table"),
        ("users.age > 1", "another table"),
        ("a.b.c = 1", "another table"),
        ("read_parquet('/etc/passwd') IS NOT NULL", "read_parquet"),
        ("read_csv('/etc/passwd') IS NOT NULL", "read_csv"),
        ("foo(age) = 1", "foo"),
        ("now() > joined", "now"),
        ("age = 1 -- comment", "comment"),
        ("age = 1 /* comment */", "comment"),
        ("/* x */ age = 1", "comment"),
        ("age = 1 /* unterminated", "unterminated"),
        ("name = 'unterminated", "unterminated"),
        ("age = ?", "parameter"),
        ("age = :p", "parameter"),
        ("age = @p", "parameter"),
        ("tags[1] = 'x'", "BRACKET"),
        ("age = 1 AS x", "ALIAS"),
        ("CASE WHEN age > 1 THEN 1 END = 1", "case"),
        ("name LIKE 'x' ESCAPE '!'", "ESCAPE"),
        ("trim(BOTH 'x' FROM name) = ''", "POSITION"),
        ("CAST(age AS DECIMAL(3, 1)) = 1", "DECIMAL"),
        ("(age = 1", "parse"),
        ("age = 1)", ""),
        ("age AND", "parse"),
        ("", "empty"),
        ("   ", "empty"),
        ("*", ""),
    ],
)
def test_anything_but_a_condition_on_the_table_is_refused(text: str, mentions: str):
    message = refused(text)
    assert message.startswith("where:")
    assert mentions in message


def test_deep_nesting_is_refused_not_a_crash():
    assert "nested" in refused("(" * 2000 + "age = 1" + ")" * 2000)
    assert "nested" in refused("NOT " * 100 + "age = 1")


def test_oversized_where_is_resource_exhausted():
    with pytest.raises(ResourceExhausted):
        where("age = 1 OR " * (MAX_WHERE_CHARS // 10) + "age = 2")


# --- structured predicates ---------------------------------------------------------------


def comparison(field: str, op: int, value: pb.Value | None = None, **kw) -> pb.Predicate:
    return pb.Predicate(comparison=pb.Comparison(field=field, op=op, value=value, **kw))


def pred(p: pb.Predicate) -> str:
    return render_predicate(p, COLUMNS)


def test_each_operator_renders():
    s = pb.Value(string_value="O'Brien")
    i = pb.Value(int_value=-3)
    assert pred(comparison("name", Op.EQ, s)) == """("name" = 'O''Brien')"""
    assert pred(comparison("age", Op.NE, i)) == """("age" <> -3)"""
    assert pred(comparison("age", Op.LT, i)) == """("age" < -3)"""
    assert pred(comparison("age", Op.LE, pb.Value(double_value=2.5))) == """("age" <= 2.5)"""
    assert pred(comparison("age", Op.GT, pb.Value(bool_value=True))) == """("age" > TRUE)"""
    assert pred(comparison("age", Op.GE, i)) == """("age" >= -3)"""
    assert (
        pred(comparison("id", Op.IN, values=[pb.Value(string_value="a"), pb.Value(int_value=1)]))
        == """("id" IN ('a', 1))"""
    )
    assert pred(comparison("id", Op.IN)) == "FALSE"
    assert pred(comparison("name", Op.IS_NULL)) == """("name" IS NULL)"""
    assert pred(comparison("name", Op.IS_NOT_NULL)) == """("name" IS NOT NULL)"""
    assert pred(comparison("name", Op.LIKE, pb.Value(string_value="a%"))) == (
        """("name" LIKE 'a%')"""
    )
    when = pb.Value()
    when.timestamp_value.FromDatetime(datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC))
    assert pred(comparison("joined", Op.GE, when)) == (
        """("joined" >= CAST('2026-01-02T03:04:05.000006Z' AS TIMESTAMP))"""
    )


def test_and_or_not_nest():
    a = comparison("age", Op.GT, pb.Value(int_value=1))
    b = comparison("name", Op.IS_NULL)
    tree = pb.Predicate(**{"and": pb.Predicate.And(all=[a, pb.Predicate(**{"not": b})])})
    either = pb.Predicate(**{"or": pb.Predicate.Or(any=[tree, a])})
    assert pred(either) == ("""((("age" > 1) AND (NOT ("name" IS NULL))) OR ("age" > 1))""")
    assert pred(pb.Predicate(**{"and": pb.Predicate.And()})) == "TRUE"
    assert pred(pb.Predicate(**{"or": pb.Predicate.Or()})) == "FALSE"


@pytest.mark.parametrize(
    ("predicate", "mentions"),
    [
        (pb.Predicate(), "predicate: empty"),
        (comparison("salary", Op.EQ, pb.Value(int_value=1)), "predicate.comparison.field"),
        (comparison("AGE", Op.EQ, pb.Value(int_value=1)), "unknown column 'AGE'"),
        (comparison("age", Op.OPERATOR_UNSPECIFIED), "predicate.comparison.op"),
        (comparison("age", Op.EQ), "needs a value"),
        (comparison("age", Op.EQ, pb.Value()), "predicate.comparison.value: empty"),
        (comparison("age", Op.IS_NULL, pb.Value(int_value=1)), "takes no value"),
        (comparison("age", Op.IN, pb.Value(int_value=1)), "values"),
        (comparison("age", Op.EQ, pb.Value(int_value=1), values=[pb.Value()]), "only IN"),
        (comparison("name", Op.LIKE, pb.Value(int_value=1)), "string_value"),
        (comparison("age", Op.GT, pb.Value(double_value=float("nan"))), "finite"),
        (
            pb.Predicate(
                **{"and": pb.Predicate.And(all=[comparison("age", Op.IS_NULL), pb.Predicate()])}
            ),
            "predicate.and.all[1]: empty",
        ),
    ],
)
def test_malformed_predicates_name_the_part(predicate: pb.Predicate, mentions: str):
    with pytest.raises(InvalidArgument) as info:
        pred(predicate)
    assert mentions in str(info.value)


def test_deep_predicate_is_refused():
    p = comparison("name", Op.IS_NULL)
    for _ in range(100):
        p = pb.Predicate(**{"not": p})
    with pytest.raises(InvalidArgument, match="nested deeper"):
        pred(p)


def test_request_filter_picks_predicate_where_or_nothing():
    assert render_filter(pb.QueryRequest(map="users"), COLUMNS) is None
    assert render_filter(pb.QueryRequest(where="age > 1"), COLUMNS) == """("age" > 1)"""
    request = pb.QueryRequest(predicate=comparison("name", Op.IS_NULL))
    assert render_filter(request, COLUMNS) == """("name" IS NULL)"""


# --- rendered literals and identifiers through DataFusion itself ---------------------------


@pytest.fixture(scope="module")
def engine_table(tmp_path_factory: pytest.TempPathFactory) -> DeltaTable:
    path: Path = tmp_path_factory.mktemp("literals") / "t"
    nested = {
        "tags": pa.array([["t"], None], pa.list_(pa.string())),
        "addr": pa.array([{"city": "Oslo"}, None], pa.struct([("city", pa.string())])),
        "attrs": pa.array([[("k", 1)], None], pa.map_(pa.string(), pa.int64())),
    }
    write_deltalake(str(path), pa.table({"_key": ["a", "b"], 'we"ird col': [1, 2], **nested}))
    return DeltaTable(str(path))


def engine_rows(table: DeltaTable, query: str) -> list[dict[str, object]]:
    reader = QueryBuilder().register("t", table).execute(query)
    rows: list[dict[str, object]] = pa.RecordBatchReader.from_stream(reader).read_all().to_pylist()
    return rows


def engine_value(table: DeltaTable, expression: str) -> object:
    query = f'SELECT {expression} AS v FROM "t" LIMIT 1'  # noqa: S608 - tests the quoting itself
    return engine_rows(table, query)[0]["v"]


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",))))
def test_string_literals_round_trip_through_the_engine(engine_table: DeltaTable, text: str):
    assert engine_value(engine_table, sql_text.string(text)) == text


def test_quoted_identifiers_round_trip_through_the_engine(engine_table: DeltaTable):
    assert engine_value(engine_table, sql_text.identifier('we"ird col')) == 1


@pytest.mark.parametrize("value", [0.1, -2.5e-7, 1e300, 123456789.125])
def test_double_literals_round_trip_through_the_engine(engine_table: DeltaTable, value: float):
    assert engine_value(engine_table, sql_text.double(value, "v")) == value


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ("tags IS NULL", ["b"]),
        ("addr IS NOT NULL", ["a"]),
        ("attrs IS NULL OR _key = 'a'", ["a", "b"]),
        ("array_contains(tags, 't') AND NOT (addr IS NULL)", ["a"]),
    ],
)
def test_filters_on_columns_without_statistics_run(engine_table: DeltaTable, text: str, keys):
    columns = Columns(
        "t", ("_key", 'we"ird col', "tags", "addr", "attrs"), frozenset({"tags", "addr", "attrs"})
    )
    query = f'SELECT "_key" FROM "t" WHERE {render_where(text, columns)} ORDER BY "_key"'  # noqa: S608

    assert [r["_key"] for r in engine_rows(engine_table, query)] == keys
