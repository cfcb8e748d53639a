"""Redis Cluster benchmark: the map store's writes and batch reads, cluster against one server.

All in one run, no Kafka, no Spark: one ``redis-server`` (the baseline) and a
Redis Cluster of three masters, both started here on loopback.

  write        the fold's writer (``materializer.redis.writer``, the ``latest`` mode's
               function): N entities of ~200 bytes in chunks of keys, each chunk one
               call on the master holding it, then the watermark; entities/s;
  batch_get    the query service's ``RedisMapStore.get_many``, closed loop with several
               calls in flight, K random keys per call; keys/s.

On one server a batch read is one ``MGET``; on a cluster it is one call of
the materializer's read function per master
(``query_service.stores.cluster_reads``). ``ratio_to_single`` is the cluster's
rate over the single server's. A cluster adds capacity by adding
machines; on one machine its masters share the same cores, so this measures
what the slot routing costs a client, not what a cluster can carry.

    .venv/bin/python bench/redis_cluster.py [--entities N] [--keys K] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import Any

from materializer.clients.redis import client_for
from materializer.config import RedisConfig
from materializer.contract.markers import mark_whole
from materializer.contract.watermark import Watermark
from materializer.redis.functions import FoldTarget, load_library
from materializer.redis.watermark import WatermarkSink
from materializer.redis.writer import Writer
from materializer.testing import RedisCluster, RedisServer
from query_service.stores.redis import RedisMapStore

MAP = "bench_users"
IN_FLIGHT = 8


def entities(n: int) -> list[tuple[str, tuple[str, bytes | None]]]:
    """Each key's winning record as the fold hands it to Redis: key, (order, entity JSON
    of ~200 bytes)."""
    pad = "x" * 120
    return [
        (
            f"u{i}",
            (f"{i:012d}", json.dumps({"id": f"u{i}", "name": f"user {i}", "pad": pad}).encode()),
        )
        for i in range(n)
    ]


def write(config: RedisConfig, winners: list[tuple[str, tuple[str, bytes | None]]]) -> float:
    """Seconds to apply every key's record, then commit the watermark, as the fold does."""
    load_library(config)
    mark_whole(client_for(config), MAP)
    target = FoldTarget(redis=config, map_name=MAP, changelog_topic="unused", producer=())
    started = time.perf_counter()
    for _ in Writer(target, 0).latest(winners):
        pass
    WatermarkSink(config, MAP, lambda _: {}).commit(Watermark(batch_id=0, app_id="bench"))
    return time.perf_counter() - started


async def batch_gets(config: RedisConfig, n: int, keys: int, seconds: float) -> tuple[int, float]:
    """Keys read and seconds taken by ``IN_FLIGHT`` closed-loop readers of ``keys`` each."""
    store = RedisMapStore.from_config(config)
    rng = random.Random(1)
    wanted = [[f"u{rng.randrange(n)}" for _ in range(keys)] for _ in range(64)]
    await store.get_many(MAP, wanted[0])  # connect (a cluster learns its slots)
    read = 0
    deadline = time.perf_counter() + seconds

    async def reader(i: int) -> None:
        nonlocal read
        while time.perf_counter() < deadline:
            found = await store.get_many(MAP, wanted[(read + i) % len(wanted)])
            assert all(found.entities), "every key was written"
            read += keys

    started = time.perf_counter()
    await asyncio.gather(*(reader(i) for i in range(IN_FLIGHT)))
    elapsed = time.perf_counter() - started
    await store.close()
    return read, elapsed


def measure(config: RedisConfig, args: argparse.Namespace) -> dict[str, float]:
    rows = entities(args.entities)
    write_s = write(config, rows)  # loads the library: batch reads use its read function
    read, read_s = asyncio.run(batch_gets(config, args.entities, args.keys, args.seconds))
    return {"write_per_s": args.entities / write_s, "keys_per_s": read / read_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entities", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with RedisServer() as single, RedisCluster(masters=3) as cluster:
        results = {
            "single": measure(RedisConfig(url=single.url), args),
            "cluster": measure(RedisConfig(url=cluster.url, cluster=True), args),
        }
    common: dict[str, Any] = {"entities": args.entities, "units": "per second"}
    for name, metric, extra in (
        ("write", "write_per_s", {}),
        ("batch_get", "keys_per_s", {"keys_per_call": args.keys, "in_flight": IN_FLIGHT}),
    ):
        line = {
            "name": f"redis_cluster_{name}",
            **common,
            **extra,
            "single": round(results["single"][metric]),
            "cluster_3_masters": round(results["cluster"][metric]),
            "ratio_to_single": round(results["cluster"][metric] / results["single"][metric], 3),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
