"""Concurrent Gets of one map share Redis round trips and each still gets its own entity."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import redis

from materializer.contract.redis_layout import Watermark, entity_key, meta_key
from materializer.testing import RedisServer
from query_service.errors import StoreUnavailable
from query_service.stores.redis import RedisMapStore


def _mgets(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_mget", {}).get("calls", 0))


def test_concurrent_lookups_are_gathered_and_answered_each_with_its_entity(
    redis_url: str, redis_client: redis.Redis
):
    name = f"co{uuid.uuid4().hex[:8]}"
    for i in range(200):
        redis_client.set(entity_key(name, f"k{i}"), f'{{"i":{i}}}'.encode())
    redis_client.hset(meta_key(name), mapping=Watermark(5, {"t": {0: 9}}).to_hash())
    before = _mgets(redis_client)

    async def main() -> list[tuple[bytes | None, int | None]]:
        store = RedisMapStore.from_url(redis_url)
        try:
            keys = [f"k{i % 250}" for i in range(500)]  # some absent, some asked twice
            found = await asyncio.gather(*(store.get_with_watermark(name, k) for k in keys))
            return [(f.entity, f.watermark.batch_id if f.watermark else None) for f in found]
        finally:
            await store.close()

    answers = asyncio.run(main())
    expected = [(f'{{"i":{i % 250}}}'.encode() if i % 250 < 200 else None, 5) for i in range(500)]
    assert answers == expected
    # 500 lookups in one turn: a handful of round trips, not 500.
    assert 1 <= _mgets(redis_client) - before <= 5


def test_a_gathering_fails_together_when_redis_is_gone(tmp_path):
    server = RedisServer(tmp_path).start()
    url = server.url
    server.stop()

    async def main() -> list[BaseException | object]:
        store = RedisMapStore.from_url(url)
        try:
            return await asyncio.gather(
                *(store.get_with_watermark("m", f"k{i}") for i in range(10)),
                return_exceptions=True,
            )
        finally:
            await store.close()

    results = asyncio.run(main())
    assert all(isinstance(r, StoreUnavailable) for r in results)
    assert all(r.code == grpc.StatusCode.UNAVAILABLE for r in results)  # type: ignore[union-attr]
