"""Maps of Debezium's change events, end to end: a real PostgreSQL captured by Debezium's
own engine with each of its converters, folded with ``source.envelope: debezium``, the
map in Redis and Delta equal to the table's rows (``SELECT`` from PostgreSQL).

The table has the types Debezium encodes (numeric with and without a precision, date,
timestamp, timestamptz, time, jsonb, uuid, bytea) and TOASTed text and bytes, which an
update that leaves them alone cannot send (REPLICA IDENTITY DEFAULT): a ``merge`` map keeps
them. A snapshot of rows already there, then random inserts, updates (some of the primary
key: Debezium's delete, tombstone and create) and deletes.
"""

from __future__ import annotations

import base64
import datetime
import random
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from materializer.contract.redis_layout import meta_key
from materializer.contract.table_layout import table_path
from materializer.contract.watermark import Watermark
from materializer.job import start_map
from materializer.testing.debezium import Converter, DebeziumCapture
from materializer.testing.postgres import Postgres
from materializer.testing.process import ManagedProcess
from materializer.testing.waiting import wait_until
from tests.helpers.runs import config_file, materializer_run
from tests.helpers.slices import config, delta_map_rs, read_topic, redis_map

CONVERTERS: tuple[Converter, ...] = ("json", "json-plain", "avro")
ROW = (
    "id INT, name STRING, price DECIMAL(10,2), amount DECIMAL(38,10), born DATE, "
    "seen TIMESTAMP_NTZ, at TIMESTAMP, t BIGINT, doc STRING, uid STRING, note STRING, "
    "flag BOOLEAN, raw BINARY"
)
TABLE = """
CREATE TABLE {table} (
    id int PRIMARY KEY, name text, price numeric(10,2), amount numeric, born date,
    seen timestamp, at timestamptz, t time, doc jsonb, uid uuid, note text, flag boolean,
    raw bytea
);
"""
# md5 digests do not compress: this much text and bytes is stored out of line (TOAST).
LONG_TEXT = "(SELECT string_agg(md5(i::text || '{seed}'), '') FROM generate_series(1, 300) i)"
LONG_BYTES = f"decode({LONG_TEXT}, 'hex')"
SENTINEL = 1_000_000
PLACEHOLDER = "__debezium_unavailable_value"


def values(rng: random.Random, key: int) -> str:
    """One row's values as SQL, every type in it, nulls now and then; a row whose key is a
    multiple of 3 holds TOASTed text and bytes."""

    def maybe(text: str) -> str:
        return "NULL" if rng.random() < 0.1 else text

    toasted = key % 3 == 0
    seed = rng.randrange(10**6)
    micros = rng.randrange(-(10**15), 2 * 10**15)
    moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=micros)
    day = datetime.date(1970, 1, 1) + datetime.timedelta(days=rng.randrange(-30000, 30000))
    parts = [
        str(key),
        maybe(f"'name {rng.randrange(1000)}'"),
        maybe(str(Decimal(rng.randrange(-(10**9), 10**9)).scaleb(-2))),
        maybe(str(Decimal(rng.randrange(-(10**12), 10**12)).scaleb(-rng.randrange(0, 8)))),
        maybe(f"'{day.isoformat()}'"),
        maybe(f"'{moment.isoformat()}'"),
        maybe(f"'{moment.isoformat()}+0{rng.randrange(10)}:00'"),
        maybe(
            f"'{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(10**6):06d}'"
        ),
        maybe(f"'{orjson.dumps({'k': rng.randrange(100), 'l': [1, 'two']}).decode()}'"),
        maybe(f"'{uuid.UUID(int=rng.getrandbits(128))}'"),
        LONG_TEXT.format(seed=seed) if toasted else maybe(f"'note {seed}'"),
        maybe(rng.choice(["true", "false"])),
        LONG_BYTES.format(seed=seed) if toasted else maybe(f"'\\x{seed:06x}'"),
    ]
    return "(" + ", ".join(parts) + ")"


