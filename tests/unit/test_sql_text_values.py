"""Statement parameters typed from text (the CLI's ``--param``, the console's lines), their
wire form from the Python client, and values shown as text in a cell."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
import typer

from materializer.commands.sql import _min_offsets
from query_service.client import sql_param
from query_service.console.sql_page import _as_typed, _params
from query_service.sql_text import text_of, text_param


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42),
        (" -7 ", -7),
        (str(2**64), 2**64),  # exact, for sql_param to refuse, never a rounded float
        ("1.5", 1.5),
        ("1e3", 1000.0),
        ("true", True),
        ("false", False),
        ("null", None),
        ('"42"', "42"),
        ('"null"', "null"),
        ("gold", "gold"),
        ("", ""),
        ("[1, 2]", "[1, 2]"),
        ('{"a": 1}', '{"a": 1}'),
        ("2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),
    ],
)
def test_a_parameter_is_typed_from_its_text(text, value):
    typed = text_param(text)
    assert typed == value and type(typed) is type(value)


@pytest.mark.parametrize("value", ["42", "null", "true", "gold", "", " x ", 42, -1.5, True, None])
def test_the_consoles_cli_command_types_a_parameter_as_the_page_did(value):
    assert text_param(_as_typed(value)) == value


def test_the_consoles_parameters_are_its_non_blank_lines():
    assert _params('gold\n\n  20 \n""\n') == ["gold", "20", '""']


def test_the_clients_wire_form_of_each_type():
    assert sql_param(None).WhichOneof("value") == "null"
    assert sql_param(True).bool_value is True
    assert sql_param(-(2**63)).int_value == -(2**63)
    assert sql_param(2.5).double_value == 2.5
    assert sql_param("x").string_value == "x"
    assert sql_param(b"\x00").bytes_value == b"\x00"
    assert sql_param(Decimal("12.50")).decimal_value == "12.50"
    stamp = sql_param(datetime(2026, 1, 2, 3, 4, 5, 600_000, tzinfo=UTC)).timestamp_value
    assert (stamp.seconds, stamp.nanos) == (1767323045, 600_000_000)
    with pytest.raises(ValueError, match="64 bits"):
        sql_param(2**63)
    with pytest.raises(ValueError, match="needs its zone"):
        sql_param(datetime(2026, 1, 2))
    with pytest.raises(TypeError, match="list"):
        sql_param([1])  # type: ignore[arg-type]


def test_a_cell_shows_a_value_as_text():
    assert text_of("<b>") == "<b>"
    assert text_of(b"\x00\x01") == "AAE="
    assert text_of(Decimal("12.50")) == "12.50"
    assert text_of(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05+00:00"
    assert text_of(date(2026, 1, 2)) == "2026-01-02"
    assert text_of(1.5) == "1.5"
    assert text_of(True) == "true"
    assert text_of({"a": [1, None]}) == '{"a":[1,null]}'


def test_min_offsets_are_topic_partition_offset():
    assert _min_offsets("") == {}
    assert _min_offsets("user.events:0:5, orders:12:70") == {
        ("user.events", 0): 5,
        ("orders", 12): 70,
    }
    for bad in ("orders:0", "orders:x:1", ":0:1", "orders:0:1:2x"):
        with pytest.raises(typer.Exit):
            _min_offsets(bad)
