"""Spike: what a lookup's Redis read costs a grpc.aio server, per candidate client.

One ``redis-server`` holding one ~300-byte entity; per candidate, a bare grpc.aio
server in its own process whose one raw-bytes method answers with the entity read
through that candidate, driven by the closed-loop generators of ``bench/query.py``
(``load_generators``). The first server reads nothing (the echo): each line's
``ratio_to_echo`` is what the read leaves of the bare server's calls/s.

  redis_py            ``await client.get(key)`` on redis-py's asyncio client (its pool);
  redis_py_coalesced  the lookups of one event-loop turn gathered (``stores.coalesce``)
                      into one redis-py pipeline, the query service's read before
                      ``stores.lookup_connection``; ``mean_keys_per_read`` says how
                      many calls a gathering held;
  pipelined           ``stores.lookup_connection``: the command written at once on one
                      connection, its reply matched by order.

    .venv/bin/python bench/lookup_spike.py [--seconds S] [--warmup W]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import redis
from cpu_window import loadavg
from load_generators import closed_line, run_phase, unary_loads

from materializer.testing import RedisServer, free_port
from materializer.testing.waiting import wait_until
from query_service.stores.base import BatchLookup
from query_service.stores.coalesce import Coalescer
from query_service.stores.lookup_connection import LookupConnection

SERVICE = "materializer.bench.Lookup"
METHOD = f"/{SERVICE}/Get"
KEY = "spike:entity"
CANDIDATES = ("echo", "redis_py", "redis_py_coalesced", "pipelined")


def serve(candidate: str, port: int, redis_url: str, stats: Any) -> None:
    """A bare grpc.aio server whose one method answers the entity as ``candidate`` reads it."""

    async def run() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(redis_url, socket_timeout=5.0)
        read = await reader(candidate, client, stats)

        async def get(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await read()

        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Get": grpc.unary_unary_rpc_method_handler(get)}
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        stopping = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
        await stopping.wait()
        await server.stop(0)

    asyncio.run(run())


async def reader(candidate: str, client: Any, stats: Any) -> Callable[[], Awaitable[bytes]]:
    """The entity read of ``candidate``, as a coroutine function of no arguments."""
    entity: bytes = await client.get(KEY)
    if candidate == "echo":

        async def echo() -> bytes:
            return entity

        return echo
    if candidate == "redis_py":

        async def plain() -> bytes:
            return await client.get(KEY)  # type: ignore[no-any-return]

        return plain
    if candidate == "redis_py_coalesced":

        async def read_many(_: str, keys: Sequence[str]) -> BatchLookup:
            stats[0] += 1
            stats[1] += len(keys)
            async with client.pipeline(transaction=False) as pipe:
                pipe.mget(list(keys))
                (values,) = await pipe.execute()
            return BatchLookup(entities=values, watermark=None)

        coalescer = Coalescer(read_many)

        async def coalesced() -> bytes:
            return (await coalescer.get("spike", KEY)).entity or b""

        return coalesced
    pool = client.connection_pool
    connection = LookupConnection(pool, "the spike's redis", 5.0)

    async def pipelined() -> bytes:
        return await connection.execute("GET", KEY)  # type: ignore[no-any-return]

    return pipelined


def answering(port: int) -> Callable[[], bool]:
    """Whether the server on ``port`` answers a call."""

    def check() -> bool:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            return bool(channel.unary_unary(METHOD)(b"", timeout=1))

    return check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--procs", type=int, default=2, help="load generator processes")
    parser.add_argument("--concurrency", type=int, default=32, help="calls in flight per process")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    with RedisServer() as server:
        redis.Redis.from_url(server.url).set(KEY, b"x" * 300)
        print(json.dumps({"name": "setup", "cpus": os.cpu_count(), "loadavg_1m": loadavg()}))
        echo_calls = 0
        for candidate in CANDIDATES:
            port = free_port()
            stats = ctx.Array("q", 2)
            proc = ctx.Process(target=serve, args=(candidate, port, server.url, stats))
            proc.start()
            try:
                wait_until(candidate, answering(port), 30, proc.is_alive, retry_errors=True)
                requests = [[b""] for _ in range(args.procs)]
                loads = unary_loads(f"127.0.0.1:{port}", METHOD, requests, args.concurrency)
                total, usage = run_phase(loads, args.warmup, args.seconds, {"server": [proc.pid]})
                line: dict[str, Any] = {"name": candidate, "units": "calls/s"}
                line.update(closed_line(total, args.seconds))
                line.update(usage)
                echo_calls = echo_calls or line["calls_per_s"]
                line["ratio_to_echo"] = round(line["calls_per_s"] / echo_calls, 3)
                if stats[0]:
                    line["mean_keys_per_read"] = round(stats[1] / stats[0], 2)
                print(json.dumps(line), flush=True)
            finally:
                proc.terminate()
                proc.join(10)
    sys.exit(0)


if __name__ == "__main__":
    main()
