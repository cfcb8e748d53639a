"""Spike: how the ``merge`` fold reads its keys' states from one Redis server.

One broker, one ``redis-server``, no Spark. A ``merge`` map of the benchmark's
~200-byte user events is folded in-process (``apply_batches``, as the driver
applies a live batch) until all ``--keys`` keys have a state, then each
candidate reads the states of live-sized chunks of keys (1,000 a call, as the
fold's chunks), and the fold applies live-sized batches:

  read_function  ``FCALL_RO`` of the read function: state and entity per key
                 (``redis.call('GET')`` twice per key inside Redis);
  mget           ``MGET`` of the states alone (a key with a state needs no entity);
  fold_apply     the fold's whole apply of ``--batch`` records, as it reads now:
                 µs per record.

Each read line gives this process's µs per key (wall, the call included) and
Redis's own µs per key (``INFO commandstats``).

    .venv/bin/python bench/fold_read_spike.py [--keys K] [--batch B] [--batches N]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import pyarrow as pa
import redis
from harness import emit, event, machine, services

from materializer.config import KafkaConfig, RedisConfig
from materializer.contract.markers import mark_whole
from materializer.contract.redis_layout import entity_key
from materializer.fold.merge import MergeFolder, fields_of
from materializer.redis.fold import apply_batches, producer_settings
from materializer.redis.functions import (
    CHUNK,
    READ,
    FoldTarget,
    load_library,
    new_producer,
    state_key,
)
from materializer.testing import create_topic

MAP = "spike"


def entity_type() -> Any:
    """The benchmark events' struct (``harness.SCHEMA``), built without a JVM."""
    from pyspark.sql import types as T

    fields = [
        ("id", T.StringType()),
        ("name", T.StringType()),
        ("email", T.StringType()),
        ("city", T.StringType()),
        ("age", T.IntegerType()),
        ("score", T.DoubleType()),
        ("plan", T.StringType()),
        ("device", T.StringType()),
        ("country", T.StringType()),
        ("updated_at", T.LongType()),
        ("seq", T.LongType()),
    ]
    return T.StructType([T.StructField(name, dtype) for name, dtype in fields])


def records(first_seq: int, n: int, keys: int, rng: random.Random) -> pa.RecordBatch:
    """``n`` events over ``keys`` keys as the columns the fold takes (no dead letters)."""
    rows = [event(first_seq + i, rng.randrange(keys), rng) for i in range(n)]
    return pa.RecordBatch.from_pydict(
        {
            "__key": [key.decode() for key, _ in rows],
            "__order": [f"{i % 4:010d}{first_seq + i:019d}" for i in range(n)],
            "__value": pa.array([value for _, value in rows], pa.binary()),
            "__aux": pa.array([""] * n, pa.string()),
            "__timestamp_us": pa.array([0] * n, pa.int64()),
            "__dl_key": pa.array([None] * n, pa.binary()),
            "__dl_value": pa.array([None] * n, pa.binary()),
            "__dl_headers": pa.array([None] * n, pa.string()),
        }
    )


def redis_usec(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("usec", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=2_000, help="records per applied batch")
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    rng = random.Random(7)
    with services() as (bootstrap, redis_url):
        emit(name="setup", **machine(), keys=args.keys, batch=args.batch)
        config = RedisConfig(url=redis_url)
        load_library(config)
        client = redis.Redis.from_url(redis_url)
        target = FoldTarget(
            redis=config,
            map_name=MAP,
            changelog_topic=create_topic(bootstrap, 4),
            producer=producer_settings(KafkaConfig(bootstrap_servers=bootstrap), 1_000_000),
            folder=MergeFolder(fields_of(entity_type()), exact=False),
        )
        mark_whole(client, MAP)
        producer = new_producer(target)
        seq = 0
        for batch_id in range(args.keys * 10 // 20_000):
            apply_batches(
                target, batch_id, "spike", [records(seq, 20_000, args.keys, rng)], producer, 1
            )
            seq += 20_000

        keys = [f"user-{i:06d}" for i in range(args.keys)]
        chunks = [keys[i : i + CHUNK] for i in range(0, len(keys), CHUNK)]
        for name, command in (("read_function", "fcall_ro"), ("mget", "mget")):
            before = redis_usec(client, command)
            started = time.perf_counter()
            for chunk in chunks:
                if name == "mget":
                    client.mget([state_key(MAP, key) for key in chunk])
                else:
                    read_args: list[bytes] = []
                    for key in chunk:
                        read_args += [state_key(MAP, key), entity_key(MAP, key).encode()]
                    client.execute_command("FCALL_RO", READ, 1, read_args[1], *read_args)
            seconds = time.perf_counter() - started
            emit(
                name=name,
                units="µs per key",
                client_us_per_key=round(seconds / len(keys) * 1e6, 2),
                redis_us_per_key=round((redis_usec(client, command) - before) / len(keys), 2),
            )

        batches = [
            records(seq + i * args.batch, args.batch, args.keys, rng) for i in range(args.batches)
        ]
        started = time.perf_counter()
        for i, batch in enumerate(batches):
            apply_batches(target, 1_000 + i, "spike", [batch], producer, 2)
        seconds = time.perf_counter() - started
        emit(
            name="fold_apply",
            units="µs per record",
            us_per_record=round(seconds / (args.batch * args.batches) * 1e6, 1),
        )


if __name__ == "__main__":
    main()
