"""MapService.Watch on a real redis-server, over changes the materializer's Redis sink wrote."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import orjson
import pytest
import redis

from materializer.config import AppConfig, KafkaConfig, RedisConfig
from materializer.contract.markers import mark_whole
from materializer.contract.redis_layout import changes_key, entity_key
from materializer.job import start_map
from materializer.redis.deliveries import new_producer, producer_settings
from materializer.redis.expiry import sweep_expired
from materializer.redis.functions import FoldTarget, load_library
from materializer.testing import produce
from materializer.testing.reference import fold_latest
from materializer.testing.waiting import eventually, wait_until
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from tests.helpers.query_redis import DEADLINE, fresh_map, make_config, serving, write_batch
from tests.helpers.redis_fold import apply
from tests.helpers.slices import FIELDS, config, slice_config

UPSERT, DELETE = pb.Change.UPSERT, pb.Change.DELETE


@pytest.fixture()
def map_name(redis_client: redis.Redis) -> Iterator[str]:
    yield from fresh_map(redis_client)


def entity(key: str, name: str) -> bytes:
    return orjson.dumps({"id": key, "name": name})


def stream_ids(client: redis.Redis, map_name: str) -> list[str]:
    return [entry_id.decode() for entry_id, _ in client.xrange(changes_key(map_name))]


async def collect(call: grpc.aio.UnaryStreamCall, count: int) -> list[pb.Change]:
    """The first ``count`` changes of a watch (bounded by the call's deadline)."""
    changes: list[pb.Change] = []
    async for response in call:
        assert response.changes  # no empty messages
        changes.extend(response.changes)
        if len(changes) >= count:
            break
    return changes


def watch(cfg: AppConfig, map_name: str, count: int, **request: object) -> list[pb.Change]:
    """The first ``count`` changes of ``Watch(map_name, **request)``."""

    async def main() -> list[pb.Change]:
        async with serving(cfg) as channel:
            call = pb_grpc.MapServiceStub(channel).Watch(
                pb.WatchRequest(map=map_name, **request), timeout=DEADLINE
            )
            try:
                return await collect(call, count)
            finally:
                call.cancel()

    return asyncio.run(main())


def watch_error(cfg: AppConfig, map_name: str, **request: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        watch(cfg, map_name, 1, **request)
    return info.value


def summary(changes: list[pb.Change]) -> list[tuple[str, int, int]]:
    return [(c.key, c.op, c.batch_id) for c in changes]


def test_watch_from_now_sends_only_later_changes_in_order(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    write_batch(redis_url, map_name, 0, {"old": entity("old", "before")})

    async def main() -> list[pb.Change]:
        async with serving(make_config(redis_url, map_name)) as channel:
            call = pb_grpc.MapServiceStub(channel).Watch(
                pb.WatchRequest(map=map_name), timeout=DEADLINE
            )
            await call.initial_metadata()  # the position is fixed: later changes will arrive
            await asyncio.to_thread(
                write_batch, redis_url, map_name, 1, {"a": entity("a", "Ann"), "old": None}
            )
            await asyncio.to_thread(write_batch, redis_url, map_name, 2, {"b": entity("b", "Bob")})
            try:
                return await collect(call, 3)
            finally:
                call.cancel()

    changes = asyncio.run(main())

    assert sorted(summary(changes[:2])) == [("a", UPSERT, 1), ("old", DELETE, 1)]
    assert summary(changes[2:]) == [("b", UPSERT, 2)]
    assert [c.change_id for c in changes] == stream_ids(redis_client, map_name)[1:]
    assert all(c.entity == b"" for c in changes)  # not asked for


def test_resume_after_a_change_id_sends_exactly_the_later_changes(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    for batch in range(4):
        write_batch(redis_url, map_name, batch, {f"k{batch}": entity(f"k{batch}", "x")})
    ids = stream_ids(redis_client, map_name)

    changes = watch(make_config(redis_url, map_name), map_name, 2, after_change_id=ids[1])

    assert [c.change_id for c in changes] == ids[2:]
    assert summary(changes) == [("k2", UPSERT, 2), ("k3", UPSERT, 3)]


def test_zero_sends_every_retained_change(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    write_batch(redis_url, map_name, 0, {"a": entity("a", "1"), "b": entity("b", "1")})
    write_batch(redis_url, map_name, 1, {"a": None})

    changes = watch(make_config(redis_url, map_name), map_name, 3, after_change_id="0")

    assert [c.change_id for c in changes] == stream_ids(redis_client, map_name)
    assert sorted(summary(changes[:2])) == [("a", UPSERT, 0), ("b", UPSERT, 0)]
    assert summary(changes[2:]) == [("a", DELETE, 1)]


def test_a_trimmed_change_id_is_out_of_range(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    write_batch(redis_url, map_name, 0, {"first": entity("first", "x")}, max_len=10)
    first = stream_ids(redis_client, map_name)[0]
    for batch in range(1, 4):
        keys = {f"k{batch}-{i}": entity(f"k{batch}-{i}", "x") for i in range(150)}
        write_batch(redis_url, map_name, batch, keys, max_len=10)
    assert first not in stream_ids(redis_client, map_name)  # the cap trimmed it

    error = watch_error(make_config(redis_url, map_name), map_name, after_change_id=first)

    assert error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert first in error.details()
    assert "trimmed" in error.details()


def test_a_change_id_newer_than_the_stream_is_out_of_range(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    write_batch(redis_url, map_name, 0, {"a": entity("a", "x")})
    newest = stream_ids(redis_client, map_name)[-1]
    later = f"{int(newest.split('-')[0]) + 1}-0"

    error = watch_error(make_config(redis_url, map_name), map_name, after_change_id=later)

    assert error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "newer" in error.details()


@pytest.mark.parametrize("change_id", ["abc", "1-2-3", "-1", "12-", "1 2"])
def test_a_malformed_change_id_is_invalid_argument(
    redis_url: str, map_name: str, change_id: str
) -> None:
    error = watch_error(make_config(redis_url, map_name), map_name, after_change_id=change_id)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "after_change_id" in error.details()


def test_keys_filter_the_changes(redis_url: str, redis_client: redis.Redis, map_name: str) -> None:
    write_batch(redis_url, map_name, 0, {"a": entity("a", "1"), "b": entity("b", "1")})
    write_batch(redis_url, map_name, 1, {"c": entity("c", "1")})
    write_batch(redis_url, map_name, 2, {"b": None, "c": None})

    changes = watch(
        make_config(redis_url, map_name), map_name, 2, after_change_id="0", keys=["b", "zz"]
    )

    assert summary(changes) == [("b", UPSERT, 0), ("b", DELETE, 2)]


def test_include_entities_sends_the_current_entity_of_upserts(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    write_batch(redis_url, map_name, 0, {"a": entity("a", "v1"), "b": entity("b", "v1")})
    write_batch(redis_url, map_name, 1, {"a": entity("a", "v2"), "c": entity("c", "v1")})
    write_batch(redis_url, map_name, 2, {"c": None})

    changes = watch(
        make_config(redis_url, map_name), map_name, 5, after_change_id="0", include_entities=True
    )

    got = [(c.key, c.op, c.entity) for c in changes]
    # Entities are read when sent: the current value, empty once deleted.
    assert sorted(got[:2]) == [("a", UPSERT, entity("a", "v2")), ("b", UPSERT, entity("b", "v1"))]
    assert sorted(got[2:4]) == [("a", UPSERT, entity("a", "v2")), ("c", UPSERT, b"")]
    assert got[4] == ("c", DELETE, b"")


def test_unknown_map_and_bad_filter_keys_are_refused(redis_url: str, map_name: str) -> None:
    cfg = make_config(redis_url, map_name)

    unknown = watch_error(cfg, "no-such-map")
    empty_key = watch_error(cfg, map_name, keys=["a", ""])

    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    assert empty_key.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "keys[1]: must not be empty" in empty_key.details()


def blocked_readers(client: redis.Redis, name: str) -> int:
    """Connections named ``name`` blocked in a command (``flags`` has ``b``)."""
    return sum(1 for c in client.client_list() if c["name"] == name and "b" in c["flags"])


def test_cancel_ends_the_watch_and_frees_its_connection(
    redis_url: str, redis_client: redis.Redis, map_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"watch-{uuid.uuid4().hex[:8]}"
    cfg = make_config(f"{redis_url}?client_name={name}", map_name)
    redis_client.set(f"{map_name}:a", entity("a", "Ann"))

    async def main() -> tuple[grpc.StatusCode, pb.GetResponse, int]:
        async with serving(cfg) as channel:
            stub = pb_grpc.MapServiceStub(channel)
            call = stub.Watch(pb.WatchRequest(map=map_name), timeout=60)
            await call.initial_metadata()

            async def waiting() -> bool:
                return blocked_readers(redis_client, name) == 1

            await eventually("the watch to wait in Redis", waiting)
            # A waiting watch holds no event loop: lookups are answered meanwhile.
            got = await stub.Get(pb.GetRequest(map=map_name, key="a"), timeout=DEADLINE)
            call.cancel()
            code = await call.code()

            async def released() -> bool:
                return blocked_readers(redis_client, name) == 0

            await eventually("the watch's connection to stop waiting", released)
            return code, got, blocked_readers(redis_client, name)

    with caplog.at_level(logging.WARNING):
        code, got, left = asyncio.run(main())

    assert code == grpc.StatusCode.CANCELLED
    assert got.found and got.entity == entity("a", "Ann")
    assert left == 0
    assert not [r for r in caplog.records if r.name.startswith("query_service")]


def test_a_watch_falling_behind_the_trim_is_told_so(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    write_batch(redis_url, map_name, 0, {"a": entity("a", "x")}, max_len=10)

    async def main() -> grpc.aio.AioRpcError:
        async with serving(make_config(redis_url, map_name)) as channel:
            call = pb_grpc.MapServiceStub(channel).Watch(
                pb.WatchRequest(map=map_name, after_change_id="0"), timeout=DEADLINE
            )
            await call.read()  # the first change; the server then reads after it
            # Far more changes than the cap before the watch reads again: some are lost to it.
            keys = {f"k{i}": entity(f"k{i}", "x") for i in range(2000)}
            await asyncio.to_thread(write_batch, redis_url, map_name, 1, keys, None, 10)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                while True:
                    response = await call.read()
                    assert response is not grpc.aio.EOF
            return info.value

    error = asyncio.run(main())

    assert error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "trimmed" in error.details()


# --- against the real pipeline -----------------------------------------------------------


def test_watch_follows_what_the_pipeline_writes(
    spark, kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    topic = new_topic(1)
    map_name = f"watch-{topic}"
    cfg = config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=map_name))
    records: list[tuple[bytes | None, bytes | None]] = [
        (f"u{i % 7}".encode(), orjson.dumps({"id": f"u{i % 7}", "name": f"n{i}", "age": i}))
        for i in range(50)
    ] + [(b"u3", None), (b"u5", None)]

    queries = start_map(spark, cfg, map_name)
    try:

        async def main() -> tuple[dict[str, tuple[int, bytes]], list[str], list[tuple[int, int]]]:
            async with serving(cfg) as channel:
                call = pb_grpc.MapServiceStub(channel).Watch(
                    pb.WatchRequest(map=map_name, include_entities=True), timeout=180
                )
                await call.initial_metadata()
                positions = await asyncio.to_thread(produce, kafka_bootstrap, topic, records)
                events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
                expected = fold_latest(events, "id", FIELDS)
                last: dict[str, tuple[int, bytes]] = {}
                ids: list[str] = []
                async for response in call:
                    for c in response.changes:
                        last[c.key] = (c.op, c.entity)
                        ids.append(c.change_id)
                    upserted = {
                        k: orjson.loads(e) for k, (op, e) in last.items() if op == UPSERT and e
                    }
                    if upserted == expected and len(last) == 7:
                        break
                call.cancel()
                return last, ids, positions

        last, ids, positions = asyncio.run(main())
    finally:
        queries.stop()

    events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
    reference = fold_latest(events, "id", FIELDS)
    assert {k for k, (op, _) in last.items() if op == DELETE} == {"u3", "u5"}
    assert {k: orjson.loads(e) for k, (op, e) in last.items() if op == UPSERT} == reference
    assert ids == sorted(ids, key=lambda i: tuple(int(p) for p in i.split("-")))


def test_an_expiry_is_a_change_of_its_own(
    redis_url: str, redis_client: redis.Redis, map_name: str, kafka_bootstrap: str, new_topic
) -> None:
    target = FoldTarget(
        redis=RedisConfig(url=redis_url),
        map_name=map_name,
        changelog_topic=new_topic(1),
        producer=producer_settings(KafkaConfig(bootstrap_servers=kafka_bootstrap), 1_048_576),
        ttl_ms=300,
    )
    load_library(target.redis)
    mark_whole(redis_client, map_name)
    apply(target, 0, [("a", "1", {"id": "a"})])
    wait_until("a to expire", lambda: not redis_client.exists(entity_key(map_name, "a")))
    assert sweep_expired(target, new_producer(target)) == 1

    changes = watch(make_config(redis_url, map_name), map_name, 2, after_change_id="0")

    assert summary(changes) == [("a", UPSERT, 0), ("a", pb.Change.EXPIRE, -1)]
