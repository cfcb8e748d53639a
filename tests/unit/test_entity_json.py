"""The column-wise entity encoder against its row-at-a-time definition and Java's number text."""

from __future__ import annotations

import math
import random
import struct
from datetime import UTC, date, datetime, timedelta

import orjson
import pyarrow as pa
import pytest

from materializer.contract.entity_json import encode_rows, java_number


@pytest.mark.parametrize(
    ("shortest", "java"),
    [
        ("0.0", "0.0"),
        ("-0.0", "-0.0"),
        ("1.0", "1.0"),
        ("100.0", "100.0"),
        ("9999999.0", "9999999.0"),
        ("10000000.0", "1.0E7"),
        ("12345678.9", "1.23456789E7"),
        ("0.001", "0.001"),
        ("0.000999", "9.99E-4"),
        ("1e-07", "1.0E-7"),
        ("1.7976931348623157e+308", "1.7976931348623157E308"),
        ("-4.5e-07", "-4.5E-7"),
        ("1e+16", "1.0E16"),
    ],
)
def test_numbers_take_javas_layout(shortest: str, java: str):
    assert java_number(shortest) == java


def _one(values: pa.Array) -> list[bytes]:
    table = pa.table({"_key": [str(i) for i in range(len(values))], "v": values})
    return [v for _, v in encode_rows(table, "_key")]


def test_doubles_column_wise_match_python_one_by_one():
    rng = random.Random(7)
    values = [rng.random() * 10 ** rng.randint(-12, 12) * rng.choice((1, -1)) for _ in range(3000)]
    values += [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(500)]
    values += [0.0, -0.0, 1e-3, 1e7, math.nan, math.inf, -math.inf, None]
    encoded = _one(pa.array(values, pa.float64()))
    for value, text in zip(values, encoded, strict=True):
        if value is None:
            assert text == b"{}"
        elif math.isnan(value):
            assert text == b'{"v":"NaN"}'
        elif math.isinf(value):
            assert text == (b'{"v":"Infinity"}' if value > 0 else b'{"v":"-Infinity"}')
        else:
            assert text == b'{"v":' + java_number(repr(value)).encode() + b"}"
            assert orjson.loads(text)["v"] == value


def test_timestamps_and_dates_digit_by_digit_match_isoformat():
    rng = random.Random(3)
    base = datetime(1970, 1, 1, tzinfo=UTC)
    moments = [
        base + timedelta(microseconds=rng.randint(-62_000_000_000_000_000, 250_000_000_000_000_000))
        for _ in range(2000)
    ]
    moments += [datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999, UTC)]
    moments += [datetime(2000, 2, 29, tzinfo=UTC), datetime(1900, 3, 1, tzinfo=UTC)]
    zoned = _one(pa.array([*moments, None], pa.timestamp("us", "UTC")))
    local = _one(pa.array([m.replace(tzinfo=None) for m in moments], pa.timestamp("us")))
    days = _one(pa.array([m.date() for m in moments], pa.date32()))
    for moment, z, n, d in zip(moments, zoned, local, days, strict=False):
        wall = moment.replace(tzinfo=None).isoformat(timespec="microseconds")
        assert z == f'{{"v":"{wall}Z"}}'.encode()
        assert n == f'{{"v":"{wall}"}}'.encode()
        assert d == f'{{"v":"{moment.date().isoformat()}"}}'.encode()
    assert zoned[-1] == b"{}"
    assert _one(pa.array([date(2024, 1, 2), None], pa.date32())) == [b'{"v":"2024-01-02"}', b"{}"]


def test_strings_escape_as_json_and_rows_without_fields_are_empty_objects():
    texts = ["plain", 'q"uote', "back\\slash", "ctl\x01\n\t", "☃ é \u2028", "", None]
    encoded = _one(pa.array(texts, pa.string_view()))
    for text, value in zip(texts, encoded, strict=True):
        assert value == (b"{}" if text is None else b'{"v":' + orjson.dumps(text) + b"}")
    only_keys = pa.table({"_key": ["a", "b"]})
    assert encode_rows(only_keys, "_key") == [("a", b"{}"), ("b", b"{}")]


def test_fields_keep_the_tables_order_and_leave_nulls_out():
    table = pa.table(
        {
            "z": [1, None],
            "_key": ["k1", "k2"],
            "a": pa.array([None, True]),
            "m": pa.array([[("x", 1.0)], None], pa.map_(pa.string(), pa.float64())),
        }
    )
    assert encode_rows(table, "_key") == [
        ("k1", b'{"z":1,"m":{"x":1.0}}'),
        ("k2", b'{"a":true}'),
    ]


def test_a_table_without_rows_encodes_to_nothing():
    import datetime as dt

    empty = pa.table(
        {
            "_key": pa.array([], pa.string()),
            "at": pa.array([], pa.timestamp("us", "UTC")),
            "on": pa.array([], pa.date32()),
            "score": pa.array([], pa.float64()),
        }
    )
    assert encode_rows(empty, "_key") == []
    one = pa.table(
        {
            "_key": ["k"],
            "at": pa.array([dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)]),
            "on": pa.array([dt.date(2026, 1, 2)]),
            "score": [1.5],
        }
    )
    assert encode_rows(one, "_key") == [
        ("k", b'{"at":"2026-01-02T03:04:05.000006Z","on":"2026-01-02","score":1.5}')
    ]
