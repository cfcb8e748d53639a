"""Query service benchmark: Get, BatchGet and Enrich against a bare gRPC echo server.

All in one run, on one ``redis-server`` (no Kafka, no Spark):

  load         N ~200-byte JSON entities of one map and its watermark, written in
               the materializer's Redis layout (pipelined SETs, then the meta hash);
  echo_max     the baseline: a bare grpc.aio server in its own process whose one
               unary method answers raw bytes the size of a GetResponse, driven by
               closed-loop load generators: the unary calls/s Python gRPC carries here;
  get_max      the same generators, same requests, against ``MapService/Get`` of the
               query service (its own process, started with ``query-service serve``);
               ``get_over_echo`` is the ratio of the two;
  *_latency    open loop at one offered rate for both servers: p50/p90/p99 measured
               from each call's scheduled start, so a server that falls behind shows
               its queue instead of slowing the generator down (no coordinated omission);
  get_near_cache  Get with the map's near cache on (``query.near_cache``, off by default),
               each generator asking for the same 1,000 keys over and over, so nearly
               every call is a hit; ``get_near_cache_over_echo`` is informational, not a
               goal (the goal's line is Get as configured by default);
  http_*       the same over HTTP: a bare aiohttp server answering the entity route with a
               body of the front's answer size, then ``GET /v1/maps/{map}/entities/{key}``
               of the query service's HTTP front, with the same raw HTTP/1.1 keep-alive
               generators; ``http_get_over_bare`` is the ratio;
  batch_get    BatchGet of 100 random keys per call, closed loop: keys/s;
  enrich       ONE bidirectional Enrich stream, requests of 500 events each joined
               with one entity of the map (left join), several requests in flight: events/s.

The load generators (``load_generators.py``) are separate processes (spawned, each with
its own event loop and channel) that send pre-serialized requests and take responses as raw
bytes, with the same code for echo and Get, so the client's cost per call is the
same on both sides and the ratio compares the servers. Every measured line also
reports the CPU that the server, the generators and Redis used over its window
(in cores) and how busy the whole machine was: on a small machine the generators
compete with the server for the same cores, and other work may too.

    .venv/bin/python bench/query.py [--entities N] [--seconds S] [--warmup W] [--procs P]
                                    [--event-loop uvloop|asyncio]

``REDIS_URL`` points it at a running Redis instead of starting one; the
benchmark's map is written there and its keys deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import grpc
import redis
from baselines import ECHO, serve_bare_http, serve_echo
from cpu_window import loadavg
from load_generators import (
    Load,
    closed_line,
    latency_line,
    open_loads,
    run_phase,
    unary_loads,
)
from query_services import (
    MAP,
    check_service,
    delete_map,
    enrich_request,
    http_body_bytes,
    http_request,
    key_of,
    load_map,
    order_event,
    redis_pid,
    redis_service,
    start_bare_http,
    start_echo_server,
    start_query_service,
    write_config,
)

from materializer.testing import free_port
from materializer.v1 import map_service_pb2 as map_pb
from query_service.event_loop import EventLoop

# Spawned generator processes import this module again as their main module; the
# harness (and its Spark imports) is imported in main() only, so they start light.

GET = "/materializer.v1.MapService/Get"
BATCH_GET = "/materializer.v1.MapService/BatchGet"
ENRICH = "/materializer.v1.EnrichService/Enrich"

TARGET_GET_OVER_ECHO = 0.8
HOT_KEYS = 1000
"""Keys per generator in the near-cache line."""
TARGET_HTTP_GET_OVER_BARE = 0.8
TARGET_BATCH_KEYS_PER_S = 150_000
TARGET_ENRICH_EVENTS_PER_S = 80_000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=10, help="each measurement")
    parser.add_argument("--warmup", type=float, default=3, help="before each measurement")
    parser.add_argument("--procs", type=int, default=2, help="unary load generator processes")
    parser.add_argument(
        "--event-loop",
        type=EventLoop,
        choices=list(EventLoop),
        default=EventLoop.UVLOOP,
        help="the loop of the query service and of both baselines",
    )
    parser.add_argument(
        "--concurrency", type=int, default=32, help="Get/echo calls in flight per process"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=1000,
        help="latency: calls/s offered (capped at half the slower max)",
    )
    parser.add_argument("--batch-keys", type=int, default=100, help="keys per BatchGet")
    parser.add_argument(
        "--batch-concurrency", type=int, default=8, help="BatchGets in flight per process"
    )
    parser.add_argument("--enrich-events", type=int, default=500, help="events per Enrich request")
    parser.add_argument(
        "--enrich-window", type=int, default=8, help="Enrich requests in flight on the stream"
    )
    parser.add_argument("--serve-echo", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--echo-response-bytes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--serve-bare-http", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--bare-http-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo is not None:
        serve_echo(args.serve_echo, args.echo_response_bytes, args.event_loop)
        return
    if args.serve_bare_http is not None:
        serve_bare_http(args.serve_bare_http, args.bare_http_bytes, args.event_loop)
        return
    run(args)


def run(args: argparse.Namespace) -> None:
    """The whole benchmark; every process it starts is stopped on the way out."""
    from harness import SCHEMA, emit, event  # here, not at the top: see the note there

    # SIGTERM ends the run like Ctrl-C does: through every ``finally``, so the servers
    # (in sessions of their own) and the generators are stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    seconds, warmup, procs = args.seconds, args.warmup, args.procs
    work = Path(tempfile.mkdtemp(prefix="materializer-bench-query-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        redis_url, own_redis = stack.enter_context(redis_service())
        client = redis.Redis.from_url(redis_url)
        stack.callback(client.close)
        if not own_redis:
            stack.callback(delete_map, client)
        emit(
            name="setup",
            python=sys.version.split()[0],
            grpcio=grpc.__version__,
            cpus=os.cpu_count(),
            loadavg_1m=loadavg(),
            entities=args.entities,
            seconds=seconds,
            warmup_s=warmup,
            generator_procs=procs,
            event_loop=args.event_loop.value,
        )
        emit(name="load", **load_map(client, args.entities, event))

        config = work / "query.yaml"
        write_config(config, redis_url, SCHEMA)
        service_port, http_port = free_port(), free_port()
        service = start_query_service(work, config, service_port, http_port, args.event_loop)
        stack.callback(service.stop)
        target = f"127.0.0.1:{service_port}"
        sizes = check_service(target, client, args.entities, args.batch_keys)
        echo_port = free_port()
        echo = start_echo_server(work, echo_port, sizes["response_bytes"], args.event_loop)
        stack.callback(echo.stop)
        echo_target = f"127.0.0.1:{echo_port}"
        on_redis = redis_pid(client, own_redis)
        watch_echo = {"server": [echo.proc.pid], "redis": on_redis}
        watch_service = {"server": [service.proc.pid], "redis": on_redis}

        rng = random.Random(7)
        get_pools = [
            [
                map_pb.GetRequest(
                    map=MAP, key=key_of(rng.randrange(args.entities))
                ).SerializeToString()
                for _ in range(20_000)
            ]
            for _ in range(procs)
        ]

        # (1) closed loop: the most calls/s, echo first, then Get with the same generators.
        best: dict[str, int] = {}
        for name, server, method, watch in (
            ("echo", echo_target, ECHO, watch_echo),
            ("get", target, GET, watch_service),
        ):
            loads = unary_loads(server, method, get_pools, args.concurrency)
            total, usage = run_phase(loads, warmup, seconds, watch)
            line = closed_line(total, seconds)
            best[name] = line["calls_per_s"]
            emit(
                name=f"{name}_max",
                units="calls/s",
                loop="closed",
                in_flight=procs * args.concurrency,
                **line,
                **sizes,
                **usage,
                loadavg_1m=loadavg(),
            )
        emit(
            name="get_over_echo",
            ratio=round(best["get"] / best["echo"], 3),
            target_get_over_echo=TARGET_GET_OVER_ECHO,
        )

        # (1a) Get with the map's near cache on (off by default, so not the goal's line):
        # what it buys when the same keys are asked for again and again.
        hot_pools = [pool[:HOT_KEYS] for pool in get_pools]
        cached_config = work / "query-near-cache.yaml"
        write_config(cached_config, redis_url, SCHEMA, near_cache_entries=args.entities)
        cached_port = free_port()
        cached = start_query_service(work, cached_config, cached_port, 0, args.event_loop)
        try:
            loads = unary_loads(f"127.0.0.1:{cached_port}", GET, hot_pools, args.concurrency)
            total, usage = run_phase(
                loads, warmup, seconds, {"server": [cached.proc.pid], "redis": on_redis}
            )
        finally:
            cached.stop()
        line = closed_line(total, seconds)
        emit(
            name="get_near_cache_max",
            units="calls/s",
            loop="closed",
            in_flight=procs * args.concurrency,
            distinct_keys=len({k for pool in hot_pools for k in pool}),
            **line,
            **usage,
            loadavg_1m=loadavg(),
        )
        emit(
            name="get_near_cache_over_echo",
            ratio=round(line["calls_per_s"] / best["echo"], 3),
        )

        # (1b) the same over HTTP: the front's GET of an entity against a bare endpoint of
        # the same framework answering a body of the same size.
        http_pools = [
            [http_request(f"/v1/maps/{MAP}/entities/{key_of(rng.randrange(args.entities))}")
             for _ in range(20_000)]
            for _ in range(procs)
        ]  # fmt: skip
        body_bytes = http_body_bytes(http_port)
        bare_port = free_port()
        bare = start_bare_http(work, bare_port, body_bytes, args.event_loop)
        stack.callback(bare.stop)
        for name, port, watch in (
            ("http_bare", bare_port, {"server": [bare.proc.pid], "redis": on_redis}),
            ("http_get", http_port, watch_service),
        ):
            loads = [
                Load(f"127.0.0.1:{port}", "", "http", pool, in_flight=args.concurrency // 2)
                for pool in http_pools
            ]
            total, usage = run_phase(loads, warmup, seconds, watch)
            line = closed_line(total, seconds)
            best[name] = line["calls_per_s"]
            emit(
                name=f"{name}_max",
                units="requests/s",
                loop="closed",
                connections=procs * (args.concurrency // 2),
                body_bytes=body_bytes,
                **line,
                **usage,
                loadavg_1m=loadavg(),
            )
        bare.stop()
        emit(
            name="http_get_over_bare",
            ratio=round(best["http_get"] / best["http_bare"], 3),
            target_http_get_over_bare=TARGET_HTTP_GET_OVER_BARE,
        )

        # (2) open loop at one offered rate for both, well below either's maximum.
        rate = min(args.rate, 0.5 * min(best.values()))
        for name, server, method, watch in (
            ("echo", echo_target, ECHO, watch_echo),
            ("get", target, GET, watch_service),
        ):
            total, usage = run_phase(
                open_loads(server, method, get_pools, rate), warmup, seconds, watch
            )
            emit(
                name=f"{name}_latency",
                units="ms from scheduled start",
                loop="open",
                **latency_line(total, rate, seconds),
                **usage,
                loadavg_1m=loadavg(),
            )

        # (3) BatchGet of random keys, closed loop.
        batch_pools = [
            [
                map_pb.BatchGetRequest(
                    map=MAP,
                    keys=[key_of(i) for i in rng.sample(range(args.entities), args.batch_keys)],
                ).SerializeToString()
                for _ in range(500)
            ]
            for _ in range(procs)
        ]
        loads = unary_loads(target, BATCH_GET, batch_pools, args.batch_concurrency)
        total, usage = run_phase(loads, warmup, seconds, watch_service)
        line = closed_line(total, seconds)
        emit(
            name="batch_get",
            units="keys/s",
            loop="closed",
            keys_per_call=args.batch_keys,
            in_flight=procs * args.batch_concurrency,
            **line,
            keys_per_s=line["calls_per_s"] * args.batch_keys,
            target_keys_per_s=TARGET_BATCH_KEYS_PER_S,
            **usage,
            loadavg_1m=loadavg(),
        )

        # (4) Enrich over one bidirectional stream, requests pipelined.
        n = args.enrich_events
        requests = [
            enrich_request(
                [order_event(r * n + i, args.entities, rng) for i in range(n)], f"r{r}", spec=False
            ).SerializeToString()
            for r in range(40)
        ]
        first = enrich_request(
            [order_event(i, args.entities, rng) for i in range(n)], "first", spec=True
        ).SerializeToString()
        load = Load(target, ENRICH, "stream", requests, in_flight=args.enrich_window, first=first)
        total, usage = run_phase([load], warmup, seconds, watch_service)
        if total["errors"] or not total["calls"]:
            raise RuntimeError(f"Enrich failed: {total['first_error']}")
        emit(
            name="enrich",
            units="events/s",
            streams=1,
            events_per_request=n,
            requests_in_flight=args.enrich_window,
            requests=total["calls"],
            events_per_s=round(total["calls"] * n / seconds),
            target_events_per_s=TARGET_ENRICH_EVENTS_PER_S,
            **usage,
            loadavg_1m=loadavg(),
        )
        emit(name="done", loadavg_1m=loadavg())


if __name__ == "__main__":
    main()
