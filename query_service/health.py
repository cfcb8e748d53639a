"""``grpc.health.v1`` that follows Redis: NOT_SERVING while it cannot be reached.

A load balancer or Kubernetes readiness probe then stops sending lookups to
a replica whose Redis is gone, instead of letting every call fail with
UNAVAILABLE; the status flips back on the first successful ping.

Each map has a health of its own, service name ``map/<map>``: NOT_SERVING
also while its materializer reports it ``restoring`` (Redis lost its copy)
or ``catching_up`` (more records left in its source logs than its
``catch_up.ready_lag``), so a client can tell which maps answer in full and
which are fresh enough for read-your-writes. The overall health follows
Redis alone: one map being restored or catching up is no reason to take a
replica out, and its lookups keep answering, with the watermark that tells
how far it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence

from grpc_health.v1 import health, health_pb2
from redis.exceptions import RedisError

from materializer.clients.redis import AsyncClient
from materializer.contract.redis_layout import status_key

log = logging.getLogger(__name__)


def map_service(map_name: str) -> str:
    """The health service name of one map."""
    return f"map/{map_name}"


CHECK_SECONDS = 1.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


_REPORTED = ["state", "records_left", "eta_seconds"]


def _not_serving(name: str, reported: list[bytes | None]) -> str:
    """Why a map whose materializer reported ``reported`` (``_REPORTED``) does not serve;
    "" when it does."""
    state, left, eta = (v.decode() if v is not None else "" for v in reported)
    if state == "restoring":
        return f"map {name!r} is restoring: Redis lost its copy, which is being written back"
    if state == "catching_up":
        figures = f"{left} records left" if left and int(left) >= 0 else "records left unknown"
        if eta and float(eta) >= 0:
            figures += f", about {float(eta):.0f} s to go"
        return f"map {name!r} is catching up ({figures}); lookups answer with its watermark"
    return ""


class RedisHealth:
    """Pings Redis every second and sets every service's health to match."""

    def __init__(
        self,
        servicer: health.aio.HealthServicer,
        client: AsyncClient,
        services: Sequence[str],
        interval: float = CHECK_SECONDS,
        maps: Sequence[str] = (),
    ) -> None:
        self._servicer = servicer
        self._client = client
        self._services = [health.OVERALL_HEALTH, *services]
        self._maps = list(maps)
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self._serving: bool | None = None
        self._map_serving: dict[str, bool] = {}
        self._map_reasons: dict[str, str] = {}
        self._gone: set[str] = set()

    @property
    def serving(self) -> bool:
        """Whether the last check reached Redis."""
        return bool(self._serving)

    def map_serving(self, name: str) -> bool:
        """Whether the map serves: Redis answers, its copy is not being restored and it is
        not catching up."""
        return self._map_serving.get(name, False)

    def map_reason(self, name: str) -> str:
        """Why the map does not serve, as of the last check ("" when it does, or is unknown)."""
        return self._map_reasons.get(name, "")

    async def check(self) -> bool:
        """One ping (and each map's reported state); the health statuses follow."""
        states: list[list[bytes | None]] = []
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation
            # that lands as the ping fails (a port that refuses at once), and the check
            # then outlives the server that cancelled it.
            async with asyncio.timeout(self._interval):
                ok = bool(await self._client.ping())
            if ok and self._maps:
                async with asyncio.timeout(self._interval):
                    states = await self._map_states()
        except (RedisError, OSError, TimeoutError):
            ok = False
        if ok != self._serving:
            if self._serving is not None:
                log.warning(
                    "redis %s: health %s",
                    "back" if ok else "unreachable",
                    "SERVING" if ok else "NOT_SERVING",
                )
            self._serving = ok
            for service in self._services:
                await self._servicer.set(service, SERVING if ok else NOT_SERVING)
        while self._gone:
            name = self._gone.pop()
            self._map_reasons.pop(name, None)
            if self._map_serving.pop(name, None) is not None:
                await self._servicer.set(map_service(name), NOT_SERVING)
        for i, name in enumerate(self._maps):
            reason = _not_serving(name, states[i]) if ok and i < len(states) else ""
            serving = ok and i < len(states) and not reason
            self._map_reasons[name] = reason
            if self._map_serving.get(name) != serving:
                self._map_serving[name] = serving
                await self._servicer.set(map_service(name), SERVING if serving else NOT_SERVING)
        return ok

    def follow(self, maps: Iterable[str]) -> None:
        """Watch these maps from the next check on (maps come and go at runtime); a map
        no longer watched turns NOT_SERVING then."""
        self._maps = sorted(maps)
        self._gone.update(set(self._map_serving) - set(self._maps))

    async def _map_states(self) -> list[list[bytes | None]]:
        """Each map's reported state and records left (``<map>:__status__``), one round trip."""
        async with self._client.pipeline(transaction=False) as pipe:
            for name in self._maps:
                pipe.hmget(status_key(name), _REPORTED)
            return list(await pipe.execute())

    async def _run(self) -> None:
        task = asyncio.current_task()
        while True:
            await self.check()
            if task is not None and task.cancelling():
                # Cancelled during a ping whose client took the cancellation for a lost
                # connection (a RedisError the check counts as Redis down): the loop would
                # sleep on, and a stop that waits for it would wait forever.
                raise asyncio.CancelledError
            await asyncio.sleep(self._interval)

    async def start(self) -> None:
        """First check now (so a server starts with a true status), then every interval."""
        await self.check()
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        """Stop checking and report NOT_SERVING: the server is about to go away."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task  # ended before the statuses turn, so none turns back
            self._task = None
        self._serving = False
        for service in [*self._services, *map(map_service, self._maps)]:
            await self._servicer.set(service, NOT_SERVING)