def changes(rng: random.Random, table: str, rows: set[int], count: int) -> str:
    """``count`` random statements: inserts, updates of a few columns (the TOASTed ones
    left alone), updates of the primary key, deletes."""
    out = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.3 or not rows:
            key = max(rows | {0}) + 1
            rows.add(key)
            out.append(f"INSERT INTO {table} VALUES {values(rng, key)};")
            continue
        key = rng.choice(sorted(rows))
        if roll < 0.75:
            price = Decimal(rng.randrange(10**6)).scaleb(-2)
            name = f"u{rng.randrange(99)}"
            out.append(f"UPDATE {table} SET name = '{name}', price = {price} WHERE id = {key};")
        elif roll < 0.85 and key % 3:
            # Not a row with TOASTed values: Debezium cannot send them with the new key
            # (REPLICA IDENTITY DEFAULT), so no map could hold them (docs/change-data-capture.md).
            new = max(rows) + 1
            rows.discard(key)
            rows.add(new)
            out.append(f"UPDATE {table} SET id = {new} WHERE id = {key};")
        else:
            rows.discard(key)
            out.append(f"DELETE FROM {table} WHERE id = {key};")
    return "\n".join(out)


def table_rows(postgres: Postgres, table: str) -> dict[str, dict[str, Any]]:
    """The table now, each row as canonical values keyed by its id (``canonical``)."""
    text = postgres.execute(
        f"SET TimeZone = 'UTC'; SELECT row_to_json(x) FROM {table} x WHERE id <> {SENTINEL}"
    )
    rows = [orjson.loads(line) for line in text.splitlines() if line.startswith("{")]
    return {str(r["id"]): canonical(r) for r in rows}


def canonical(row: dict[str, Any], without: tuple[str, ...] = ()) -> dict[str, Any]:
    """A row from PostgreSQL, Redis (entity JSON) or Delta (Python values) in one form."""
    out: dict[str, Any] = {}
    for name, value in row.items():
        if value is None or name in without or name.startswith("_"):
            continue
        out[name] = CANONICAL.get(name, lambda v: v)(value)
    return out


def _micros_of_day(value: Any) -> int:
    if isinstance(value, int):
        return value
    clock = datetime.time.fromisoformat(value)
    return ((clock.hour * 60 + clock.minute) * 60 + clock.second) * 10**6 + clock.microsecond


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if value.startswith("\\x"):
        return bytes.fromhex(value[2:])
    return base64.b64decode(value)


def _instant(value: Any) -> datetime.datetime:
    moment = (
        value if isinstance(value, datetime.datetime) else datetime.datetime.fromisoformat(value)
    )
    return moment.astimezone(datetime.UTC)


CANONICAL = {
    "price": lambda v: Decimal(str(v)),
    "amount": lambda v: Decimal(str(v)),
    "born": lambda v: v if isinstance(v, datetime.date) else datetime.date.fromisoformat(v),
    "seen": lambda v: v if isinstance(v, datetime.datetime) else datetime.datetime.fromisoformat(v),
    "at": _instant,
    "t": _micros_of_day,
    "doc": lambda v: orjson.loads(v) if isinstance(v, str) else v,
    "raw": _bytes,
}


@dataclass(frozen=True)
class Captured:
    """One table's history as each converter wrote it, and its rows at the end."""

    table: str
    topics: dict[str, str]
    rows: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def captured(
    postgres: Postgres, kafka_bootstrap: str, schema_registry_url: str
) -> Iterator[dict[str, Captured]]:
    """Two tables' histories captured with each converter: ``changes``, random changes of
    every kind; ``truncated``, rows, a truncate, then rows again."""
    rng = random.Random(50)
    tables = {name: f"cdc_{uuid.uuid4().hex[:8]}" for name in ("changes", "truncated")}
    keys = {name: set(range(1, 41)) for name in tables}
    for name, table in tables.items():
        postgres.execute(TABLE.format(table=table))
        postgres.execute(
            f"INSERT INTO {table} VALUES "
            + ", ".join(values(rng, k) for k in sorted(keys[name]))
            + ";"
        )
    with ExitStack() as stack:
        captures = {}
        for converter in CONVERTERS:
            capture = DebeziumCapture(
                postgres,
                kafka_bootstrap,
                tables=[f"public.{table}" for table in tables.values()],
                converter=converter,
                registry_url=schema_registry_url,
            )
            stack.callback(capture.stop)
            captures[converter] = capture.launch()
        for capture in captures.values():
            capture.wait_streaming()
        postgres.execute(changes(rng, tables["changes"], keys["changes"], 150))
        truncated = tables["truncated"]
        postgres.execute(changes(rng, truncated, keys["truncated"], 30))
        postgres.execute(f"TRUNCATE {truncated};")
        keys["truncated"].clear()
        postgres.execute(changes(rng, truncated, keys["truncated"], 20))
        out = {}
        for name, table in tables.items():
            postgres.execute(f"INSERT INTO {table} (id) VALUES ({SENTINEL});")
            topics = {c: capture.topic(f"public.{table}") for c, capture in captures.items()}
            for topic in topics.values():
                wait_until(
                    f"the last change on {topic}",
                    lambda t=topic: sentinel_on(kafka_bootstrap, t),
                    60,
                )
            out[name] = Captured(table, topics, table_rows(postgres, table))
    yield out
    for table in tables.values():
        postgres.execute(f"DROP TABLE {table}")


