"""The query-service benchmark's map and servers: loading the map into Redis, starting the
query service and the two baselines, and checking that each answers what Redis holds.

Apart from ``query.py`` so the script itself reads as the measurements it makes. The
spawned load generators import ``query.py`` again as their main module, and this module
with it; it imports nothing the script did not already, so they still start light.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import orjson
import redis
import yaml
from baselines import ECHO
from grpc_health.v1 import health_pb2, health_pb2_grpc
from load_generators import CALL_TIMEOUT, CHANNEL_OPTIONS

from materializer.contract.redis_layout import entity_key, meta_key
from materializer.contract.watermark import Watermark
from materializer.testing import RedisServer
from materializer.testing.process import ManagedProcess
from materializer.testing.waiting import wait_until
from materializer.v1 import enrich_service_pb2 as enrich_pb
from materializer.v1 import enrich_service_pb2_grpc as enrich_grpc
from materializer.v1 import map_service_pb2 as map_pb
from materializer.v1 import map_service_pb2_grpc as map_grpc
from query_service.event_loop import EventLoop

MAP = "bench"
TOPIC = "bench-events"
PARTITIONS = 4
APP_ID = "bench:query"
LOAD_CHUNK = 2000
"""SETs per pipelined round trip, as the materializer's Redis sink writes them."""

QUERY_SCRIPT = Path(__file__).resolve().with_name("query.py")
"""The script whose ``--serve-echo`` and ``--serve-bare-http`` modes run the baselines."""


