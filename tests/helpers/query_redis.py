"""Shared helpers of the Redis-backed query tests: config, a served channel, materializer writes."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
import orjson
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from materializer.clients.redis import client_for
from materializer.config import AppConfig, RedisConfig, parse_config
from materializer.contract.markers import mark_whole
from materializer.contract.watermark import Watermark
from materializer.redis.functions import FoldTarget, load_library
from materializer.redis.watermark import WatermarkSink
from materializer.redis.writer import Writer
from query_service.near_cache import NearCaches
from query_service.server import Servers, create_server, create_servers
from query_service.stores.redis import RedisMapStore

T = TypeVar("T")
DEADLINE = 10.0
APP_ID = "tests:query"


def map_doc(name: str) -> dict[str, Any]:
    return {
        "source": {"topics": [f"{name}-events"], "schema": "id STRING, name STRING"},
        "key": "id",
    }


def make_config(
    redis_url: str,
    *maps: str,
    near_cache: Mapping[str, int] | None = None,
    max_batch_keys: int | None = None,
) -> AppConfig:
    """Maps reading ``<map>-events``; ``near_cache`` maps a map to its ``max_entries``."""
    query: dict[str, Any] = {
        "near_cache": {m: {"max_entries": n} for m, n in (near_cache or {}).items()}
    }
    if max_batch_keys is not None:
        query["max_batch_keys"] = max_batch_keys
    return parse_config(
        {"redis": {"url": redis_url}, "query": query, "maps": {m: map_doc(m) for m in maps}}
    )


def fresh_map(client: redis.Redis) -> Iterator[str]:
    """A map name no other test uses; every key under it is deleted afterwards."""
    name = f"qs-{uuid.uuid4().hex[:12]}"
    yield name
    keys = list(client.scan_iter(match=f"{name}*"))  # entities, bookkeeping, fold state
    if keys:
        client.delete(*keys)


@asynccontextmanager
async def serving(config: AppConfig) -> AsyncIterator[grpc.aio.Channel]:
    """A started server (with the near caches of ``config``) and a channel to it."""
    store = RedisMapStore.from_config(config.redis)
    near_caches = NearCaches(store, config.query.near_cache)
    await near_caches.start()
    server, port = await create_server(config, store=store, near_caches=near_caches)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(None)
        await near_caches.close()
        await store.close()


def run(config: AppConfig, body: Callable[[grpc.aio.Channel], Awaitable[T]]) -> T:
    """Run ``body`` against a freshly started server (pytest-asyncio is not used)."""

    async def main() -> T:
        async with serving(config) as channel:
            return await body(channel)

    return asyncio.run(main())


def write_batch(
    redis_url: str | RedisConfig,
    map_name: str,
    batch_id: int,
    entities: Mapping[str, bytes | None],
    offsets: Mapping[str, Mapping[int, int]] | None = None,
    max_len: int = 100_000,
) -> None:
    """Write one micro-batch of a ``latest`` map the way the fold does, with its own code:
    each entity through the Redis Functions (``None`` deletes; a later batch wins), which
    append the change entries, then the watermark. The changelog, which goes to Kafka, is
    left out: these tests read Redis only.

    ``redis_url``: one server's URL, or a ``RedisConfig`` (a Redis Cluster)."""
    config = redis_url if isinstance(redis_url, RedisConfig) else RedisConfig(url=redis_url)
    load_library(config)
    mark_whole(client_for(config), map_name)
    target = FoldTarget(
        redis=config,
        map_name=map_name,
        changelog_topic=f"{map_name}.changelog",
        producer=(),
        changes_max_len=max_len,
    )
    winners = [
        (key, (f"{batch_id:012d}:{i:06d}", value))
        for i, (key, value) in enumerate(entities.items())
    ]
    for _ in Writer(target, batch_id).latest(winners):
        pass
    WatermarkSink(config, map_name, lambda _: {}).commit(
        Watermark(
            batch_id=batch_id,
            offsets={t: dict(ps) for t, ps in (offsets or {}).items()},
            updated_at_ms=int(time.time() * 1000),
            app_id=APP_ID,
        )
    )


def lookups(map_name: str, result: str) -> float:
    """``materializer_query_near_cache_lookups_total`` of one map and result, in this process."""
    value = REGISTRY.get_sample_value(
        "materializer_query_near_cache_lookups_total", {"map": map_name, "result": result}
    )
    return value or 0.0


