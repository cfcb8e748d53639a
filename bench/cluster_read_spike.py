"""Spike: a batch read of many keys on a Redis Cluster, three ways, against one server.

A cluster takes no ``MGET`` across slots. Candidates, all grouping the keys
by master first (``by_master``) and writing to every master at once on its
pipelined connection (``lookup_connection``):

  fcall      one ``FCALL_RO`` of the materializer's read function per master
             (a ``redis.call('GET')`` per key inside Redis);
  gets       one ``GET`` per key, a master's ``GET``s written together;
  single     the baseline: one ``MGET`` on one server.

Each prints keys/s, the Redis servers' CPU and this process's CPU per key,
closed loop with ``IN_FLIGHT`` calls (8, or the ``IN_FLIGHT`` environment
variable) of ``--keys`` keys in flight.

    .venv/bin/python bench/cluster_read_spike.py [--seconds S] [--keys K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

sys.path.insert(0, os.path.dirname(__file__))
from redis_cluster import MAP, entities, write  # noqa: E402

from materializer.clients.redis import by_master  # noqa: E402
from materializer.config import RedisConfig  # noqa: E402
from materializer.contract.redis_layout import READ_FUNCTION  # noqa: E402
from materializer.redis.functions import load_library  # noqa: E402
from materializer.testing import RedisCluster, RedisServer  # noqa: E402
from query_service.stores.lookup_connection import LookupConnection, settled  # noqa: E402

IN_FLIGHT = int(os.environ.get("IN_FLIGHT", "8"))
ENTITIES = 200_000

Read = Callable[[Sequence[bytes]], Awaitable[list[Any]]]


def server_pid(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("server")["process_id"])


def server_cpu(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def closed_loop(read: Read, keys: int, seconds: float, pids: list[int]) -> dict[str, float]:
    rng = random.Random(1)
    wanted = [
        [f"{MAP}:u{rng.randrange(ENTITIES)}".encode() for _ in range(keys)] for _ in range(64)
    ]
    assert all(await read(wanted[0]))
    done = 0
    deadline = time.perf_counter() + seconds

    async def reader(i: int) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            values = await read(wanted[(done // keys + i) % len(wanted)])
            assert values[-1] is not None
            done += keys

    redis_before, me_before, started = server_cpu(pids), time.process_time(), time.perf_counter()
    await asyncio.gather(*(reader(i) for i in range(IN_FLIGHT)))
    elapsed = time.perf_counter() - started
    return {
        "keys_per_s": round(done / elapsed),
        "redis_us_per_key": round((server_cpu(pids) - redis_before) / done * 1e6, 2),
        "client_us_per_key": round((time.process_time() - me_before) / done * 1e6, 2),
    }


async def on_cluster(url: str, keys: int, seconds: float, pids: list[int]) -> dict[str, Any]:
    cluster = AsyncRedisCluster.from_url(url)
    await cluster.initialize()
    lookups: dict[str, LookupConnection] = {}

    def lookup(node: Any) -> LookupConnection:
        if node.name not in lookups:
            pool = aioredis.ConnectionPool(
                connection_class=node.connection_class, **node.connection_kwargs
            )
            lookups[node.name] = LookupConnection(pool, node.name, 5.0)
        return lookups[node.name]

    async def fcall(raw: Sequence[bytes]) -> list[Any]:
        groups = list(by_master(cluster, raw).values())
        connections = [await lookup(node).connected() for node, _ in groups]
        sent = [
            c.send("FCALL_RO", READ_FUNCTION, 1, raw[ix[0]], *(raw[i] for i in ix))
            for c, (_, ix) in zip(connections, groups, strict=True)
        ]
        values: list[Any] = [None] * len(raw)
        for (_, ix), reply in zip(groups, await settled(sent), strict=True):
            for i, value in zip(ix, reply, strict=True):
                values[i] = value
        return values

    async def gets(raw: Sequence[bytes]) -> list[Any]:
        groups = list(by_master(cluster, raw).values())
        connections = [await lookup(node).connected() for node, _ in groups]
        sent = [
            c.send("GET", raw[i])
            for c, (_, ix) in zip(connections, groups, strict=True)
            for i in ix
        ]
        order = [i for _, ix in groups for i in ix]
        values: list[Any] = [None] * len(raw)
        for i, reply in zip(order, await settled(sent), strict=True):
            values[i] = reply
        return values

    out = {}
    for name, read in (("fcall", fcall), ("gets", gets)):
        out[name] = await closed_loop(read, keys, seconds, pids)
    for connection in lookups.values():
        connection.close()
    await cluster.aclose()
    return out


async def on_single(url: str, keys: int, seconds: float, pids: list[int]) -> dict[str, Any]:
    pool = aioredis.ConnectionPool.from_url(url)
    connection = LookupConnection(pool, "single", 5.0)

    async def mget(raw: Sequence[bytes]) -> list[Any]:
        return list(await connection.execute("MGET", *raw))

    out = await closed_loop(mget, keys, seconds, pids)
    connection.close()
    await pool.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    rows = entities(ENTITIES)
    with RedisServer() as single, RedisCluster(masters=3) as cluster:
        results: dict[str, Any] = {}
        for url, is_cluster, urls in (
            (single.url, False, [single.url]),
            (cluster.url, True, [node.url for node in cluster.nodes]),
        ):
            pids = [server_pid(u) for u in urls]
            config = RedisConfig(url=url, cluster=is_cluster)
            write(config, rows)
            load_library(config)
            run = on_cluster if is_cluster else on_single
            found = asyncio.run(run(url, args.keys, args.seconds, pids))
            results.update(found if is_cluster else {"single": found})
    base = results["single"]["keys_per_s"]
    for name, figures in results.items():
        line = {"name": f"cluster_read_{name}", "keys_per_call": args.keys, "in_flight": IN_FLIGHT}
        line.update(figures, ratio_to_single=round(figures["keys_per_s"] / base, 3))
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
