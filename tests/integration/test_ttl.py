"""TTL per map on real services: Redis keys expire after ``ttl.redis`` without a write, and the
Delta table's cleanup deletes rows not updated for ``ttl.delta``, then VACUUMs."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from materializer.config.names import changelog_topic
from materializer.contract.changelog import EXPIRED_HEADER
from materializer.contract.redis_layout import (
    EXPIRE_OP,
    changes_key,
    entity_key,
    expiry_index_key,
    meta_key,
)
from materializer.contract.table_layout import table_path
from materializer.job import start_map
from materializer.ops.replay import replay_digests
from materializer.ops.verify import verify
from materializer.restore.rehydrate import rehydrate
from materializer.runtime.topics import ensure_changelog_topic
from materializer.testing import produce
from materializer.testing.reference import fold_latest
from materializer.testing.waiting import wait_until
from materializer.v1 import map_service_pb2 as pb
from query_service.services.table_reads import TableReads
from query_service.stores.delta import DeltaTables
from query_service.tables.time_travel import entity_as_of
from tests.helpers.slices import (
    FIELDS,
    config,
    delta_map_rs,
    read_topic,
    redis_map,
    slice_config,
    watermark,
)

REDIS_TTL_MS = 6_000
MINUTE_MS = 60_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def upserts(keys: list[str], wave: int) -> list[tuple[bytes | None, bytes | None]]:
    return [
        (k.encode(), orjson.dumps({"id": k, "name": f"{k}-wave{wave}", "age": wave})) for k in keys
    ]


def _snapshot(client: Any, name: str, keys: list[str]) -> dict[str, tuple[bytes | None, int]]:
    """Each key's value and PTTL, read atomically: a key seen with a value has its PTTL then."""
    pipe = client.pipeline(transaction=True)
    for key in keys:
        pipe.get(entity_key(name, key))
        pipe.pttl(entity_key(name, key))
    replies = pipe.execute()
    return {k: (replies[2 * i], replies[2 * i + 1]) for i, k in enumerate(keys)}


def _expired(client: Any, name: str) -> list[str]:
    return [
        f[b"key"].decode()
        for _, f in client.xrange(changes_key(name))
        if f[b"op"] == EXPIRE_OP.encode() and f[b"batch_id"] == b"-1"
    ]


def _tombstones(bootstrap: str, topic: str) -> list[str]:
    return [
        m.key().decode()
        for m in read_topic(bootstrap, topic)
        if m.value() is None and (EXPIRED_HEADER, b"1") in (m.headers() or [])
    ]


def _records(bootstrap: str, topic: str, key: str) -> list[bytes | None]:
    """The changelog's values for ``key``, in order (a key lives in one partition)."""
    return [m.value() for m in read_topic(bootstrap, topic) if m.key() == key.encode()]


def test_redis_keys_expire_unless_written_again_and_the_expiries_reach_changes_and_delta(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    name = f"ttlr{uuid.uuid4().hex[:8]}"
    ttl = {"redis": "6 seconds"}
    cfg = config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name, ttl=ttl))
    keys = [f"u{i}" for i in range(8)]
    events = upserts(keys, 1)
    positions = produce(kafka_bootstrap, topic, events)
    reference = fold_latest(
        [(p, o, k, v) for (p, o), (k, v) in zip(positions, events, strict=True)], "id", FIELDS
    )
    queries = start_map(spark, cfg, name, side_outputs=False)  # no dead letters or history: cheaper
    try:
        # Polled rather than after the whole batch: the keys live only seconds.
        seen: dict[str, tuple[bytes | None, int]] = {}

        def written(expected: dict[str, str], *others: str) -> bool:
            seen.clear()
            seen.update(_snapshot(redis_client, name, [*expected, *others]))
            return all(
                seen[k][0] is not None and orjson.loads(seen[k][0])["name"] == n
                for k, n in expected.items()
            )

        wait_until("the keys in Redis", lambda: written({k: f"{k}-wave1" for k in keys}))
        assert {k: orjson.loads(v) for k, (v, _) in seen.items() if v} == reference
        assert all(0 < ttl <= REDIS_TTL_MS for _, ttl in seen.values()), seen

        # A key written again gets a fresh expiry: later than a key written with it at first.
        produce(kafka_bootstrap, topic, upserts(["u0"], 2))
        wait_until("the update in Redis", lambda: written({"u0": "u0-wave2"}, "u1"))
        rewritten, untouched = seen["u0"][1], seen["u1"][1]
        assert 0 < rewritten <= REDIS_TTL_MS
        assert rewritten > untouched  # untouched: less time left, or gone already (-2)

        # Each expiry is a change: once in the change stream, a tombstone in the changelog,
        # and the table drops the row (it has no ttl.delta of its own).
        wait_until(
            "every key's expiry in the change stream",
            lambda: sorted(_expired(redis_client, name)) == sorted(keys),
            timeout=60,
        )
        assert not any(redis_client.exists(entity_key(name, k)) for k in keys)
        changelog = changelog_topic(cfg, name)
        wait_until(
            "every key's tombstone in the changelog",
            lambda: sorted(_tombstones(kafka_bootstrap, changelog)) == sorted(keys),
        )
        queries.process_all_available()
        assert delta_map_rs(Path(table_path(cfg, name))) == {}
        assert verify(cfg, name, redis_client).identical
        # A replay from Kafka folds the expired keys again; verify leaves them out of it.
        report = verify(
            cfg,
            name,
            redis_client,
            replay=lambda until: replay_digests(spark, cfg, name, until, redis_client),
        )
        assert report.replayed is not None and report.replayed.identical

        # Written again after its expiry, a key is back, after its tombstone in the changelog.
        produce(kafka_bootstrap, topic, upserts(["u3"], 3))
        wait_until("u3 in Redis again", lambda: written({"u3": "u3-wave3"}))
        wait_until(
            "u3 in the changelog again",
            lambda: len(_records(kafka_bootstrap, changelog, "u3")) >= 3,
        )
        history = _records(kafka_bootstrap, changelog, "u3")
        assert [None if v is None else orjson.loads(v)["name"] for v in history[:3]] == [
            "u3-wave1",
            None,
            "u3-wave3",
        ]
    finally:
        queries.stop()

    mark = watermark(redis_client, name)
    assert mark is not None and mark.offsets
    assert redis_client.pttl(meta_key(name)) == -1


