"""Debezium's JSON encodings read back in the JVM, against a plain-Python encoder of them.

The encoder below writes values as Kafka Connect's JSON converter does for Debezium
(decimals as two's-complement bytes in base64, numerics without precision as
scale and bytes, dates as days, timestamps as epoch units, zoned ones as ISO text);
the decoder must give back exactly the values encoded. Real Debezium output is
folded end to end in test_debezium_maps.py.
"""

from __future__ import annotations

import base64
import datetime
import random
from decimal import Decimal
from typing import Any

import orjson
import pytest

from materializer import record_columns as c
from materializer.config import MapConfig
from materializer.source.decode import decode
from materializer.source.keys import assign_keys
from materializer.source.transforms import apply_transforms

EPOCH = datetime.datetime(1970, 1, 1)
ROW = (
    "id INT, price DECIMAL(38,6), amount DECIMAL(38,10), born DATE, seen TIMESTAMP_NTZ, "
    "at TIMESTAMP, note STRING, raw BINARY"
)
NAMES = {
    "price": ("org.apache.kafka.connect.data.Decimal", {"scale": "6"}),
    "seen": (None, None),
}


def unscaled_bytes(value: Decimal, scale: int) -> bytes:
    unscaled = int(value.scaleb(scale))
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return unscaled.to_bytes(size, "big", signed=True)


def precise(value: Decimal, scale: int) -> str:
    return base64.b64encode(unscaled_bytes(value, scale)).decode()


def variable(value: Decimal) -> dict[str, Any]:
    scale = max(0, -value.as_tuple().exponent)  # type: ignore[operator]
    return {"scale": scale, "value": precise(value, scale)}


def random_decimal(rng: random.Random, digits: int, scale: int) -> Decimal:
    unscaled = rng.randrange(-(10**digits) + 1, 10**digits)
    return Decimal(unscaled).scaleb(-scale)


def frame(spark, rows: list[tuple[bytes | None, bytes | None]]):
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField(c.KAFKA_KEY, T.BinaryType()),
            T.StructField(c.VALUE, T.BinaryType()),
            T.StructField(c.PARTITION, T.IntegerType()),
            T.StructField(c.OFFSET, T.LongType()),
        ]
    )
    return spark.createDataFrame([(k, v, 0, i) for i, (k, v) in enumerate(rows)], schema)


def decoded(
    spark, rows, row: str = ROW, key: str = "$kafka_key", transforms: list | None = None
) -> list[dict]:
    config = MapConfig.model_validate(
        {
            "source": {"topics": ["t"], "envelope": "debezium", "schema": row},
            "key": key,
            "transforms": transforms or [],
        }
    )
    out = assign_keys(
        apply_transforms(decode(frame(spark, rows), config), config.transforms), config
    )
    return [r.asDict(recursive=True) for r in out.orderBy(c.OFFSET).collect()]


def event(after: dict | None, op: str = "c", before: dict | None = None, **extra: Any) -> dict:
    return {"before": before, "after": after, "op": op, "ts_ms": 2, "source": {"ts_ms": 1}, **extra}


def wrapped(envelope: dict, names: dict[str, tuple[str | None, dict | None]]) -> dict:
    fields = [
        {"field": name, "name": kind, "parameters": parameters}
        for name, (kind, parameters) in names.items()
    ]
    schema = {"type": "struct", "fields": [{"field": "after", "fields": fields}]}
    return {"schema": schema, "payload": envelope}


def test_decimals_read_exactly_in_every_encoding(spark):
    rng = random.Random(50)
    expected: list[tuple[Decimal, Decimal]] = []
    rows = []
    for i in range(300):
        price = random_decimal(rng, rng.choice([1, 5, 18, 19, 32]), 6)
        amount = random_decimal(rng, rng.choice([1, 9, 20, 28]), rng.randint(0, 10))
        after = {"id": i, "price": precise(price, 6), "amount": variable(amount)}
        doc = event(after)
        if i % 3 == 1:
            doc = wrapped(doc, NAMES)
        if i % 3 == 2:  # decimal.handling.mode double: a number with a point
            after["price"] = float(price) if abs(price) < 10**9 else precise(price, 6)
            if isinstance(after["price"], float):
                price = Decimal(repr(after["price"])).quantize(Decimal("0.000001"))
        expected.append((price, amount))
        rows.append((orjson.dumps({"id": i}), orjson.dumps(doc)))
    edge = [Decimal(10**32 - 1).scaleb(-6), Decimal(-(10**32) + 1).scaleb(-6), Decimal(0)]
    for value in edge:
        i = len(rows)
        rows.append(
            (orjson.dumps({"id": i}), orjson.dumps(event({"id": i, "price": precise(value, 6)})))
        )
        expected.append((value, None))
    out = decoded(spark, rows)
    assert [r[c.ERROR_MESSAGE] for r in out] == [None] * len(rows)
    assert [(r["price"], r["amount"]) for r in out] == expected


