"""What the demo shows, gathered twice a second: each map's progress and a few lookups.

Progress comes from where the product keeps it: the watermark a map's last
batch wrote to ``<map>:__meta__`` and the state the run reports in
``<map>:__status__``, set against what the producer delivered. Lookups go
through the query service with its own client, as an application would call
it, and pick users whose latest profile event ``users`` has already folded, so
a lookup shows what the map holds rather than racing the fold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from materializer.contract.redis_layout import meta_key, status_key
from materializer.contract.status import MapReport
from materializer.contract.watermark import Watermark
from materializer.demo.domain import TOPIC_OF_MAP, USER_EVENTS, USER_ORDERS, USERS
from materializer.demo.producer import DeliveryLog
from query_service.client import MaterializerClient

SAMPLE_USERS = 5
SILENT_AFTER_MS = 15_000
"""A status report older than this means the run is gone (as the admin service judges it)."""


@dataclass(frozen=True)
class MapProgress:
    """One map against its topic: produced, folded, lag, freshness and the run's report."""

    name: str
    topic: str
    produced: int
    folded: int
    lag: int
    freshness: float | None
    """Seconds from producing the newest folded event to its batch reaching Redis."""
    state: str
    batch_id: int | None
    rows_per_second: float


@dataclass(frozen=True)
class Lookups:
    """A Get of the newest folded user, and a BatchGet of recent ones from both maps."""

    get_key: str = ""
    get_entity: dict[str, Any] | None = None
    get_ms: float = 0.0
    users: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    orders: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    batch_ms: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class Snapshot:
    """One refresh of the screen."""

    maps: list[MapProgress]
    lookups: Lookups
    error: str = ""


def _state(report: MapReport | None, now_ms: int) -> str:
    if report is None:
        return "starting"
    if now_ms - report.reported_at_ms > SILENT_AFTER_MS:
        return "silent"
    return report.state


def progress(
    name: str, mark: Watermark | None, report: MapReport | None, log: DeliveryLog, now_ms: int
) -> MapProgress:
    """A map's figures from its watermark and status hashes and the producer's deliveries."""
    topic = TOPIC_OF_MAP[name]
    folded_to = mark.offsets.get(topic, {}) if mark else {}
    ends = log.log_ends(topic)
    lag = sum(max(0, end - folded_to.get(p, 0)) for p, end in ends.items())
    produced = [log.produced_at(topic, p, n - 1) for p, n in folded_to.items() if n > 0]
    newest = max((t for t in produced if t is not None), default=None)
    freshness = None
    if mark is not None and newest is not None:
        freshness = max(0.0, mark.updated_at_ms / 1000 - newest)
    return MapProgress(
        name=name,
        topic=topic,
        produced=log.count(topic),
        folded=sum(folded_to.values()),
        lag=lag,
        freshness=freshness,
        state=_state(report, now_ms),
        batch_id=mark.batch_id if mark else None,
        rows_per_second=report.processed_rows_per_second if report else 0.0,
    )


def folded_users(log: DeliveryLog, users_mark: Watermark | None, n: int) -> list[str]:
    """The ``n`` users with the latest profile events that ``users`` has folded, newest first.

    Chosen by their profile events, so a user absent from ``users`` was
    deleted (the tombstone is folded) rather than not folded yet; their
    orders may still be on the way.
    """
    folded_to = users_mark.offsets.get(USER_EVENTS, {}) if users_mark else {}
    users: list[str] = []
    for d in log.recent():
        folded = d.topic == USER_EVENTS and d.offset < folded_to.get(d.partition, 0)
        if folded and d.user_id not in users:
            users.append(d.user_id)
            if len(users) == n:
                break
    return users


class Monitor:
    """Reads the maps' progress from Redis and looks users up through the query service."""

    def __init__(self, redis_url: str, target: str, log: DeliveryLog) -> None:
        self._redis = aioredis.Redis.from_url(redis_url, socket_timeout=2)
        self._client = MaterializerClient(target, deadline=2.0)
        self._log = log

    async def close(self) -> None:
        """Close the Redis pool and the gRPC channel."""
        await self._client.close()
        await self._redis.aclose()

    async def snapshot(self) -> Snapshot:
        """The maps' progress and a round of lookups; failures are shown, never raised."""
        names = [USERS, USER_ORDERS]
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hgetall(meta_key(name))
                    pipe.hgetall(status_key(name))
                raw = await pipe.execute()
        except (RedisError, OSError) as exc:
            return Snapshot([], Lookups(), error=f"redis: {exc}")
        now_ms = int(time.time() * 1000)
        marks = {name: Watermark.from_hash(raw[2 * i]) for i, name in enumerate(names)}
        reports = {name: MapReport.from_hash(raw[2 * i + 1]) for i, name in enumerate(names)}
        maps = [progress(n, marks[n], reports[n], self._log, now_ms) for n in names]
        sample = folded_users(self._log, marks[USERS], SAMPLE_USERS)
        return Snapshot(maps, await self._lookups(sample))

    async def _lookups(self, users: list[str]) -> Lookups:
        if not users:
            return Lookups()
        try:
            started = time.perf_counter()
            got = await self._client.get(USERS, users[0])
            get_ms = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            profiles, _ = await self._client.batch_get(USERS, users)
            orders, _ = await self._client.batch_get(USER_ORDERS, users)
            batch_ms = (time.perf_counter() - started) * 1000 / 2
        except grpc.aio.AioRpcError as exc:
            return Lookups(error=f"{exc.code().name}: {exc.details()}")
        return Lookups(users[0], got.entity, get_ms, profiles, orders, batch_ms)
