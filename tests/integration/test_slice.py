"""The foundation slice end to end: Kafka -> Spark fold -> Delta + Redis, on real services."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import orjson
from confluent_kafka import Consumer

from materializer.config.names import changelog_topic, dead_letter_topic
from materializer.contract.redis_layout import changes_key
from materializer.contract.table_layout import history_path, table_path
from materializer.job import start_map
from materializer.testing import produce
from materializer.testing.reference import fold_latest
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.server import create_server
from query_service.stores.redis import RedisMapStore
from tests.helpers.slices import (
    FIELDS,
    config,
    delta_map_rs,
    delta_map_spark,
    end_offsets,
    read_topic,
    redis_map,
    slice_config,
    user_events,
    watermark,
)


def test_slice_matches_reference_in_redis_and_delta(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(3)
    cfg = config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name="slice"))
    records = user_events(600, 40, seed=1)
    positions = produce(kafka_bootstrap, topic, records)

    queries = start_map(spark, cfg, "slice")
    try:
        queries.process_all_available()
        # A second wave, with tombstones for keys that exist, lands in a later batch.
        more = user_events(300, 40, seed=2) + [(b"u1", None), (b"u2", None)]
        positions += produce(kafka_bootstrap, topic, more)
        records += more
        queries.process_all_available()
    finally:
        queries.stop()

    events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
    reference = fold_latest(events, "id", FIELDS)
    assert "u1" not in reference and "u2" not in reference
    table = Path(table_path(cfg, "slice"))
    assert redis_map(redis_client, "slice") == reference
    assert delta_map_spark(spark, table) == reference
    assert delta_map_rs(table) == reference

    mark = watermark(redis_client, "slice")
    assert mark is not None
    assert mark.offsets == {topic: end_offsets(positions)}
    assert mark.updated_at_ms > 0

    # The change stream holds one entry per key per batch; its last state per key matches.
    entries = [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in redis_client.xrange(changes_key("slice"))
    ]
    last_op = {e["key"]: e["op"] for e in entries}
    assert {k for k, op in last_op.items() if op == "upsert"} == set(reference)
    assert int(entries[-1]["batch_id"]) == mark.batch_id

    # The changelog topic holds every batch's changes: its last record per key is the map.
    last: dict[str, Any] = {}
    for msg in read_topic(kafka_bootstrap, changelog_topic(cfg, "slice")):
        last[msg.key().decode()] = None if msg.value() is None else orjson.loads(msg.value())
        assert dict(msg.headers())["x-batch-id"].isdigit()
    assert {k: v for k, v in last.items() if v is not None} == reference
    assert last["u1"] is None and last["u2"] is None

    # The query service serves what the pipeline wrote, through a real channel.
    some_key = sorted(reference)[0]
    found, deleted, unknown = asyncio.run(
        _lookups(cfg, [("slice", some_key), ("slice", "u1"), ("nope", "x")])
    )
    assert found.found and orjson.loads(found.entity) == reference[some_key]
    assert found.watermark.batch_id == mark.batch_id
    assert {(o.topic, o.partition): o.offset for o in found.watermark.offsets} == {
        (topic, p): o for p, o in end_offsets(positions).items()
    }
    assert not deleted.found
    assert unknown == grpc.StatusCode.NOT_FOUND


async def _lookups(cfg, requests):
    store = RedisMapStore.from_url(cfg.redis.url)
    server, port = await create_server(cfg, store=store)
    await server.start()
    results = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.MapServiceStub(channel)
            for map_name, key in requests:
                try:
                    results.append(await stub.Get(pb.GetRequest(map=map_name, key=key), timeout=10))
                except grpc.aio.AioRpcError as exc:
                    results.append(exc.code())
    finally:
        await server.stop(None)
        await store.close()
    return results


def test_poison_records_go_to_dead_letter_topic_and_stream_goes_on(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(1)
    dlq = f"{topic}.dlq"
    doc = slice_config(
        tmp_path, kafka_bootstrap, redis_url, topic, map_name="poison", dead_letter={"topic": dlq}
    )
    cfg = config(doc)
    assert dead_letter_topic(cfg, "poison") == dlq
    records: list[tuple[bytes | None, bytes | None]] = [
        (b"a", b'{"id": "a", "name": "Ann"}'),
        (b"bad-json", b"{not json"),
        (b"wrong-type", b'{"id": "w", "age": "old"}'),
        (b"no-key", b'{"name": "nobody"}'),
        (None, None),  # a tombstone with no key: nothing to delete
        (b"b", b'{"id": "b", "name": "Bob"}'),
        (b"meta", b'{"id": "__meta__"}'),  # would overwrite the map's watermark
    ]
    positions = produce(kafka_bootstrap, topic, records)
    queries = start_map(spark, cfg, "poison")
    try:
        queries.process_all_available()
    finally:
        queries.stop()

    assert redis_map(redis_client, "poison") == {
        "a": {"id": "a", "name": "Ann"},
        "b": {"id": "b", "name": "Bob"},
    }
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"check-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([dlq])
    letters = []
    try:
        for _ in range(120):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                letters.append(msg)
            if len(letters) == 5:
                break
    finally:
        consumer.close()
    assert len(letters) == 5
    by_offset = {}
    for msg in letters:
        headers = {k: v.decode() for k, v in msg.headers()}
        by_offset[int(headers["x-source-offset"])] = (msg.key(), msg.value(), headers)
    expected = {1: "decode", 2: "decode", 3: "key", 4: "key", 6: "key"}
    assert sorted(by_offset) == sorted(expected)
    for offset, stage in expected.items():
        key, value, headers = by_offset[offset]
        assert (key, value) == records[offset]
        assert headers["x-error-stage"] == stage
        assert headers["x-source-topic"] == topic
        assert headers["x-source-partition"] == str(positions[offset][0])
        assert headers["x-error-message"]
    mark = watermark(redis_client, "poison")
    assert mark is not None and mark.offsets == {topic: {0: len(records)}}


def test_skip_policy_and_event_history(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    from confluent_kafka.admin import AdminClient
    from deltalake import DeltaTable

    topic = new_topic(2)
    cfg = config(
        slice_config(
            tmp_path,
            kafka_bootstrap,
            redis_url,
            topic,
            map_name="hist",
            on_error="skip",
            history=True,
        )
    )
    records = user_events(120, 10, seed=3) + [(b"bad", b"[1, 2"), (b"nokey", b"{}")]
    positions = produce(kafka_bootstrap, topic, records)
    queries = start_map(spark, cfg, "hist")
    try:
        queries.process_all_available()
        names = [q.name for q in queries.queries]
        # The history and dead letters come from the fold's own read of the source: no
        # query of their own (and with on_error: skip, no dead letters at all).
        assert names == ["hist.fold", "hist.delta"]
    finally:
        queries.stop()

    events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
    assert redis_map(redis_client, "hist") == fold_latest(events, "id", FIELDS)
    history = DeltaTable(history_path(cfg, "hist")).to_pyarrow_table().to_pylist()
    good = {
        (p, o)
        for (p, o), (_, v) in zip(positions, records, strict=True)
        if v is None or (v.startswith(b"{") and b'"id"' in v)
    }
    assert {(r["_partition"], r["_offset"]) for r in history} == good
    assert len(history) == len(good)
    tombstones = [r for r in history if r["_deleted"]]
    assert tombstones and all(r["id"] is None for r in tombstones)
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert dead_letter_topic(cfg, "hist") not in topics
