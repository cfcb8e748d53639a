"""Spike: where a gRPC ``Get`` costs more than the bare echo it rides on.

One grpc.aio server per variant, each in its own process on uvloop, driven in
turn by ``bench/query.py``'s closed-loop generators (two processes, 32 calls in
flight each) with the same ``GetRequest`` bytes, for several rounds so a drift
of the machine shows:

  echo          answers a fixed GetResponse-sized payload (``bench/query.py``'s baseline);
  suspend       the same, after the handler suspends once on a future the loop
                resolves (what any awaited I/O costs grpc.aio, without the I/O);
  get           one ``GET`` down the lookups' pipelined connection, raw bytes answered;
  get_protobuf  the same with the request parsed and a ``GetResponse`` built;
  wrapped       that handler wrapped by the service's ``MethodCall`` (metrics, error
                mapping), as ``query-service serve`` wraps each method;
  servicer      the service's own ``MapServicer.Get`` and store, wrapped the same way,
                alone on this bare server (the service's other parts left out);
  service       ``MapService/Get`` of ``query-service serve`` (watermark, checks,
                metrics, the whole lookup).

Each line: calls/s, the server's CPU per call, and the ratio to the echo of
its round.

    .venv/bin/python bench/get_cost_spike.py [--rounds N] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import grpc
import redis
from load_generators import closed_line, run_phase, unary_loads

from materializer.testing import RedisServer, free_port
from materializer.v1 import map_service_pb2 as map_pb
from query_service.event_loop import EventLoop, run

VARIANTS = ("echo", "suspend", "get", "get_protobuf", "wrapped", "servicer", "service")
SPIKE_SERVICE = "materializer.bench.GetCost"
METHOD = f"/{SPIKE_SERVICE}/Get"


def serve(port: int, variant: str, redis_url: str) -> None:
    """One variant's server, until SIGTERM."""
    import redis.asyncio as aioredis

    from query_service.interceptors import MethodCall
    from query_service.stores.lookup_connection import LookupConnection

    payload = b"\x00" * 310

    async def main() -> None:
        loop = asyncio.get_running_loop()
        lookups = LookupConnection(aioredis.ConnectionPool.from_url(redis_url), "spike", 5.0)
        await lookups.execute("PING")

        async def raw(request: bytes, _: Any) -> bytes:
            if variant == "suspend":
                done = loop.create_future()
                loop.call_soon(done.set_result, None)
                await done
            elif variant == "get":
                await lookups.execute("GET", "bench:k1")
            return payload

        async def parsed(request: map_pb.GetRequest, _: Any) -> map_pb.GetResponse:
            value = await lookups.execute("GET", f"{request.map}:{request.key}")
            return map_pb.GetResponse(found=value is not None, entity=value or b"")

        if variant == "servicer":
            handler = grpc.unary_unary_rpc_method_handler(
                MethodCall(METHOD, None, lambda *_: ()).wrap(
                    await servicer_get(redis_url), streaming_requests=False
                ),
                request_deserializer=map_pb.GetRequest.FromString,
                response_serializer=map_pb.GetResponse.SerializeToString,
            )
        elif variant in ("get_protobuf", "wrapped"):
            behavior = parsed
            if variant == "wrapped":
                behavior = MethodCall(METHOD, None, lambda *_: ()).wrap(
                    parsed, streaming_requests=False
                )
            handler = grpc.unary_unary_rpc_method_handler(
                behavior,
                request_deserializer=map_pb.GetRequest.FromString,
                response_serializer=map_pb.GetResponse.SerializeToString,
            )
        else:
            handler = grpc.unary_unary_rpc_method_handler(raw)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SPIKE_SERVICE, {"Get": handler}),)
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        stopping = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stopping.set)
        await stopping.wait()
        await server.stop(0)
        lookups.close()

    run(main(), EventLoop.UVLOOP)


async def servicer_get(redis_url: str) -> Any:
    """``MapServicer.Get`` over the service's own store, as ``query-service serve`` builds
    it for the benchmark's map."""
    import query
    from harness import SCHEMA

    from materializer.config import load_config
    from query_service.freshness import FreshnessGate
    from query_service.near_cache import NearCaches
    from query_service.services.map_service import MapServicer
    from query_service.services.table_reads import TableReads
    from query_service.stores.redis import RedisMapStore

    config_file = Path(tempfile.mkdtemp(prefix="materializer-get-cost-")) / "query.yaml"
    query.write_config(config_file, redis_url, SCHEMA)
    config = load_config(config_file)
    store = RedisMapStore.from_config(config.redis)
    gate = FreshnessGate(store, {name: m.source.topics for name, m in config.maps.items()})
    near_caches = NearCaches(store, config.query.near_cache)
    await near_caches.start()
    servicer = MapServicer(config, store, gate, TableReads(config, store.generation), near_caches)
    return servicer.Get


def measure(
    variant: str, redis_url: str, pools: list[list[bytes]], seconds: float
) -> dict[str, Any]:
    import query
    from harness import SCHEMA

    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="materializer-get-cost-"))
    if variant == "service":
        config = work / "query.yaml"
        query.write_config(config, redis_url, SCHEMA)
        process = query.start_query_service(work, config, port, 0, EventLoop.UVLOOP)
        pid, method, stop = process.proc.pid, query.GET, process.stop
    else:
        args = [sys.executable, __file__, "--serve", str(port), variant, redis_url]
        child = subprocess.Popen(args)  # noqa: S603 - this script, with our arguments
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)

        def stop() -> None:
            child.send_signal(signal.SIGTERM)
            child.wait(30)

        pid, method = child.pid, METHOD
    try:
        loads = unary_loads(f"127.0.0.1:{port}", method, pools, 32)
        total, usage = run_phase(loads, 3, seconds, {"server": [pid], "redis": []})
    finally:
        stop()
    line = closed_line(total, seconds)
    return {
        "calls_per_s": line["calls_per_s"],
        "server_us_per_call": round(usage["server_cpu_cores"] / line["calls_per_s"] * 1e6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--serve", nargs=3, metavar=("PORT", "VARIANT", "REDIS_URL"))
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1], args.serve[2])
        return
    import query
    from harness import event

    with RedisServer() as server:
        query.load_map(redis.Redis.from_url(server.url), 100_000, event)
        rng = random.Random(3)
        pools = [
            [
                map_pb.GetRequest(
                    map=query.MAP, key=query.key_of(rng.randrange(100_000))
                ).SerializeToString()
                for _ in range(5_000)
            ]
            for _ in range(2)
        ]
        for round_no in range(1, args.rounds + 1):
            echo = 0
            for variant in VARIANTS:
                figures = measure(variant, server.url, pools, args.seconds)
                echo = echo or figures["calls_per_s"]
                line = {"name": f"get_cost_{variant}", "round": round_no, **figures}
                line["ratio_to_echo"] = round(figures["calls_per_s"] / echo, 3)
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