def avro_int(n: int) -> bytes:
    """``n`` as Avro writes an int: zigzag, then seven bits a byte."""
    value, out = (n << 1) ^ (n >> 63), bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def sentinel_on(bootstrap: str, topic: str) -> bool:
    """Whether the last change (the sentinel row's create) is the topic's last record: its
    key holds the id as JSON digits or as Avro's int."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"seek-{uuid.uuid4()}"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        if high <= low:
            return False
        consumer.assign([TopicPartition(topic, 0, high - 1)])
        msg = consumer.poll(10.0)
        key = b"" if msg is None or msg.error() is not None else msg.key() or b""
        return str(SENTINEL).encode() in key or key.endswith(avro_int(SENTINEL))
    finally:
        consumer.close()


def map_doc(
    name: str, tmp_path: Path, kafka: str, redis_url: str, topic: str, source: dict, **extra: Any
) -> dict:
    """A config of one map, ``name``: each test's own, in the Redis the tests share."""
    return {
        "kafka": {"bootstrap_servers": kafka},
        "redis": {"url": redis_url},
        "delta": {"root": str(tmp_path / "warehouse")},
        "spark": {"checkpoint_root": str(tmp_path / "checkpoints")},
        "maps": {
            name: {
                "source": {"topics": [topic], "envelope": "debezium", **source},
                "key": "$kafka_key",
                "on_error": "fail",
                **extra,
            }
        },
    }


def source_of(converter: str, registry: str) -> dict[str, Any]:
    """The map's source section for the topic ``converter`` wrote (the envelope aside)."""
    if converter == "avro":
        return {"format": "avro", "schema_registry_url": registry}
    return {"format": "json", "schema": ROW}


def folded(spark, doc: dict, redis_client) -> tuple[dict, dict]:
    """The map of ``doc`` folded from its topic's start to its end: (Redis, Delta)."""
    app = config(doc)
    (name,) = app.maps
    queries = start_map(spark, app, name)
    try:
        queries.process_all_available()
    finally:
        queries.stop()
    redis_rows = {k: canonical(v) for k, v in redis_map(redis_client, name).items()}
    delta_rows = {k: canonical(v) for k, v in delta_map_rs(table_path(app, name)).items()}
    redis_rows.pop(str(SENTINEL), None)
    delta_rows.pop(str(SENTINEL), None)
    return redis_rows, delta_rows


@pytest.mark.parametrize("converter", CONVERTERS)
def test_a_merge_map_equals_the_table(
    spark,
    captured,
    converter,
    kafka_bootstrap,
    redis_url,
    redis_client,
    schema_registry_url,
    tmp_path,
):
    topics, expected = captured["changes"].topics, captured["changes"].rows
    source = source_of(converter, schema_registry_url)
    name = f"merged_{converter.replace('-', '_')}"
    doc = map_doc(
        name,
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topics[converter],
        source,
        fold={"mode": "merge"},
    )
    in_redis, in_delta = folded(spark, doc, redis_client)
    assert in_redis == expected
    assert in_delta == expected


