"""The near cache in front of Redis: hits, invalidation from the change stream, freshness.

Writes that should invalidate go through the materializer's own Redis sink
code (entity, then watermark and change entry). Writes that bypass it (a
plain SET with no change entry) show what the cache is serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import orjson
import pytest
import redis

from materializer.config import AppConfig
from materializer.contract.redis_layout import changes_key, entity_key, meta_key
from materializer.contract.watermark import Watermark
from materializer.testing import RedisServer
from materializer.testing.waiting import eventually
from materializer.v1 import common_pb2 as common
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.stores.redis import WATERMARK_SECONDS
from tests.helpers.query_redis import (
    DEADLINE,
    fresh_map,
    lookups,
    make_config,
    serving,
    write_batch,
)


@pytest.fixture()
def map_name(redis_client: redis.Redis) -> Iterator[str]:
    yield from fresh_map(redis_client)


def entity(key: str, name: str) -> bytes:
    return orjson.dumps({"id": key, "name": name})


def cached(redis_url: str, map_name: str, max_entries: int = 100) -> AppConfig:
    return make_config(redis_url, map_name, near_cache={map_name: max_entries})


class Client:
    """Lookups through a real channel, as tests read them."""

    def __init__(self, channel: grpc.aio.Channel, map_name: str) -> None:
        self.stub = pb_grpc.MapServiceStub(channel)
        self.map = map_name

    async def get(self, key: str, freshness: common.Freshness | None = None) -> pb.GetResponse:
        request = pb.GetRequest(map=self.map, key=key, freshness=freshness)
        return await self.stub.Get(request, timeout=DEADLINE)

    async def entity(self, key: str) -> bytes | None:
        response = await self.get(key)
        return response.entity if response.found else None

    async def batch(self, keys: list[str]) -> pb.BatchGetResponse:
        return await self.stub.BatchGet(
            pb.BatchGetRequest(map=self.map, keys=keys), timeout=DEADLINE
        )


def counts(map_name: str) -> tuple[float, float]:
    return lookups(map_name, "hit"), lookups(map_name, "miss")


async def becomes(client: Client, key: str, value: bytes | None) -> None:
    async def seen() -> bool:
        return await client.entity(key) == value

    await eventually(f"{client.map}:{key} to read {value!r}", seen)


def test_second_get_is_a_hit_until_a_change_invalidates_it(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    write_batch(redis_url, map_name, 1, {"a": entity("a", "v1")})

    async def main() -> list[tuple[float, float]]:
        async with serving(cached(redis_url, map_name)) as channel:
            client = Client(channel, map_name)
            moves = [counts(map_name)]
            assert await client.entity("a") == entity("a", "v1")
            moves.append(counts(map_name))
            assert await client.entity("a") == entity("a", "v1")
            moves.append(counts(map_name))
            # Behind the materializer's back (no change entry): the cache still answers.
            redis_client.set(entity_key(map_name, "a"), entity("a", "sneaky"))
            assert await client.entity("a") == entity("a", "v1")
            # Written as the materializer writes: the change entry invalidates the key.
            await asyncio.to_thread(write_batch, redis_url, map_name, 2, {"a": entity("a", "v2")})
            await becomes(client, "a", entity("a", "v2"))
            return moves

    (h0, m0), (h1, m1), (h2, m2) = asyncio.run(main())

    assert (h1 - h0, m1 - m0) == (0, 1)  # the first Get fills the cache
    assert (h2 - h1, m2 - m1) == (1, 0)  # the second is answered from it


def test_absent_keys_are_cached_and_invalidated_by_creation_and_deletion(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    write_batch(redis_url, map_name, 1, {"other": entity("other", "x")})

    async def main() -> None:
        async with serving(cached(redis_url, map_name)) as channel:
            client = Client(channel, map_name)
            assert await client.entity("x") is None
            redis_client.set(entity_key(map_name, "x"), entity("x", "sneaky"))
            assert await client.entity("x") is None  # the absence was cached
            await asyncio.to_thread(write_batch, redis_url, map_name, 2, {"x": entity("x", "v1")})
            await becomes(client, "x", entity("x", "v1"))
            await asyncio.to_thread(write_batch, redis_url, map_name, 3, {"x": None})
            await becomes(client, "x", None)

    asyncio.run(main())


def test_a_hit_answers_with_the_watermark_it_was_read_under_and_freshness_bypasses_it(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    topic = f"{map_name}-events"
    write_batch(redis_url, map_name, 1, {"a": entity("a", "v1")}, {topic: {0: 5}})

    async def main() -> tuple[
        pb.GetResponse, pb.GetResponse, pb.GetResponse, list[tuple[float, float]]
    ]:
        async with serving(cached(redis_url, map_name)) as channel:
            client = Client(channel, map_name)
            await client.get("a")
            # A newer batch lands without a change entry for "a" (so nothing invalidates it).
            redis_client.set(entity_key(map_name, "a"), entity("a", "v2"))
            redis_client.hset(
                meta_key(map_name),
                mapping=Watermark(batch_id=2, offsets={topic: {0: 9}}, app_id="x").to_hash(),
            )
            stale = await client.get("a")
            before = counts(map_name)
            wanted = common.Freshness(
                min_offsets=[common.PartitionOffset(topic=topic, partition=0, offset=9)]
            )
            fresh = await client.get("a", wanted)
            between = counts(map_name)
            again = await client.get("a", wanted)  # the refreshed entry now covers it
            after = counts(map_name)
            moves = [
                (now[0] - then[0], now[1] - then[1])
                for then, now in ((before, between), (between, after))
            ]
            return stale, fresh, again, moves

    stale, fresh, again, moves = asyncio.run(main())

    assert stale.entity == entity("a", "v1")
    assert [(o.partition, o.offset) for o in stale.watermark.offsets] == [(0, 5)]
    assert stale.watermark.batch_id == 1
    assert fresh.entity == entity("a", "v2")
    assert [(o.partition, o.offset) for o in fresh.watermark.offsets] == [(0, 9)]
    assert again.entity == entity("a", "v2")
    assert moves == [(0, 1), (1, 0)]  # bypassed once, then a hit that covers the offsets


def test_batch_get_uses_the_cache_and_answers_the_oldest_watermark(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    topic = f"{map_name}-events"
    write_batch(
        redis_url, map_name, 1, {"a": entity("a", "1"), "b": entity("b", "1")}, {topic: {0: 3}}
    )

    async def main() -> tuple[pb.BatchGetResponse, pb.BatchGetResponse, tuple[float, float]]:
        async with serving(cached(redis_url, map_name)) as channel:
            client = Client(channel, map_name)
            await client.get("a")
            redis_client.hset(
                meta_key(map_name),
                mapping=Watermark(batch_id=2, offsets={topic: {0: 8}}, app_id="x").to_hash(),
            )
            # Lookups share a watermark read within WATERMARK_SECONDS: past it, the next
            # read takes the new one.
            await asyncio.sleep(2 * WATERMARK_SECONDS)
            before = counts(map_name)
            mixed = await client.batch(["a", "b", "a", "none"])
            after = counts(map_name)
            cached_only = await client.batch(["b", "none"])
            return mixed, cached_only, (after[0] - before[0], after[1] - before[1])

    mixed, cached_only, (hits, misses) = asyncio.run(main())

    assert [(e.key, e.found, e.entity) for e in mixed.entries] == [
        ("a", True, entity("a", "1")),
        ("b", True, entity("b", "1")),
        ("a", True, entity("a", "1")),
        ("none", False, b""),
    ]
    assert (hits, misses) == (2, 2)  # "a" twice from the cache; "b" and "none" from Redis
    # "a" was read under offset 3, so 3 is the bound for the whole answer.
    assert [o.offset for o in mixed.watermark.offsets] == [3]
    # Entirely from the cache: the watermark those entries were read under.
    assert [e.found for e in cached_only.entries] == [True, False]
    assert [o.offset for o in cached_only.watermark.offsets] == [8]


def test_a_map_without_a_near_cache_always_reads_redis(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    write_batch(redis_url, map_name, 1, {"a": entity("a", "v1")})

    async def main() -> tuple[bytes | None, bytes | None]:
        async with serving(make_config(redis_url, map_name)) as channel:
            client = Client(channel, map_name)
            first = await client.entity("a")
            redis_client.set(entity_key(map_name, "a"), entity("a", "v2"))
            return first, await client.entity("a")

    before = counts(map_name)
    first, second = asyncio.run(main())

    assert (first, second) == (entity("a", "v1"), entity("a", "v2"))
    assert counts(map_name) == before


def test_the_least_recently_used_entry_is_evicted(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    write_batch(redis_url, map_name, 1, {k: entity(k, "1") for k in "abc"})

    async def main() -> list[bytes | None]:
        async with serving(cached(redis_url, map_name, max_entries=2)) as channel:
            client = Client(channel, map_name)
            for key in "abc":  # "a" is pushed out by "c"
                await client.entity(key)
            for key in "abc":
                redis_client.set(entity_key(map_name, key), entity(key, "sneaky"))
            return [await client.entity(k) for k in "cba"]

    # "c" and "b" were still cached; "a" had been evicted, so Redis answers it.
    assert asyncio.run(main()) == [entity("c", "1"), entity("b", "1"), entity("a", "sneaky")]


def test_a_lost_change_stream_drops_the_cache_and_caching_resumes(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    write_batch(redis_url, map_name, 1, {"a": entity("a", "v1"), "b": entity("b", "v1")})

    async def main() -> None:
        async with serving(cached(redis_url, map_name)) as channel:
            client = Client(channel, map_name)
            await client.entity("a")
            redis_client.set(entity_key(map_name, "a"), entity("a", "sneaky"))
            # The stream the cache follows disappears (a flushed or rebuilt Redis): changes
            # may have been missed, so nothing cached before may be served any more.
            redis_client.delete(changes_key(map_name))
            await becomes(client, "a", entity("a", "sneaky"))

            async def hit_again() -> bool:
                hits = lookups(map_name, "hit")
                await client.entity("b")
                return lookups(map_name, "hit") > hits

            await eventually("the cache to serve hits again", hit_again)
            # ... and to be invalidated again from the new stream.
            await asyncio.to_thread(write_batch, redis_url, map_name, 2, {"b": entity("b", "v2")})
            await becomes(client, "b", entity("b", "v2"))

    asyncio.run(main())


def test_a_redis_outage_stops_cache_hits() -> None:
    map_name = "outage"
    with RedisServer() as own:
        write_batch(own.url, map_name, 1, {"a": entity("a", "v1")})

        async def main() -> grpc.StatusCode:
            async with serving(cached(own.url, map_name)) as channel:
                client = Client(channel, map_name)
                assert await client.entity("a") == entity("a", "v1")
                assert await client.entity("a") == entity("a", "v1")  # a hit
                await asyncio.to_thread(own.stop)
                codes: list[grpc.StatusCode] = []

                async def refused() -> bool:
                    try:
                        await client.get("a")
                    except grpc.aio.AioRpcError as exc:
                        codes.append(exc.code())
                        return True
                    return False

                # While nobody follows the changes, the cache is not trusted.
                await eventually("lookups to reach the stopped Redis", refused)
                return codes[-1]

        code = asyncio.run(main())

    assert code == grpc.StatusCode.UNAVAILABLE