def load_map(
    client: redis.Redis, n: int, event: Callable[..., tuple[bytes, bytes]]
) -> dict[str, Any]:
    """N entities under ``<map>:<key>`` (pipelined SETs, as the sink writes them), then
    the watermark of one batch in ``<map>:__meta__``."""
    rng = random.Random(42)
    started = time.perf_counter()
    size = 0
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        key, value = event(i, i, rng)
        pipe.set(entity_key(MAP, key.decode()), value)
        size += len(value)
        if (i + 1) % LOAD_CHUNK == 0:
            pipe.execute()
    pipe.execute()
    mark = Watermark(
        batch_id=0,
        offsets={TOPIC: {p: n // PARTITIONS for p in range(PARTITIONS)}},
        updated_at_ms=int(time.time() * 1000),
        app_id=APP_ID,
    )
    client.hset(meta_key(MAP), mapping=dict[Any, Any](mark.to_hash()))
    seconds = time.perf_counter() - started
    return {
        "entities": n,
        "seconds": round(seconds, 2),
        "entities_per_s": round(n / seconds),
        "avg_entity_bytes": round(size / n),
    }


def key_of(i: int) -> str:
    """The key ``harness.event`` gives entity ``i``."""
    return f"user-{i:06d}"


def write_config(
    path: Path, redis_url: str, schema: str, near_cache_entries: int | None = None
) -> None:
    """The query service's YAML: Redis and the one map, its near cache off (the default)
    unless ``near_cache_entries`` is given."""
    doc: dict[str, Any] = {
        "redis": {"url": redis_url},
        "maps": {
            MAP: {
                "source": {"topics": [TOPIC], "format": "json", "schema": schema},
                "key": "id",
            }
        },
    }
    if near_cache_entries is not None:
        doc["query"] = {"near_cache": {MAP: {"max_entries": near_cache_entries}}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def start_query_service(
    work: Path, config: Path, port: int, http_port: int, event_loop: EventLoop
) -> ManagedProcess:
    """``query-service serve`` of this environment, in its own session, ready to serve."""
    exe = Path(sys.executable).parent / "query-service"
    args = [str(exe), "serve", "-c", str(config), "--host", "127.0.0.1", "--port", str(port)]
    args += ["--metrics-port", "0", "--http-port", str(http_port), "--log-level", "WARNING"]
    args += ["--event-loop", event_loop.value]
    proc = ManagedProcess(args, work / "query-service.log")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)

            def serving() -> bool:
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

            wait_until("query-service", serving, 60, proc.alive, retry_errors=True)
    except Exception as exc:
        proc.stop()
        raise RuntimeError(f"query-service did not start: {exc}\n{proc.tail()}") from exc
    return proc


def start_echo_server(
    work: Path, port: int, response_bytes: int, event_loop: EventLoop
) -> ManagedProcess:
    """``query.py``'s ``--serve-echo`` mode, in its own session, ready to answer."""
    args = [sys.executable, str(QUERY_SCRIPT), "--serve-echo", str(port)]
    args += ["--echo-response-bytes", str(response_bytes), "--event-loop", event_loop.value]
    proc = ManagedProcess(args, work / "echo-server.log")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary(ECHO)
            wait_until(
                "echo server", lambda: bool(echo(b"", timeout=1)), 60, proc.alive, retry_errors=True
            )
    except Exception as exc:
        proc.stop()
        raise RuntimeError(f"echo server did not start: {exc}\n{proc.tail()}") from exc
    return proc


def start_bare_http(
    work: Path, port: int, body_bytes: int, event_loop: EventLoop
) -> ManagedProcess:
    """``query.py``'s ``--serve-bare-http`` mode, in its own session, ready to answer."""
    import urllib.request

    args = [sys.executable, str(QUERY_SCRIPT), "--serve-bare-http", str(port)]
    args += ["--bare-http-bytes", str(body_bytes), "--event-loop", event_loop.value]
    proc = ManagedProcess(args, work / "bare-http.log")
    url = f"http://127.0.0.1:{port}/v1/maps/m/entities/k"

    def answers() -> bool:
        with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - a local http URL
            return bool(r.status == 200)

    try:
        wait_until("bare HTTP server", answers, 60, proc.alive, retry_errors=True)
    except Exception as exc:
        proc.stop()
        raise RuntimeError(f"bare HTTP server did not start: {exc}\n{proc.tail()}") from exc
    return proc


def http_request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()


def join_spec() -> enrich_pb.JoinSpec:
    """One lookup, left join: the event's ``user_id`` in the map, added as ``user``."""
    return enrich_pb.JoinSpec(
        lookups=[
            enrich_pb.Lookup(map=MAP, key_field="user_id", alias="user", join=enrich_pb.Lookup.LEFT)
        ]
    )


def enrich_request(events: list[bytes], request_id: str, spec: bool) -> enrich_pb.EnrichRequest:
    request = enrich_pb.EnrichRequest(events=events, request_id=request_id)
    if spec:
        request.spec.CopyFrom(join_spec())
    return request


def order_event(i: int, entities: int, rng: random.Random) -> bytes:
    """A small order event naming a random entity of the map (~90 bytes of JSON)."""
    user = key_of(rng.randrange(entities))
    return (
        f'{{"order_id":"o-{i:09d}","user_id":"{user}","amount":{rng.randrange(100, 99999) / 100},'
        f'"sku":"sku-{rng.randrange(10_000):05d}","qty":{1 + i % 5}}}'
    ).encode()


def check_service(
    target: str, client: redis.Redis, entities: int, batch_keys: int
) -> dict[str, int]:
    """Each measured call answers what Redis holds (typed stubs, once, before measuring);
    the wire sizes the echo server has to match."""
    rng = random.Random(1)
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        maps = map_grpc.MapServiceStub(channel)  # type: ignore[no-untyped-call]
        sizes = []
        for i in rng.sample(range(entities), 200):
            response = maps.Get(map_pb.GetRequest(map=MAP, key=key_of(i)), timeout=CALL_TIMEOUT)
            if not response.found or response.entity != client.get(entity_key(MAP, key_of(i))):
                raise RuntimeError(f"Get {key_of(i)} does not answer the stored entity")
            if len(response.watermark.offsets) != PARTITIONS:
                raise RuntimeError(f"Get {key_of(i)}: watermark {response.watermark}")
            sizes.append(response.ByteSize())
        keys = [key_of(i) for i in rng.sample(range(entities), batch_keys)]
        batch = maps.BatchGet(map_pb.BatchGetRequest(map=MAP, keys=keys), timeout=CALL_TIMEOUT)
        if [e.key for e in batch.entries if e.found] != keys:
            raise RuntimeError("BatchGet does not find every key")
        enrich = enrich_grpc.EnrichServiceStub(channel)  # type: ignore[no-untyped-call]
        events = [order_event(i, entities, rng) for i in range(10)]
        answers = list(enrich.Enrich(iter([enrich_request(events, "check", True)]), timeout=30))
        joined = [e.event for a in answers for e in a.events]
        if len(joined) != len(events) or any(b'"user":{"id":"user-' not in e for e in joined):
            raise RuntimeError(f"Enrich did not join every event: {answers}")
    request = map_pb.GetRequest(map=MAP, key=key_of(0))
    return {"request_bytes": request.ByteSize(), "response_bytes": round(statistics.mean(sizes))}


def http_body_bytes(port: int) -> int:
    """The HTTP front's answer size for an entity, and that it answers the stored one."""
    import urllib.request

    url = f"http://127.0.0.1:{port}/v1/maps/{MAP}/entities/{key_of(0)}"
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - a local http URL
        body = r.read()
    if not orjson.loads(body)["found"]:
        raise RuntimeError(f"HTTP GET {url} did not find the entity: {body[:200]!r}")
    return len(body)


def redis_pid(client: redis.Redis, own: bool) -> list[int]:
    """Our redis-server's pid, for its CPU; none for a Redis started elsewhere, which
    may not even run on this machine."""
    return [int(client.info("server")["process_id"])] if own else []


@contextlib.contextmanager
def redis_service() -> Iterator[tuple[str, bool]]:
    """(Redis URL, whether it is our own): ``REDIS_URL`` or a fresh ``redis-server``."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url, False
    else:
        with RedisServer() as server:
            yield server.url, True


def delete_map(client: redis.Redis) -> None:
    """Remove the benchmark's map from a Redis that is not ours."""
    batch = []
    for key in client.scan_iter(match=f"{MAP}:*", count=10_000):
        batch.append(key)
        if len(batch) >= 10_000:
            client.unlink(*batch)
            batch.clear()
    if batch:
        client.unlink(*batch)