@pytest.mark.parametrize("converter", ["json", "avro"])
def test_a_truncate_deletes_every_entity_before_it(
    spark,
    captured,
    converter,
    kafka_bootstrap,
    redis_url,
    redis_client,
    schema_registry_url,
    tmp_path,
):
    truncated = captured["truncated"]
    source = source_of(converter, schema_registry_url)
    # ``latest``, the TOASTed columns left out (it has no value to keep for them), and
    # batches of a few records: the truncate meets entities Redis holds from batches before
    # and ones its own batch writes before and after it. json orders by the database's time.
    fold: dict[str, Any] = {"mode": "latest"}
    if converter == "json":
        fold["event_time"] = "source.ts_ms"
    doc = map_doc(
        f"truncated_{converter.replace('-', '_')}",
        tmp_path,
        kafka_bootstrap,
        redis_url,
        truncated.topics[converter],
        source,
        fold=fold,
        transforms=[{"type": "drop", "fields": ["note", "raw"]}],
    )
    doc["spark"]["max_offsets_per_trigger"] = 20
    in_redis, in_delta = folded(spark, doc, redis_client)
    expected = {k: canonical(v, without=("note", "raw")) for k, v in truncated.rows.items()}
    assert in_redis == expected
    assert in_delta == expected


@pytest.mark.parametrize("converter", CONVERTERS)
def test_the_capture_sent_what_the_maps_must_take(captured, converter, kafka_bootstrap):
    """What the maps are compared on is there to fold: a snapshot, every op, tombstones
    and Debezium's placeholder for the TOASTed values an update left alone."""
    changes = read_topic(kafka_bootstrap, captured["changes"].topics[converter])
    truncated = read_topic(kafka_bootstrap, captured["truncated"].topics[converter])
    values = [m.value() for m in changes + truncated]
    assert None in values  # a delete's tombstone
    assert any(PLACEHOLDER.encode() in v for v in values if v is not None)
    if converter == "avro":
        return
    ops = {orjson.loads(v).get("payload", orjson.loads(v))["op"] for v in values if v is not None}
    assert ops == {"r", "c", "u", "d", "t"}


def test_the_real_time_path_through_materializer_run(
    postgres, kafka_bootstrap, redis_url, redis_client, tmp_path
):
    """A ``merge`` map of a table folded by ``materializer run`` on the real-time path once
    caught up: changes with TOASTed values, then a truncate and changes after it, which the
    real-time writer applies in one Redis call; the map equals the table at the end."""
    rng = random.Random(52)
    table, keys = new_table(postgres, rng)
    name = "live_rows"
    capture = DebeziumCapture(postgres, kafka_bootstrap, tables=[f"public.{table}"])
    try:
        capture.launch().wait_streaming()
        topic = capture.topic(f"public.{table}")
        source = {"format": "json", "schema": ROW}
        doc = map_doc(
            name, tmp_path, kafka_bootstrap, redis_url, topic, source, fold={"mode": "merge"}
        )
        doc["spark"]["path"] = "realtime"
        doc["maps"][name]["on_error"] = "dead_letter"  # the real-time path sends them on
        doc["metrics"] = {"port": 0}
        path = config_file(doc, tmp_path)
        with materializer_run(path) as run:
            wait_until(
                "the map on the real-time path",
                lambda: (
                    "real-time query live-" in run.log()
                    and "folds on the real-time path" in run.log()
                ),
                300,
                run.alive,
            )
            postgres.execute(changes(rng, table, keys, 40))
            postgres.execute(f"TRUNCATE {table};")
            keys.clear()
            postgres.execute(changes(rng, table, keys, 20))
            postgres.execute(f"INSERT INTO {table} (id) VALUES ({SENTINEL});")
            in_redis = every_change_folded(kafka_bootstrap, redis_client, name, topic, run)
            expected = table_rows(postgres, table)
            assert in_redis == expected
            # The table follows from the changelog the real-time writer sent.
            warehouse = tmp_path / "warehouse" / name
            wait_until(
                "the table holding the same rows",
                lambda: table_without_sentinel(warehouse) == expected,
                120,
                run.alive,
                retry_errors=True,
            )
    finally:
        capture.stop()
    postgres.execute(f"DROP TABLE {table}")


