"""MapService.BatchGet, and read-your-writes of Get and BatchGet, on a real redis-server.

The pipeline tests fold a real topic with the materializer and compare what
the query service answers with the plain-Python reference fold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import orjson
import pytest
import redis

from materializer.config import AppConfig
from materializer.contract.redis_layout import entity_key, meta_key
from materializer.contract.watermark import Watermark
from materializer.job import start_map
from materializer.testing import closed_port, produce
from materializer.testing.reference import fold_latest
from materializer.v1 import common_pb2 as common
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from tests.helpers.query_redis import DEADLINE, fresh_map, make_config, run, serving
from tests.helpers.slices import FIELDS, config, end_offsets, slice_config, user_events

ANN = b'{"id":"a","name":"Ann"}'
BOB = b'{"id":"b","name":"Bob"}'


@pytest.fixture()
def map_name(redis_client: redis.Redis) -> Iterator[str]:
    yield from fresh_map(redis_client)


def batch_get(
    cfg: AppConfig, map_name: str, keys: list[str], freshness: common.Freshness | None = None
) -> pb.BatchGetResponse:
    async def body(channel: grpc.aio.Channel) -> pb.BatchGetResponse:
        request = pb.BatchGetRequest(map=map_name, keys=keys, freshness=freshness)
        return await pb_grpc.MapServiceStub(channel).BatchGet(request, timeout=DEADLINE)

    return run(cfg, body)


def batch_get_error(cfg: AppConfig, map_name: str, keys: list[str]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        batch_get(cfg, map_name, keys)
    return info.value


def entries(response: pb.BatchGetResponse) -> list[tuple[str, bool, bytes]]:
    return [(e.key, e.found, e.entity) for e in response.entries]


def test_batch_get_answers_every_key_in_request_order(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    redis_client.set(entity_key(map_name, "a"), ANN)
    redis_client.set(entity_key(map_name, "b"), BOB)
    redis_client.hset(
        meta_key(map_name),
        mapping=Watermark(
            batch_id=4, offsets={"t": {1: 7, 0: 9}}, updated_at_ms=1_700_000_000_000
        ).to_hash(),
    )

    response = batch_get(make_config(redis_url, map_name), map_name, ["b", "nobody", "a", "b"])

    # Missing keys are reported per key; duplicates are answered each time.
    assert entries(response) == [
        ("b", True, BOB),
        ("nobody", False, b""),
        ("a", True, ANN),
        ("b", True, BOB),
    ]
    assert response.watermark.batch_id == 4
    assert [(o.topic, o.partition, o.offset) for o in response.watermark.offsets] == [
        ("t", 0, 9),
        ("t", 1, 7),
    ]
    assert response.watermark.updated_at.ToMilliseconds() == 1_700_000_000_000


def test_batch_get_without_keys_still_carries_the_watermark(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    redis_client.hset(meta_key(map_name), mapping=Watermark(batch_id=2).to_hash())

    response = batch_get(make_config(redis_url, map_name), map_name, [])

    assert list(response.entries) == []
    assert response.HasField("watermark")
    assert response.watermark.batch_id == 2


def test_batch_get_before_any_batch_has_no_watermark(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    redis_client.set(entity_key(map_name, "a"), ANN)

    response = batch_get(make_config(redis_url, map_name), map_name, ["a"])

    assert entries(response) == [("a", True, ANN)]
    assert not response.HasField("watermark")


def test_a_hundred_thousand_keys_is_resource_exhausted(redis_url: str, map_name: str) -> None:
    keys = [f"k{i}" for i in range(100_000)]

    error = batch_get_error(make_config(redis_url, map_name), map_name, keys)

    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "100000 keys" in error.details()
    assert "10000" in error.details()


def test_the_key_limit_comes_from_the_configuration(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    redis_client.set(entity_key(map_name, "a"), ANN)
    cfg = make_config(redis_url, map_name, max_batch_keys=3)

    assert [e.found for e in batch_get(cfg, map_name, ["a", "a", "x"]).entries] == [
        True,
        True,
        False,
    ]
    error = batch_get_error(cfg, map_name, ["a", "a", "x", "y"])
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "query.max_batch_keys" in error.details()


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (["a", ""], "keys[1]: must not be empty"),
        (["a", "b", "k" * 4097], "keys[2]: 4097 bytes"),
        (["__meta__"], "keys[0]: '__meta__' is reserved"),
        (["a", "__changes__"], "keys[1]: '__changes__' is reserved"),
    ],
    ids=["empty", "too-long", "reserved-meta", "reserved-changes"],
)
def test_bad_key_is_invalid_argument_naming_its_index(
    redis_url: str, map_name: str, keys: list[str], message: str
) -> None:
    error = batch_get_error(make_config(redis_url, map_name), map_name, keys)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in error.details()


def test_unknown_map_is_not_found(redis_url: str, map_name: str) -> None:
    error = batch_get_error(make_config(redis_url, map_name), "no-such-map", ["a"])

    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "no-such-map" in error.details()


def test_redis_down_is_unavailable(map_name: str) -> None:
    with closed_port() as port:
        config = make_config(f"redis://127.0.0.1:{port}/0", map_name)
        error = batch_get_error(config, map_name, ["a"])

    assert error.code() == grpc.StatusCode.UNAVAILABLE


def freshness(topic: str, partition: int, offset: int) -> common.Freshness:
    return common.Freshness(
        min_offsets=[common.PartitionOffset(topic=topic, partition=partition, offset=offset)]
    )


def both_lookups(
    cfg: AppConfig, map_name: str, key: str, wanted: common.Freshness, timeout: float
) -> list[grpc.StatusCode]:
    """The status of a Get and of a BatchGet of ``key`` with ``wanted``."""

    async def body(channel: grpc.aio.Channel) -> list[grpc.StatusCode]:
        stub = pb_grpc.MapServiceStub(channel)
        calls = [
            stub.Get(pb.GetRequest(map=map_name, key=key, freshness=wanted), timeout=timeout),
            stub.BatchGet(
                pb.BatchGetRequest(map=map_name, keys=[key], freshness=wanted), timeout=timeout
            ),
        ]
        codes = []
        for call in calls:
            try:
                await call
                codes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as exc:
                codes.append(exc.code())
        return codes

    return run(cfg, body)


def test_offsets_never_reached_are_deadline_exceeded(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    redis_client.set(entity_key(map_name, "a"), ANN)
    redis_client.hset(
        meta_key(map_name),
        mapping=Watermark(batch_id=1, offsets={f"{map_name}-events": {0: 5}}).to_hash(),
    )
    cfg = make_config(redis_url, map_name)

    reached = both_lookups(cfg, map_name, "a", freshness(f"{map_name}-events", 0, 5), DEADLINE)
    never = both_lookups(cfg, map_name, "a", freshness(f"{map_name}-events", 0, 6), 1.0)

    assert reached == [grpc.StatusCode.OK] * 2
    assert never == [grpc.StatusCode.DEADLINE_EXCEEDED] * 2


def test_offsets_of_a_topic_the_map_does_not_read_are_invalid(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    redis_client.hset(meta_key(map_name), mapping=Watermark(batch_id=1).to_hash())

    codes = both_lookups(
        make_config(redis_url, map_name), map_name, "a", freshness("other-topic", 0, 1), DEADLINE
    )

    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 2


# --- against the real pipeline -----------------------------------------------------------


def test_batch_get_serves_what_the_pipeline_folded_and_reads_your_writes(
    spark, kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    map_name = f"bg-{topic}"
    cfg = config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=map_name))
    records = user_events(400, 30, seed=7)
    positions = produce(kafka_bootstrap, topic, records)
    events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
    reference = fold_latest(events, "id", FIELDS)
    deleted = sorted({f"u{i}" for i in range(30)} - set(reference))
    assert reference and deleted  # the data exercises both outcomes

    queries = start_map(spark, cfg, map_name)
    try:
        queries.process_all_available()
        keys = [*sorted(reference), *deleted, "never-written", sorted(reference)[0]]
        folded = batch_get(cfg, map_name, keys)

        async def read_your_write() -> tuple[pb.GetResponse, pb.BatchGetResponse, int, int]:
            async with serving(cfg) as channel:
                stub = pb_grpc.MapServiceStub(channel)
                doc = {"id": "u1", "name": "just-written", "age": 1}
                [(partition, offset)] = await asyncio.to_thread(
                    produce, kafka_bootstrap, topic, [(b"u1", orjson.dumps(doc))]
                )
                wanted = freshness(topic, partition, offset + 1)
                got = await stub.Get(
                    pb.GetRequest(map=map_name, key="u1", freshness=wanted), timeout=120
                )
                many = await stub.BatchGet(
                    pb.BatchGetRequest(map=map_name, keys=["u1", "u2"], freshness=wanted),
                    timeout=120,
                )
                return got, many, partition, offset

        got, many, partition, offset = asyncio.run(read_your_write())
    finally:
        queries.stop()

    answered = {e.key: orjson.loads(e.entity) for e in folded.entries if e.found}
    assert answered == reference
    assert [e.key for e in folded.entries] == keys
    assert [e.found for e in folded.entries] == [k in reference for k in keys]
    assert {
        o.partition: o.offset for o in folded.watermark.offsets if o.topic == topic
    } == end_offsets(positions)

    # Read-your-writes: both answers reflect the event produced just before them.
    just_written = {"id": "u1", "name": "just-written", "age": 1}
    assert got.found and orjson.loads(got.entity) == just_written
    assert [(e.key, e.found) for e in many.entries] == [("u1", True), ("u2", "u2" in reference)]
    assert orjson.loads(many.entries[0].entity) == just_written
    for response in (got, many):
        marks = {(o.topic, o.partition): o.offset for o in response.watermark.offsets}
        assert marks[(topic, partition)] > offset
