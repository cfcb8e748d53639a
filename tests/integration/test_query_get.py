"""MapService.Get end to end: a real redis-server, a real server on port 0, a real channel."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import orjson
import pytest
import redis
import redis.asyncio as aioredis
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from materializer.config import AppConfig
from materializer.contract.redis_layout import entity_key, marker_key, meta_key, status_key
from materializer.contract.status import MapReport
from materializer.contract.watermark import Watermark
from materializer.testing import closed_port, free_port
from materializer.v1 import common_pb2
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.health import RedisHealth
from query_service.interceptors import INTERNAL_DETAILS
from tests.helpers.query_redis import make_config, map_doc, query_service_command, run

ENTITY = b'{"id":"u1","name":"Ann"}'
DEADLINE = 10.0


def get(config: AppConfig, map_name: str, key: str) -> pb.GetResponse:
    async def body(channel: grpc.aio.Channel) -> pb.GetResponse:
        stub = pb_grpc.MapServiceStub(channel)
        return await stub.Get(pb.GetRequest(map=map_name, key=key), timeout=DEADLINE)

    return run(config, body)


def get_error(config: AppConfig, map_name: str, key: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        get(config, map_name, key)
    return info.value


def new_map_name() -> str:
    return f"qs-{uuid.uuid4().hex[:12]}"


@pytest.fixture()
def map_name(redis_client: redis.Redis) -> Iterator[str]:
    """A map no other test uses; every key under it is deleted afterwards."""
    name = new_map_name()
    yield name
    keys = list(redis_client.scan_iter(match=f"{name}:*"))
    if keys:
        redis_client.delete(*keys)


def write_watermark(client: redis.Redis, map_name: str, watermark: Watermark) -> None:
    client.hset(meta_key(map_name), mapping=watermark.to_hash())


def test_get_returns_entity_and_watermark(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    redis_client.set(entity_key(map_name, "u1"), ENTITY)
    write_watermark(
        redis_client,
        map_name,
        Watermark(
            batch_id=7,
            offsets={"users-b": {1: 5, 0: 42}, "users-a": {0: 3}},
            updated_at_ms=1_700_000_000_123,
        ),
    )

    response = get(make_config(redis_url, map_name), map_name, "u1")

    assert response.found
    assert response.entity == ENTITY
    assert response.HasField("watermark")
    wm = response.watermark
    assert wm.batch_id == 7
    assert [(o.topic, o.partition, o.offset) for o in wm.offsets] == [
        ("users-a", 0, 3),
        ("users-b", 0, 42),
        ("users-b", 1, 5),
    ]
    assert wm.HasField("updated_at")
    assert wm.updated_at.ToMilliseconds() == 1_700_000_000_123


def test_a_lookup_that_waited_for_offsets_carries_a_watermark_that_covers_them(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    """Lookups share a recent watermark; one that waited for offsets answers with the
    watermark it waited for, never an older shared one."""
    redis_client.set(entity_key(map_name, "u1"), ENTITY)
    topic = f"{map_name}-events"
    write_watermark(redis_client, map_name, Watermark(1, {topic: {0: 5}}, 1))

    async def body(channel: grpc.aio.Channel) -> tuple[pb.GetResponse, pb.GetResponse]:
        stub = pb_grpc.MapServiceStub(channel)
        first = await stub.Get(pb.GetRequest(map=map_name, key="u1"), timeout=DEADLINE)
        write_watermark(redis_client, map_name, Watermark(2, {topic: {0: 10}}, 2))
        wanted = common_pb2.Freshness(
            min_offsets=[common_pb2.PartitionOffset(topic=topic, partition=0, offset=10)]
        )
        second = await stub.Get(
            pb.GetRequest(map=map_name, key="u1", freshness=wanted), timeout=DEADLINE
        )
        return first, second

    first, second = run(make_config(redis_url, map_name), body)
    assert first.watermark.batch_id == 1
    assert second.watermark.batch_id == 2
    assert [(o.partition, o.offset) for o in second.watermark.offsets] == [(0, 10)]


def test_missing_key_is_not_found_but_carries_the_watermark(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    redis_client.set(entity_key(map_name, "u1"), ENTITY)
    write_watermark(redis_client, map_name, Watermark(batch_id=3, offsets={"t": {0: 10}}))

    response = get(make_config(redis_url, map_name), map_name, "nobody")

    assert not response.found
    assert response.entity == b""
    assert response.watermark.batch_id == 3
    assert [(o.topic, o.partition, o.offset) for o in response.watermark.offsets] == [("t", 0, 10)]
    # updated_at_ms 0 means "not recorded": left unset rather than 1970.
    assert not response.watermark.HasField("updated_at")


def test_map_without_a_batch_has_no_watermark(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    redis_client.set(entity_key(map_name, "u1"), ENTITY)

    response = get(make_config(redis_url, map_name), map_name, "u1")

    assert response.found
    assert response.entity == ENTITY
    assert not response.HasField("watermark")


def test_unknown_map_is_not_found_naming_the_map(redis_url: str, map_name: str) -> None:
    other = new_map_name()

    error = get_error(make_config(redis_url, map_name), other, "u1")

    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert other in error.details()
    assert map_name in error.details()  # the known maps are listed


@pytest.mark.parametrize(
    ("key", "mentions"),
    [
        ("", "empty"),
        ("k" * 4097, "4097 bytes"),
        ("é" * 2049, "4098 bytes"),  # 2049 characters, but the limit is in UTF-8 bytes
        ("__meta__", "reserved"),
    ],
    ids=["empty", "too-long", "too-long-utf8", "reserved"],
)
def test_bad_key_is_invalid_argument(
    redis_url: str, map_name: str, key: str, mentions: str
) -> None:
    error = get_error(make_config(redis_url, map_name), map_name, key)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "key" in error.details()
    assert mentions in error.details()


def test_key_of_exactly_the_limit_is_accepted(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    key = "k" * 4096
    redis_client.set(entity_key(map_name, key), ENTITY)

    response = get(make_config(redis_url, map_name), map_name, key)

    assert response.found
    assert response.entity == ENTITY


def test_oversized_request_is_resource_exhausted(redis_url: str, map_name: str) -> None:
    error = get_error(make_config(redis_url, map_name), map_name, "k" * (17 * 1024 * 1024))

    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_redis_down_is_unavailable(map_name: str) -> None:
    with closed_port() as port:
        error = get_error(make_config(f"redis://127.0.0.1:{port}/0", map_name), map_name, "u1")

    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "redis" in error.details()


def test_unexpected_failure_is_internal_without_leaking_it(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    # A watermark the layout cannot parse: a bug on the writer's side, not the caller's.
    redis_client.hset(meta_key(map_name), mapping={"batch_id": "not-a-number"})

    error = get_error(make_config(redis_url, map_name), map_name, "u1")

    assert error.code() == grpc.StatusCode.INTERNAL
    assert error.details() == INTERNAL_DETAILS


def test_health_reports_serving(redis_url: str, map_name: str) -> None:
    async def body(channel: grpc.aio.Channel) -> list[int]:
        stub = health_pb2_grpc.HealthStub(channel)
        statuses = []
        for service in ("", "materializer.v1.MapService"):
            reply = await stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE
            )
            statuses.append(reply.status)
        return statuses

    statuses = run(make_config(redis_url, map_name), body)

    assert statuses == [health_pb2.HealthCheckResponse.SERVING] * 2


def _health(config: AppConfig, *services: str) -> list[int]:
    async def body(channel: grpc.aio.Channel) -> list[int]:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest
        return [
            (await stub.Check(request(service=service), timeout=DEADLINE)).status
            for service in services
        ]

    return run(config, body)


def test_a_map_redis_lost_answers_unavailable_for_a_missing_key_never_not_found(
    redis_url: str, redis_client: redis.Redis, map_name: str
) -> None:
    config = make_config(redis_url, map_name)
    redis_client.set(entity_key(map_name, "u1"), b'{"id":"u1"}')
    # Its materializer reports on it, and its marker is gone: Redis lost its copy.
    redis_client.hset(status_key(map_name), mapping=MapReport(state="restoring").to_hash())

    error = get_error(config, map_name, "u2")
    found = get(config, map_name, "u1")
    health = _health(config, "", f"map/{map_name}")

    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert f"map {map_name}: Redis lost its copy" in (error.details() or "")
    assert found.found and found.entity == b'{"id":"u1"}'
    # The replica serves (other maps answer in full); the map says it is being restored.
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    assert health == [serving, not_serving]

    # Restored: the marker is back, a missing key is missing again.
    redis_client.set(marker_key(map_name), b"1")
    redis_client.hset(status_key(map_name), mapping=MapReport(state="running").to_hash())
    try:
        assert not get(config, map_name, "u2").found
        assert _health(config, f"map/{map_name}") == [serving]
    finally:
        redis_client.delete(marker_key(map_name))


def test_aborts_made_by_a_handler_pass_the_wrapper_untouched(redis_url: str, map_name: str) -> None:
    async def body(channel: grpc.aio.Channel) -> None:
        stub = health_pb2_grpc.HealthStub(channel)
        await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=DEADLINE)

    with pytest.raises(grpc.aio.AioRpcError) as info:
        run(make_config(redis_url, map_name), body)

    assert info.value.code() == grpc.StatusCode.NOT_FOUND  # the health servicer's own abort


def test_reflection_lists_the_map_service(redis_url: str, map_name: str) -> None:
    async def body(channel: grpc.aio.Channel) -> list[str]:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        call = stub.ServerReflectionInfo(iter([request]), timeout=DEADLINE)
        names = []
        async for reply in call:
            names.extend(s.name for s in reply.list_services_response.service)
        return names

    names = run(make_config(redis_url, map_name), body)

    assert "materializer.v1.MapService" in names
    assert "grpc.health.v1.Health" in names


# --- the command line: `query-service serve` as a real process ---------------------------


@pytest.mark.parametrize(
    ("event_loop", "stop"),
    [
        ("uvloop", "process-sigterm"),
        ("asyncio", "process-sigterm"),
        ("uvloop", "group-sigint"),
        ("asyncio", "group-sigterm"),
    ],
)
def test_cli_serve_answers_then_stops_gracefully_however_signalled(
    tmp_path: Path,
    redis_url: str,
    redis_client: redis.Redis,
    map_name: str,
    event_loop: str,
    stop: str,
) -> None:
    """A stop to the process (kill) or to its process group (a terminal's Ctrl-C,
    systemd's KillMode=control-group) ends it the same way: gracefully, exit 0."""
    redis_client.set(entity_key(map_name, "u1"), ENTITY)
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(
        yaml.safe_dump({"redis": {"url": redis_url}, "maps": {map_name: map_doc(map_name)}})
    )
    port, metrics_port, http_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATERIALIZER_")}
    proc = subprocess.Popen(
        [
            *query_service_command(),
            "serve",
            "-c",
            str(config_file),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--http-port",
            str(http_port),
            "--event-loop",
            event_loop,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # a group of its own, as a service manager gives it
    )
    try:

        async def lookup() -> pb.GetResponse:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await asyncio.wait_for(channel.channel_ready(), timeout=30)
                stub = pb_grpc.MapServiceStub(channel)
                return await stub.Get(pb.GetRequest(map=map_name, key="u1"), timeout=DEADLINE)

        response = asyncio.run(lookup())
        assert response.found
        assert response.entity == ENTITY
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert 'materializer_query_requests_total{code="OK",method="Get"} 1.0' in metrics
        assert 'materializer_query_request_seconds_count{method="Get"} 1.0' in metrics
        # The HTTP/JSON front of the same process, over the same store and counters.
        url = f"http://127.0.0.1:{http_port}/v1/maps/{map_name}/entities/u1"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert orjson.loads(r.read())["entity"] == orjson.loads(ENTITY)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            assert (
                'materializer_query_requests_total{code="OK",method="Get"} 2.0' in r.read().decode()
            )

        if stop == "process-sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT if stop == "group-sigint" else signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output.decode()
    assert b"Traceback" not in output, output.decode()
    # JSON logs, one object per line.
    logged = [orjson.loads(line) for line in output.decode().splitlines() if line.startswith("{")]
    messages = [entry["message"] for entry in logged]
    assert "query service stopped" in messages
    assert any(m.endswith(f"event loop: {event_loop})") for m in messages), messages
    assert all({"time", "level", "logger", "message"} <= entry.keys() for entry in logged)


def test_cli_bad_config_exits_2(tmp_path: Path) -> None:
    config_file = tmp_path / "maps.yaml"
    config_file.write_text("maps: {bad: {key: id}}\n")  # no source

    proc = subprocess.run(
        [*query_service_command(), "serve", "-c", str(config_file)],
        capture_output=True,
        timeout=60,
    )

    assert proc.returncode == 2
    assert b"maps.bad.source" in proc.stderr


def test_cli_serve_help() -> None:
    proc = subprocess.run(
        [*query_service_command(), "serve", "--help"], capture_output=True, timeout=60
    )

    assert proc.returncode == 0
    assert b"--config" in proc.stdout


def test_a_health_check_cancelled_at_any_step_of_a_refused_ping_ends() -> None:
    # A server's health check is cancelled when the server stops; a check that kept
    # running would keep its event loop from ever closing. Each step of a ping that a
    # closed port refuses is tried: the step where the refusal and the cancellation
    # meet is the one a cancellation can be lost in (Python 3.11's wait_for lost it).
    async def cancelled_after(steps: int, port: int) -> bool:
        # No retry, so the refusal comes at the same step each time.
        client = aioredis.Redis(port=port, retry=Retry(NoBackoff(), retries=0))
        health_check = RedisHealth(health.aio.HealthServicer(), client, [])
        try:
            task = asyncio.ensure_future(health_check.check())
            for _ in range(steps):
                await asyncio.sleep(0)
            if not task.cancel():
                return True  # the check had ended: nothing to cancel
            await asyncio.wait({task})
            return task.cancelled()
        finally:
            await client.aclose()

    async def main(port: int) -> list[int]:
        # The refusal comes by the selector, so the step it lands on varies: many rounds.
        return [n for _ in range(25) for n in range(40) if not await cancelled_after(n, port)]

    with closed_port() as port:
        lost = asyncio.run(main(port))

    assert lost == []


def test_a_health_loop_stopped_at_any_moment_of_an_answered_ping_ends(redis_url: str) -> None:
    # The loop pings again and again; its stop cancels it wherever it stands. A
    # cancellation that lands as a reply arrives is lost inside the client (Python 3.11's
    # wait_for, which redis-py uses for its socket timeout): the loop must still end, or
    # a server's stop would wait for it forever. Where a stop lands varies with the
    # selector's timing: many stops, a few microseconds apart.
    async def stops(wait: float) -> bool:
        client = aioredis.Redis.from_url(redis_url, socket_timeout=5)
        health_loop = RedisHealth(health.aio.HealthServicer(), client, [], interval=0.001)
        try:
            await health_loop.start()
            await asyncio.sleep(wait)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await health_loop.close()
            return not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        finally:
            await client.aclose()

    async def first_hung() -> int | None:
        for i in range(200):
            if not await stops((i % 20) * 0.0003):
                return i
        return None

    # Not asyncio.run: its teardown would wait for a loop that never ends.
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(first_hung()) is None
    finally:
        loop.close()
