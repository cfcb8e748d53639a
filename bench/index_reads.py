"""Reads by value through a map's index: an indexed ``Query`` against ``Get`` on one map.

All in one run, on one ``redis-server`` (no Kafka, no Spark):

  load         N entities of one map written by the fold's own Redis Function, with an
               index on ``city`` declared first (``--cities`` values, so a value holds
               N / cities entities), and a Delta table of one row, whose schema types
               the query's rows;
  get          the baseline: ``MapService/Get`` of a random key, one call after the
               other over one gRPC channel to ``query-service serve`` (its own process):
               p50/p99 of each call;
  indexed_query  ``MapService/Query`` with ``where city = '<random value>'`` (about
               N / cities rows, one page) over the same channel: p50/p99 per call,
               rows per answer, and that every answer came through the index.

Both are measured cold (the first ``--cold`` calls after the service started) and warm
(the next ``--calls``). The goal: an indexed Query returning 100 rows out of 1M entities
answers within 10 ms at p99.

    .venv/bin/python bench/index_reads.py [--entities 1000000] [--cities 10000] [--calls 2000]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import orjson
import pyarrow as pa
import redis
import yaml
from deltalake import write_deltalake
from harness import emit
from query_services import redis_service, start_query_service

from materializer.clients.redis import client_for
from materializer.config import IndexConfig, RedisConfig
from materializer.contract.markers import mark_whole
from materializer.contract.redis_layout import entity_key, marker_key, state_key
from materializer.redis.functions import FIXED_ARGS, LATEST, load_library
from materializer.redis.indexes import build, declare
from materializer.testing import free_port
from materializer.v1 import map_service_pb2 as map_pb
from materializer.v1 import map_service_pb2_grpc as map_grpc
from query_service.event_loop import EventLoop

MAP = "bench_ix"
SCHEMA = "id STRING, city STRING, total DOUBLE, name STRING"


def load(client: redis.Redis, config: RedisConfig, entities: int, cities: int) -> float:
    """The map's entities through the fold's function, its index kept as they go: seconds."""
    load_library(config)
    mark_whole(client_for(config), MAP)
    for field in declare(client_for(config), MAP, [IndexConfig(field="city")]):
        build(client_for(config), MAP, field, expiring=False)
    started = time.perf_counter()
    fixed: list[Any] = ["", "", "0", "100", str(len(MAP) + 1), marker_key(MAP), "86400000"]
    fixed += ["", "", ""]
    assert len(fixed) == FIXED_ARGS
    rng = random.Random(1)
    for start in range(0, entities, 1000):
        args = list(fixed)
        for i in range(start, min(start + 1000, entities)):
            key = f"k{i:07d}"
            doc = {"id": key, "city": f"c{i % cities}", "total": rng.random() * 1000, "name": "n"}
            args += [entity_key(MAP, key), state_key(MAP, key), "0001", orjson.dumps(doc)]
        client.execute_command("FCALL", LATEST, 1, args[FIXED_ARGS], *args)  # type: ignore[no-untyped-call]
    return time.perf_counter() - started


def table(root: Path) -> None:
    """One row, for the schema the query's rows are typed by."""
    row = {"_key": ["k0"], "id": ["k0"], "city": ["c0"], "total": [1.0], "name": ["n"]}
    write_deltalake(str(root / MAP), pa.table(row))


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(pct: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * pct))] * 1000, 2)

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": at(1.0)}


def measure(
    stub: Any, calls: int, entities: int, cities: int, rng: random.Random
) -> dict[str, Any]:
    gets: list[float] = []
    queries: list[float] = []
    rows: list[int] = []
    sources: set[int] = set()
    for _ in range(calls):
        key = f"k{rng.randrange(entities):07d}"
        started = time.perf_counter()
        stub.Get(map_pb.GetRequest(map=MAP, key=key), timeout=10)
        gets.append(time.perf_counter() - started)
        where = f"city = 'c{rng.randrange(cities)}'"
        started = time.perf_counter()
        pages = list(stub.Query(map_pb.QueryRequest(map=MAP, where=where), timeout=10))
        queries.append(time.perf_counter() - started)
        rows.append(sum(len(p.rows) for p in pages))
        sources |= {p.source for p in pages}
    return {"gets": gets, "queries": queries, "rows": rows, "sources": sources}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--cities", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--cold", type=int, default=50)
    args = parser.parse_args()
    with redis_service() as (url, _own), tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = RedisConfig(url=url)
        client = redis.Redis.from_url(url)
        seconds = load(client, config, args.entities, args.cities)
        emit(name="load", entities=args.entities, cities=args.cities, seconds=round(seconds, 1))
        table(work / "warehouse")
        doc = {
            "redis": {"url": url},
            "delta": {"root": str(work / "warehouse")},
            "maps": {
                MAP: {
                    "source": {"topics": ["t"], "format": "json", "schema": SCHEMA},
                    "key": "id",
                    "indexes": ["city"],
                }
            },
        }
        path = work / "config.yaml"
        path.write_text(yaml.safe_dump(doc))
        port = free_port()
        proc = start_query_service(work, path, port, 0, EventLoop.UVLOOP)
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = map_grpc.MapServiceStub(channel)  # type: ignore[no-untyped-call]
                rng = random.Random(2)
                for phase, calls in (("cold", args.cold), ("warm", args.calls)):
                    got = measure(stub, calls, args.entities, args.cities, rng)
                    index = got["sources"] == {map_pb.QueryResponse.REDIS_INDEX}
                    emit(name=f"get_{phase}", calls=calls, **percentiles(got["gets"]))
                    query = percentiles(got["queries"])
                    emit(
                        name=f"indexed_query_{phase}",
                        calls=calls,
                        entities=args.entities,
                        rows_mean=round(sum(got["rows"]) / calls, 1),
                        through_index=index,
                        **query,
                        over_get_p99=round(query["p99_ms"] / percentiles(got["gets"])["p99_ms"], 2),
                        goal_p99_ms=10,
                        goal_met=index and query["p99_ms"] <= 10,
                    )
        finally:
            proc.stop()


if __name__ == "__main__":
    main()