def new_table(postgres: Postgres, rng: random.Random) -> tuple[str, set[int]]:
    """A table of its own with rows 1 to 20: its name and keys."""
    table, keys = f"cdc_{uuid.uuid4().hex[:8]}", set(range(1, 21))
    postgres.execute(TABLE.format(table=table))
    postgres.execute(f"INSERT INTO {table} VALUES {', '.join(values(rng, k) for k in keys)};")
    return table, keys


def every_change_folded(
    kafka: str, client: Any, name: str, topic: str, run: ManagedProcess
) -> dict[str, dict[str, Any]]:
    """Once the sentinel row's create is on the topic and the run's fold is past it: the
    map in Redis, without the sentinel."""
    wait_until("the last change on the topic", lambda: sentinel_on(kafka, topic), 60)
    end = end_offset(kafka, topic)
    wait_until("every change folded", lambda: folded_past(client, name, topic, end), 120, run.alive)
    rows = {k: canonical(v) for k, v in redis_map(client, name).items()}
    rows.pop(str(SENTINEL), None)
    return rows


def table_without_sentinel(path: Path) -> dict[str, dict[str, Any]]:
    rows = {k: canonical(v) for k, v in delta_map_rs(path).items()}
    rows.pop(str(SENTINEL), None)
    return rows


def end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"end-{uuid.uuid4()}"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def folded_past(client, name: str, topic: str, end: int) -> bool:
    watermark = Watermark.from_hash(client.hgetall(meta_key(name)))
    return watermark is not None and watermark.offsets.get(topic, {}).get(0, 0) >= end


def test_a_column_added_to_the_table_reaches_the_running_map(
    postgres, kafka_bootstrap, redis_url, redis_client, schema_registry_url, tmp_path
):
    """``ALTER TABLE ... ADD COLUMN`` under ``materializer run``: Debezium's Avro converter
    registers the wider envelope with the first change after it, the map takes that version
    without a restart of the run or a rebuild, and its entities and table end equal to the
    table, the new column in the rows that have it."""
    rng = random.Random(53)
    table, keys = new_table(postgres, rng)
    name = "added_column"
    capture = DebeziumCapture(
        postgres,
        kafka_bootstrap,
        tables=[f"public.{table}"],
        converter="avro",
        registry_url=schema_registry_url,
    )
    try:
        capture.launch().wait_streaming()
        topic = capture.topic(f"public.{table}")
        source = source_of("avro", schema_registry_url)
        doc = map_doc(
            name, tmp_path, kafka_bootstrap, redis_url, topic, source, fold={"mode": "merge"}
        )
        doc["spark"]["path"] = "microbatch"
        doc["metrics"] = {"port": 0}
        with materializer_run(config_file(doc, tmp_path)) as run:
            snapshot = table_rows(postgres, table)
            wait_until(
                "the snapshot folded and the map past its opening",
                lambda: (
                    f"map {name} running" in run.log()
                    and {k: canonical(v) for k, v in redis_map(redis_client, name).items()}
                    == snapshot
                ),
                180,
                run.alive,
            )
            postgres.execute(
                f"ALTER TABLE {table} ADD COLUMN extra text;\n"
                + changes(rng, table, keys, 20)
                + f"\nUPDATE {table} SET extra = 'extra ' || id WHERE id % 2 = 0;\n"
                + f"INSERT INTO {table} (id, extra) VALUES ({max(keys) + 1}, 'a new row');\n"
                + f"INSERT INTO {table} (id) VALUES ({SENTINEL});"
            )
            in_redis = every_change_folded(kafka_bootstrap, redis_client, name, topic, run)
            expected = table_rows(postgres, table)
            assert any("extra" in row for row in expected.values())
            assert any("extra" not in row for row in expected.values())
            assert in_redis == expected
            wait_until(
                "the table holding the same rows",
                lambda: table_without_sentinel(tmp_path / "warehouse" / name) == expected,
                120,
                run.alive,
                retry_errors=True,
            )
            log = run.log()
    finally:
        capture.stop()
    postgres.execute(f"DROP TABLE {table}")
    assert f"map {name}: subject {topic}-value moved from schema id" in log
    assert "which adds extra" in log
    assert f"map {name} failed" not in log
