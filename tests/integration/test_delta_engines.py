"""The Delta sink's two MERGE engines write the same table, and honour each other's
transactions: a batch one engine committed is a replay for the other."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

from materializer import record_columns as c
from materializer.batch import Batch
from materializer.contract.table_layout import COMMENT, AddedColumn
from materializer.delta.sink import DeltaSink

ENTITY = (
    "id STRING, `firstName` STRING, `a.b` INT, amount DECIMAL(10,2), seen TIMESTAMP, "
    "born DATE, score DOUBLE, flag BOOLEAN, n BIGINT, "
    "address STRUCT<city: STRING, at: TIMESTAMP>, tags ARRAY<STRING>, "
    "stamps ARRAY<TIMESTAMP>, attrs MAP<STRING, BIGINT>"
)


def _rows(spark, entities: list[tuple], schema: str = ENTITY):
    """Sink rows from (key, deleted, entity tuple or None)."""
    return spark.createDataFrame(
        entities, f"{c.KEY} STRING, {c.DELETED} BOOLEAN, {c.ENTITY} STRUCT<{schema}>"
    )


def _entity(i: int, name: str) -> tuple:
    at = dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC) + dt.timedelta(minutes=i)
    return (
        f"k{i}",
        name,
        i,
        Decimal(f"{i}.25"),
        at,
        dt.date(1990, 1, 1) + dt.timedelta(days=i),
        i / 3,
        i % 2 == 0,
        10**12 + i,
        (f"city {i}", at),
        [f"t{i}", None],
        [at, None],
        {"x": i, "y": None},
    )


def _table(spark, path: str) -> list[dict]:
    rows = spark.read.format("delta").load(path).orderBy(c.TABLE_KEY).collect()
    return [r.asDict(recursive=True) for r in rows]


def test_both_engines_write_the_same_table(spark, warehouse: Path):
    """Inserts, updates, deletes, a key deleted and written again, null fields and a field
    that later batches lack (cleared), through each engine into its own table."""
    later = ENTITY.replace("stamps ARRAY<TIMESTAMP>, ", "")  # stamps no longer written
    batches = [
        _rows(spark, [(f"k{i}", False, _entity(i, f"first {i}")) for i in range(6)]),
        _rows(
            spark,
            [
                ("k1", False, _entity(1, "changed")),
                ("k2", True, None),
                ("k6", False, _entity(6, None)),
                ("k9", True, None),  # never existed
            ],
        ),
        _rows(
            spark,
            [
                ("k2", False, (*_entity(2, "back")[:11], {"x": 2})),
                ("k3", True, None),
            ],
            later,
        ),
    ]
    tables = {}
    for engine in ("spark", "delta_rs"):
        path = str(warehouse / engine)
        sink = DeltaSink(path, engine=engine)
        for batch_id, rows in enumerate(batches):
            sink.write(Batch(rows, batch_id, "app"))
        tables[engine] = _table(spark, path)

    assert tables["delta_rs"] == tables["spark"]
    by_key = {row[c.TABLE_KEY]: row for row in tables["spark"]}
    assert sorted(by_key) == ["k0", "k1", "k2", "k4", "k5", "k6"]
    assert by_key["k1"]["firstName"] == "changed"
    assert by_key["k2"]["firstName"] == "back"
    assert by_key["k2"]["stamps"] is None  # cleared: the batch's entities lack it
    assert by_key["k0"]["stamps"] is not None  # rows the batch did not touch keep it
    assert by_key["k6"]["firstName"] is None
    assert by_key["k0"]["amount"] == Decimal("0.25")
    assert by_key["k4"]["seen"] == dt.datetime(2026, 1, 2, 3, 8, 5, 123456)
    assert by_key["k4"]["address"]["at"] == by_key["k4"]["seen"]
    assert by_key["k5"]["attrs"] == {"x": 5, "y": None}
    assert by_key["k5"]["a.b"] == 5


def test_a_batch_one_engine_committed_is_a_replay_for_the_other(spark, warehouse: Path):
    from deltalake import DeltaTable

    path = str(warehouse / "mixed")
    first = _rows(spark, [("k0", False, _entity(0, "first"))])
    again = _rows(spark, [("k0", False, _entity(0, "replayed"))])
    DeltaSink(path, engine="spark").write(Batch(first, 0, "app"))
    version = DeltaTable(path).version()
    DeltaSink(path, engine="delta_rs").write(Batch(again, 0, "app"))
    assert DeltaTable(path).version() == version

    DeltaSink(path, engine="delta_rs").write(Batch(first, 1, "app"))
    assert DeltaTable(path).transaction_version("app") == 1
    DeltaSink(path, engine="spark").write(Batch(again, 1, "app"))
    assert DeltaTable(path).version() == version + 1
    assert [row["firstName"] for row in _table(spark, path)] == ["first"]


def test_delta_rs_keeps_each_keys_last_change_by_partition_and_offset(spark, warehouse: Path):
    """The Delta query hands delta-rs the changelog's records as read, several per key and
    in no order; the table must hold what Spark's MERGE of the last per key holds."""
    from materializer.delta.query import last_per_key

    records = [  # key, deleted, entity, partition, offset
        ("a", False, _entity(1, "a at 9"), 0, 9),
        ("b", True, None, 1, 4),
        ("a", False, _entity(1, "a at 5"), 0, 5),
        ("c", False, _entity(3, "c at 10"), 1, 10),
        ("a", True, None, 0, 7),
        ("b", False, _entity(2, "b at 3"), 1, 3),
        ("d", False, _entity(4, "d at 2"), 0, 2),
        ("d", False, _entity(4, "d at 11"), 0, 11),
    ]
    changes = spark.createDataFrame(
        records,
        f"{c.KEY} STRING, {c.DELETED} BOOLEAN, {c.ENTITY} STRUCT<{ENTITY}>, "
        f"{c.PARTITION} INT, {c.OFFSET} BIGINT",
    )
    DeltaSink(str(warehouse / "rs")).write(Batch(changes, 0, "app"))
    DeltaSink(str(warehouse / "spark"), engine="spark").write(
        Batch(last_per_key(changes), 0, "app")
    )
    table = _table(spark, str(warehouse / "rs"))
    assert table == _table(spark, str(warehouse / "spark"))
    # Plain Python: the greatest offset of each key wins; b's is a delete.
    assert {row[c.TABLE_KEY]: row["firstName"] for row in table} == {
        "a": "a at 9",
        "c": "c at 10",
        "d": "d at 11",
    }