def test_times_in_every_unit_before_and_after_1970(spark):
    rng = random.Random(7)
    names = [
        "io.debezium.time.Timestamp",
        "io.debezium.time.MicroTimestamp",
        "io.debezium.time.NanoTimestamp",
        None,
    ]
    rows, expected = [], []
    for i in range(200):
        micros = rng.randrange(-(2**40) * 1000, 2**41 * 1000)
        name = names[i % 4]
        if name == "io.debezium.time.Timestamp":
            micros -= micros % 1000
            wire = micros // 1000
        elif name == "io.debezium.time.NanoTimestamp":
            wire = micros * 1000 + rng.randrange(1000)
        else:
            wire = micros
        days = rng.randrange(-40000, 40000)
        zoned = EPOCH + datetime.timedelta(microseconds=rng.randrange(0, 2**41 * 1000))
        after = {"id": i, "seen": wire, "born": days, "at": zoned.isoformat() + "Z"}
        doc = event(after)
        if name is not None:
            doc = wrapped(doc, {"seen": (name, None)})
        rows.append((orjson.dumps({"id": i}), orjson.dumps(doc)))
        expected.append(
            (
                EPOCH + datetime.timedelta(microseconds=micros),
                (EPOCH + datetime.timedelta(days=days)).date(),
                # PySpark gives a TIMESTAMP back in the process's time zone.
                datetime.datetime.fromtimestamp(zoned.replace(tzinfo=datetime.UTC).timestamp()),
            )
        )
    out = decoded(spark, rows)
    assert [r[c.ERROR_MESSAGE] for r in out] == [None] * len(rows)
    assert [(r["seen"], r["born"], r["at"]) for r in out] == expected


def test_what_each_op_means(spark):
    toasted = "__debezium_unavailable_value"
    rows = [
        (b'{"id": 1}', orjson.dumps(event({"id": 1, "note": "n1"}, op="r"))),
        (
            b'{"id": 1}',
            orjson.dumps(
                event(
                    {"id": 1, "note": toasted, "raw": base64.b64encode(toasted.encode()).decode()},
                    op="u",
                )
            ),
        ),
        (b'{"id": 1}', orjson.dumps(event(None, op="d", before={"id": 1}))),
        (b'{"id": 1}', None),  # the tombstone after the delete: left out
        (
            orjson.dumps({"schema": {"type": "struct"}, "payload": {"id": 2}}),
            orjson.dumps(wrapped(event({"id": 2}), {})),
        ),
        (b'{"id": 3}', b'{"op": "x", "after": {"id": 3}}'),
        (b'{"id": 3}', b'{"op": "u", "after": null}'),
        (b'{"id": 3}', b'{"after": {"id": 3}}'),
        (b'{"id": 4, "tenant": "acme"}', orjson.dumps(event({"id": 4}))),
        (b'{"id": "five"}', orjson.dumps(event({"id": 5}))),
    ]
    out = decoded(spark, rows)
    assert [r[c.OFFSET] for r in out] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    summary = [(r[c.KEY], r[c.DELETED], r[c.OP], r[c.ERROR_MESSAGE]) for r in out]
    assert summary == [
        ("1", False, "r", None),
        ("1", False, "u", None),
        ("1", True, "d", None),
        ("2", False, "c", None),
        ("3", False, "x", "op x is not one of Debezium's (c, r, u, d, t)"),
        ("3", False, "u", "op u without after: no row to fold"),
        ("3", False, None, "value is not Debezium's change event: no op"),
        ('{"id":"4","tenant":"acme"}', False, "c", None),
        ("five", False, "c", None),
    ]
    assert out[0]["note"] == "n1" and out[0][c.UNAVAILABLE] == []
    assert out[1]["note"] is None and out[1]["raw"] is None
    assert out[1][c.UNAVAILABLE] == ["note", "raw"]
    assert out[2][c.BEFORE]["id"] == 1 and out[2]["id"] == 1
    assert (out[0][c.TS_MS], out[0][c.SOURCE_TS_MS]) == (2, 1)


def test_a_key_field_of_a_delete_is_found_in_before_and_filters_keep_deletes(spark):
    rows = [
        (b'{"id": 1}', orjson.dumps(event({"id": 1, "note": "a"}))),
        (b'{"id": 2}', orjson.dumps(event({"id": 2, "note": "b"}))),
        (b'{"id": 1}', orjson.dumps(event(None, op="d", before={"id": 1}))),
        (None, orjson.dumps(event(None, op="t"))),
    ]
    keep_a = [{"type": "filter", "condition": "note = 'a'"}]
    out = decoded(spark, rows, key="id", transforms=keep_a)
    summary = [(r[c.KEY], r[c.DELETED]) for r in out]
    assert summary == [("1", False), ("1", True), (c.TRUNCATE_KEY, True)]


@pytest.mark.parametrize("event_time", ["ts_ms", "source.ts_ms"])
def test_the_envelope_times_order_the_fold(spark, event_time):
    from materializer.fold.base import order_column

    rows = [(b'{"id": 1}', orjson.dumps(event({"id": 1}, ts_ms=5, source={"ts_ms": 9})))]
    config = MapConfig.model_validate(
        {
            "source": {"topics": ["t"], "envelope": "debezium", "schema": "id INT"},
            "key": "$kafka_key",
            "fold": {"event_time": event_time},
        }
    )
    records = decode(frame(spark, rows), config)
    (order,) = records.select(order_column(records, event_time)).first()
    expected = 5 if event_time == "ts_ms" else 9
    assert order.startswith("1" + str(expected + 2**63).zfill(20) + "\x00")


def test_a_row_column_named_like_an_envelope_time_is_refused(spark):
    from materializer.errors import ConfigError
    from materializer.fold.base import order_column

    config = MapConfig.model_validate(
        {
            "source": {"topics": ["t"], "envelope": "debezium", "schema": "id INT, ts_ms BIGINT"},
            "key": "$kafka_key",
        }
    )
    records = decode(frame(spark, [(b"1", orjson.dumps(event({"id": 1})))]), config)
    with pytest.raises(ConfigError, match="ts_ms is both a column of the row"):
        order_column(records, "ts_ms")