def _table_rows(path: str) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return DeltaTable(path).to_pyarrow_table().to_pylist()


def _entity_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        r["_key"]: {
            k: v for k, v in r.items() if v is not None and k not in ("_key", "_updated_at")
        }
        for r in rows
    }


def _ms(stamp: datetime) -> int:
    return (stamp - EPOCH) // timedelta(milliseconds=1)


def _produce_at(bootstrap: str, topic: str, records: list[Any], timestamp_ms: int) -> None:
    """Records with the Kafka timestamp ``timestamp_ms``: changes written that long ago."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, value, key, timestamp=timestamp_ms)
        producer.poll(0)
    assert producer.flush(30) == 0


def test_delta_cleanup_deletes_rows_not_updated_and_vacuums(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(1)
    name = f"ttld{uuid.uuid4().hex[:8]}"
    ttl = {
        "delta": "30 minutes",
        "cleanup_interval": "1 hour",
        "vacuum_retention": 0,
        "redis": "20 minutes",
    }
    cfg = config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name, ttl=ttl))
    path = table_path(cfg, name)
    keys = [f"k{i}" for i in range(10)]
    recent = ["k1", "k4", "k7"]
    # The Delta query's input, its map's changelog, written here with timestamps of our own, so
    # nothing waits half an hour: every key changed an hour ago, some of them again since.
    changelog = changelog_topic(cfg, name)
    ensure_changelog_topic(cfg, name, changelog)
    now_ms = int(time.time() * 1000)
    _produce_at(kafka_bootstrap, changelog, upserts(keys, 1), now_ms - 60 * MINUTE_MS)
    _produce_at(kafka_bootstrap, changelog, upserts(["k1", "k4"], 2), now_ms - 10 * MINUTE_MS)
    _produce_at(kafka_bootstrap, changelog, upserts(["k7"], 2), now_ms - 25 * MINUTE_MS)
    reference = {k.decode(): orjson.loads(v) for k, v in upserts(recent, 2) if k and v}
    # The first Delta batch after the start takes in all of it, then runs the cleanup; the long
    # interval keeps it from running again.
    queries = start_map(spark, cfg, name, side_outputs=False)  # no dead letters or history: cheaper
    try:
        queries.process_all_available()
    finally:
        queries.stop()
    rows = _table_rows(path)
    assert _entity_table(rows) == reference
    # _updated_at is the Kafka timestamp of each key's last changelog record.
    stamps = {m.key().decode(): m.timestamp()[1] for m in read_topic(kafka_bootstrap, changelog)}
    assert {r["_key"]: _ms(r["_updated_at"]) for r in rows} == {k: stamps[k] for k in recent}

    from deltalake import DeltaTable

    table = DeltaTable(path)
    history = table.history()  # newest first
    assert [h["operation"] for h in history[:4]] == [
        "VACUUM END",
        "VACUUM START",
        "DELETE",
        "MERGE",
    ]
    assert int(history[2]["operationMetrics"]["numDeletedRows"]) == len(keys) - len(recent)
    # VACUUM with retention 0 left exactly the files the latest version reads.
    on_disk = {
        str(p.relative_to(path))
        for p in Path(path).rglob("*.parquet")
        if "_delta_log" not in p.parts
    }
    referenced = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    assert on_disk == set(referenced)

    # Readers leave _updated_at out of entities: Query, GetAsOf, rehydrate and verify.
    cfg_tables = DeltaTables(cfg)
    as_of = entity_as_of(cfg_tables, name, "k1", version=table.version(), at_ns=None)
    assert as_of.entity is not None and orjson.loads(as_of.entity) == reference["k1"]
    queried = asyncio.run(_query(cfg, name))
    assert {k: orjson.loads(v) for k, v in queried.items()} == reference

    # Rehydrate (the fold wrote nothing to Redis) gives each key what remains of its 20 minutes
    # since its _updated_at; k7, changed 25 minutes ago, stays in the table but not in Redis.
    started_ms = int(time.time() * 1000)
    report = rehydrate(cfg, name, redis_client)
    assert (report.written, report.expired) == (2, 1)
    assert redis_map(redis_client, name) == {k: reference[k] for k in ("k1", "k4")}
    for row in rows:
        if row["_key"] != "k7":
            left = redis_client.pttl(entity_key(name, row["_key"]))
            assert 0 < left <= 20 * MINUTE_MS - (started_ms - _ms(row["_updated_at"]))
    assert verify(cfg, name, redis_client).identical
    # Rehydrated keys expire like folded ones: each is in the expiry index.
    index = expiry_index_key(name)
    assert {m.decode() for m in redis_client.zrange(index, 0, -1)} == {"k1", "k4"}


async def _query(cfg: Any, name: str) -> dict[str, bytes]:
    rows: dict[str, bytes] = {}
    async for page in TableReads(cfg).query(pb.QueryRequest(map=name), None):  # type: ignore[arg-type]
        rows.update((r.key, r.entity) for r in page.rows)
    return rows