def test_timestamps_keep_their_instant_whatever_the_sessions_zone(spark, warehouse: Path):
    """Spark hands Arrow timestamps labelled with the session's zone, which a user may set;
    the table stores the same instants either way."""
    rows = _rows(spark, [("k0", False, _entity(0, "first"))])
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        DeltaSink(str(warehouse / "zoned")).write(Batch(rows, 0, "app"))
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    (row,) = _table(spark, str(warehouse / "zoned"))
    assert row["seen"] == dt.datetime(2026, 1, 2, 3, 4, 5, 123456)  # read back in UTC
    assert row["address"]["at"] == row["seen"]
    assert row["stamps"][0] == row["seen"]


WIDE = (
    "s STRING, i INT, l BIGINT, sh SMALLINT, b TINYINT, d DOUBLE, f FLOAT, dec DECIMAL(12,3), "
    "ok BOOLEAN, day DATE, ts TIMESTAMP, raw BINARY, `a.b` INT, tags ARRAY<STRING>, "
    "items ARRAY<STRUCT<sku: STRING, qty: INT>>, attrs MAP<STRING, INT>, "
    "addr STRUCT<city: STRING, geo: STRUCT<lat: DOUBLE, lon: DOUBLE>>"
)


def _ddl(spark, path: str) -> tuple:
    """What the table's readers see of its DDL: Spark's schema, the protocol, the
    properties, and who wrote each commit."""
    from deltalake import DeltaTable

    table = DeltaTable(path)
    writers = [commit.get("engineInfo", "") for commit in reversed(table.history())]
    schema = spark.read.format("delta").load(path).schema
    return schema, table.protocol(), table.metadata().configuration, writers


def test_delta_rs_creates_and_widens_the_table_spark_would(spark, warehouse: Path):
    """With the delta_rs engine delta-rs runs the DDL (a cold JVM's seconds at a map's
    start): the table, and the columns a later entity adds, as Spark's DDL makes them."""
    from pyspark.sql import types as T

    entity = T._parse_datatype_string(WIDE)
    strict = T.StructType(
        [
            *entity.fields,
            T.StructField("codes", T.ArrayType(T.LongType(), containsNull=False)),
            T.StructField("sizes", T.MapType(T.StringType(), T.IntegerType(), False)),
        ]
    )
    wider = T.StructType([*strict.fields, *T._parse_datatype_string("n BIGINT, o STRUCT<p: DATE>")])
    ddl, added = {}, {}
    for engine in ("spark", "delta_rs"):
        sink = DeltaSink(str(warehouse / engine), engine=engine, updated_at=True)
        sink.ensure_table(spark, strict)
        sink.ensure_table(spark, wider)
        schema, *rest = _ddl(spark, str(warehouse / engine))
        # Each added column's comment names the commit that added it (the table's second).
        added[engine] = {
            f.name: AddedColumn.of(f.metadata.get(COMMENT)) for f in schema if f.metadata
        }
        plain = T.StructType([T.StructField(f.name, f.dataType, f.nullable) for f in schema])
        ddl[engine] = (plain, *rest)
    assert {n: a.version for n, a in added["spark"].items() if a} == {"n": 1, "o": 1}
    assert {n: a.version for n, a in added["delta_rs"].items() if a} == {"n": 1, "o": 1}
    assert ddl["delta_rs"][:3] == ddl["spark"][:3]
    assert ddl["spark"][0].names == [c.TABLE_KEY, c.TABLE_UPDATED_AT, *wider.names]
    assert ddl["spark"][0][c.TABLE_KEY].nullable is False
    assert ddl["spark"][2] == {"delta.enableDeletionVectors": "false"}
    assert all(w.startswith("delta-rs") for w in ddl["delta_rs"][3]), ddl["delta_rs"][3]
    assert not any(w.startswith("delta-rs") for w in ddl["spark"][3]), ddl["spark"][3]