class Front:
    """A served query service: an HTTP session on its front and a gRPC channel beside it
    (and the port of its Flight SQL, when it has one)."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        base: str,
        channel: grpc.aio.Channel,
        flight_port: int | None = None,
    ) -> None:
        self.http, self.base, self.channel = http, base, channel
        self.flight_port = flight_port

    async def json(
        self, method: str, path: str, *, status: int = 200, **kwargs: Any
    ) -> dict[str, Any]:
        async with self.http.request(method, self.base + path, **kwargs) as r:
            body = await r.read()
            assert r.status == status, (r.status, body)
            assert r.content_type == "application/json"
            return orjson.loads(body)  # type: ignore[no-any-return]


@asynccontextmanager
async def started(config: AppConfig, flight: bool = False) -> AsyncIterator[Servers]:
    """A started query service with its HTTP front on (and with ``flight``, its Flight SQL
    port), stopped on the way out."""
    store = RedisMapStore.from_config(config.redis)
    near_caches = NearCaches(store, config.query.near_cache)
    servers = await create_servers(
        config,
        store=store,
        near_caches=near_caches,
        http=("127.0.0.1", 0),
        flight="127.0.0.1:0" if flight else None,
    )
    await servers.start()
    try:
        yield servers
    finally:
        await servers.stop(None)
        await near_caches.close()
        await store.close()


@asynccontextmanager
async def front(config: AppConfig, flight: bool = False) -> AsyncIterator[Front]:
    """A started query service with its HTTP front on, an HTTP session and a gRPC channel."""
    async with (
        started(config, flight) as servers,
        aiohttp.ClientSession() as http,
        grpc.aio.insecure_channel(f"127.0.0.1:{servers.port}") as channel,
    ):
        port = servers.flight.port if servers.flight is not None else None
        yield Front(http, f"http://127.0.0.1:{servers.http_port}", channel, port)


HANG_SECONDS = 300.0
"""How long a served test may take before it is failed with where it hung: far beyond any
test's need, well within pytest's timeout, whose report a CI log may not show whole."""


def serve_http(config: AppConfig, body: Callable[[Front], Awaitable[T]], flight: bool = False) -> T:
    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> T:
        loops.append(asyncio.get_running_loop())
        async with front(config, flight) as f:
            return await body(f)

    with hang_report(HANG_SECONDS, loops):
        return asyncio.run(main())


@contextmanager
def hang_report(seconds: float, loops: Sequence[asyncio.AbstractEventLoop] = ()) -> Iterator[None]:
    """Fail the body if it takes over ``seconds``, with where it hung in the message's first
    words: the tasks of ``loops`` where they wait, the main thread's innermost frames, then
    the other live threads' own."""
    hung: list[str] = []
    done = threading.Event()

    def watch() -> None:
        if done.wait(seconds):
            return
        hung.append(_where(loops))
        # A real signal, which ends a blocking wait; asyncio's runner takes the first to
        # cancel its task, and raises at the second.
        while not done.wait(5.0):
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    watcher = threading.Thread(target=watch, name="hang-report", daemon=True)
    watcher.start()
    try:
        yield
    except KeyboardInterrupt:
        if not hung:
            raise
        raise AssertionError(f"hung {seconds:.0f} s at {hung[0]}") from None
    finally:
        done.set()


def _awaiting(coro: Any) -> list[str]:
    """A coroutine and those it awaits, down to the innermost, where each stands."""
    chain = []
    while coro is not None and getattr(coro, "cr_frame", None) is not None:
        frame = coro.cr_frame
        chain.append(
            f"{coro.__qualname__} ({Path(frame.f_code.co_filename).name}:{frame.f_lineno})"
        )
        coro = coro.cr_await
    return chain


def _where(loops: Sequence[asyncio.AbstractEventLoop]) -> str:
    """The loops' tasks and every thread's innermost frames (the main thread's first), on
    one line."""
    parts = []
    for loop in loops:
        for task in list(asyncio.all_tasks(loop)):
            parts.append("task " + " > ".join(_awaiting(task.get_coro())[-3:]))
    frames = sys._current_frames()  # noqa: SLF001 - the stacks of a hung test, to report
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    order = [main, *[i for i in frames if i != main]]
    for ident in order:
        if ident in frames and names.get(ident) != "hang-report":
            stack = traceback.extract_stack(frames[ident])[-3:]
            where = " < ".join(
                f"{f.name} ({Path(f.filename).name}:{f.lineno})" for f in reversed(stack)
            )
            parts.append(f"[{names.get(ident, ident)}] {where}")
    return "; ".join(parts)


def grpc_serving(grpc_port: int) -> bool:
    """Whether a query service's gRPC port answers SERVING: it then has its signal handlers
    (the HTTP front answers earlier, while the catalog is read)."""
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        check = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    return bool(check.status == health_pb2.HealthCheckResponse.SERVING)


def query_service_command() -> list[str]:
    script = Path(sys.executable).with_name("query-service")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from query_service.cli import app; app()"]