def test_a_type_delta_rs_would_write_otherwise_leaves_the_ddl_with_spark(spark, warehouse: Path):
    """A TIMESTAMP_NTZ column: delta-rs would list its table feature without the
    ``invariants`` the NOT NULL key needs, and Spark could not read the table."""
    from pyspark.sql import types as T

    path = str(warehouse / "ntz")
    sink = DeltaSink(path, engine="delta_rs")
    sink.ensure_table(spark, T._parse_datatype_string("s STRING, at TIMESTAMP_NTZ"))
    schema, _, _, writers = _ddl(spark, path)
    assert schema[c.TABLE_KEY].nullable is False
    assert isinstance(schema["at"].dataType, T.TimestampNTZType)
    assert not any(w.startswith("delta-rs") for w in writers), writers
    rows = spark.createDataFrame(
        [("k1", False, ("x", dt.datetime(2026, 1, 2, 3, 4, 5)))],
        f"{c.KEY} STRING, {c.DELETED} BOOLEAN, {c.ENTITY} STRUCT<s: STRING, at: TIMESTAMP_NTZ>",
    )
    sink.write(Batch(rows, 0, "app"))
    assert _table(spark, path) == [
        {c.TABLE_KEY: "k1", "s": "x", "at": dt.datetime(2026, 1, 2, 3, 4, 5)}
    ]


def test_rows_collected_for_several_maps_in_one_job_merge_as_each_maps_own(spark, warehouse: Path):
    """The shared Delta query collects every map's changelog rows in one job
    (``entities_collected``); each map's table must be what its own job's rows write: the
    same columns and types, a deleted record's null entity, the change time a TTL keeps,
    and a field of a map without a TTL named like that time's column."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from materializer.delta.query import entities_collected, with_entity
    from materializer.encoding import entity_json

    small = f"id STRING, n BIGINT, {c.TABLE_UPDATED_AT} STRING"
    maps = {  # the changelog: its entity, an entity made of a record's index, a TTL kept
        "cl-wide": (ENTITY, _entity, True),
        "cl-small": (small, lambda i, _: (f"s{i}", i, f"at {i}"), False),
        "cl-other": ("id STRING", lambda i, _: (f"o{i}",), False),  # no column in the collect
    }
    changes = None
    for topic, (schema, make, _) in maps.items():
        records = [  # key, deleted, entity, partition (the key's), offset: 4 changes a key
            (f"k{i % 5}", i % 7 == 5, None if i % 7 == 5 else make(i, f"{topic} {i}"), i % 5 % 2, i)
            for i in range(20)
        ]
        rows = spark.createDataFrame(
            records,
            f"{c.KEY} STRING, {c.DELETED} BOOLEAN, e STRUCT<{schema}>, "
            f"{c.PARTITION} INT, {c.OFFSET} BIGINT",
        )
        rows = rows.select(
            F.lit(topic).alias(c.TOPIC),
            c.KEY,
            c.DELETED,
            entity_json(rows["e"]).alias("value"),
            c.PARTITION,
            c.OFFSET,
            (F.lit(dt.datetime(2026, 1, 1)) + F.make_interval(secs=rows[c.OFFSET])).alias(
                c.TIMESTAMP
            ),
        )
        changes = rows if changes is None else changes.unionByName(rows)
    assert changes is not None
    entities = {t: StructType.fromDDL(schema) for t, (schema, _, _) in maps.items()}
    del entities["cl-other"]
    collected = entities_collected(changes, entities)

    assert {t: rows.num_rows for t, rows in collected.items()} == {t: 20 for t in entities}
    # Plain Python: each key's change at its greatest offset; k4's (19) deletes it, the
    # deletes of k0 and k2 (offsets 5 and 12) lose to their later changes.
    last = {f"k{k}": max(i for i in range(20) if i % 5 == k) for k in range(5)}
    kept = {key: i for key, i in last.items() if i % 7 != 5}
    for topic, entity in entities.items():
        ttl = maps[topic][2]
        rows = with_entity(changes.where(changes[c.TOPIC] == topic), entity, False)
        own, shared = str(warehouse / f"{topic}-own"), str(warehouse / f"{topic}-shared")
        DeltaSink(own, updated_at=ttl).write(Batch(rows, 0, "app"))
        DeltaSink(shared, updated_at=ttl).write(Batch(rows, 0, "app", collected=collected[topic]))
        table = _table(spark, shared)
        assert table == _table(spark, own)
        assert {r[c.TABLE_KEY]: r[c.TABLE_UPDATED_AT] for r in table} == {
            key: dt.datetime(2026, 1, 1) + dt.timedelta(seconds=i) if ttl else f"at {i}"
            for key, i in kept.items()
        }
