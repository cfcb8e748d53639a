"""Rehydrate benchmark: a map's Redis copy loaded from its Delta table, against raw MSET.

All in one run, on one ``redis-server`` and one Kafka broker (no Spark):

  table        N entities shaped like a map's table (``_key`` + name, email, city,
               age INT, score DOUBLE, updated_at TIMESTAMP, plan STRING that is null
               for a third of the rows), written with delta-rs in 4 files;
  baseline     the Redis/Python ceiling: the same entities' keys and JSON, encoded
               beforehand into Python bytes, sent as pipelined MSETs of 4,096 pairs
               through redis-py (hiredis): what any loader written in Python pays
               for Redis alone;
  rehydrate    ``materializer.restore.rehydrate.rehydrate`` end to end into an empty
               Redis: SCAN for stale keys, read the table with delta-rs, encode every
               row as the pipeline's JSON, MSET, read the (empty) changelog tail,
               write the watermark;
  profile      the rehydrate path's CPU seconds by stage, Redis left out: reading the
               table, then encoding, then assembling the MSET commands;

each timed run starts from an empty Redis (FLUSHALL); best of two. Redis runs on
one of the machine's cores, the loader on the other.

    .venv/bin/python bench/rehydrate.py [--entities N]

``KAFKA_BOOTSTRAP_SERVERS`` points it at a running broker instead of starting one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import redis
from deltalake import DeltaTable, write_deltalake

from materializer.config import AppConfig, parse_config
from materializer.contract.entity_json import encode_columns
from materializer.contract.redis_layout import RESERVED_KEYS, entity_key
from materializer.contract.table_layout import table_path
from materializer.restore import bulk as redis_bulk
from materializer.restore.expected_state import BATCH_ROWS
from materializer.restore.rehydrate import rehydrate
from materializer.testing import KafkaBroker, RedisServer

MAP = "bench"
TARGET_PER_S = 200_000
CITIES = ["Lisbon", "Oslo", "Kyoto", "Austin", "Lagos", "Lima", "Pune", "Graz"]
FILES = 4


def emit(**fields: Any) -> None:
    print(orjson.dumps(fields).decode(), flush=True)


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def entity_batch(start: int, n: int, rng: np.random.Generator) -> pa.RecordBatch:
    index = np.arange(start, start + n)
    ids = [f"user-{i:07d}" for i in index.tolist()]
    return pa.record_batch(
        [
            pa.array(ids),
            pa.array([f"Name {i % 9973}" for i in index.tolist()]),
            pa.array([f"{u}@example.org" for u in ids]),
            pa.array(np.array(CITIES)[index % len(CITIES)]),
            pa.array((18 + index % 60).astype(np.int32)),
            pa.array(np.round(rng.random(n) * 1000, 3)),
            pa.array(1_700_000_000_000_000 + index * 1_000_003, pa.timestamp("us", "UTC")),
            pa.array([None if i % 3 == 0 else "pro" for i in index.tolist()], pa.string()),
        ],
        names=["_key", "name", "email", "city", "age", "score", "updated_at", "plan"],
    )


def make_table(path: str, n: int) -> dict[str, Any]:
    rng = np.random.default_rng(42)
    started = time.perf_counter()
    per_file = -(-n // FILES)
    for start in range(0, n, per_file):
        batch = entity_batch(start, min(per_file, n - start), rng)
        write_deltalake(path, pa.Table.from_batches([batch]), mode="append")
    return {"rows": n, "files": FILES, "seconds": round(time.perf_counter() - started, 2)}


def config(kafka: str, redis_url: str, work: Path) -> AppConfig:
    return parse_config(
        {
            "kafka": {"bootstrap_servers": kafka},
            "redis": {"url": redis_url},
            "delta": {"root": str(work / "warehouse")},
            "spark": {"checkpoint_root": str(work / "checkpoints")},
            "maps": {
                MAP: {
                    "source": {"topics": ["bench-events"], "schema": "id STRING"},
                    "key": "id",
                }
            },
        }
    )


def encoded_pairs(path: str) -> tuple[list[list[bytes]], int]:
    """Every entity's ``<map>:<key>`` and JSON as Python bytes, in MSET-sized argument lists."""
    commands: list[list[bytes]] = []
    size = 0
    for batch in DeltaTable(path).to_pyarrow_dataset().to_batches(batch_size=BATCH_ROWS):
        keys, values = encode_columns(batch, "_key")
        full = pc.binary_join_element_wise(f"{MAP}:".encode(), pc.cast(keys, pa.binary()), b"")
        size += pc.sum(pc.binary_length(values)).as_py()
        args: list[bytes] = []
        for key, value in zip(full.to_pylist(), values.to_pylist(), strict=True):
            args += (key, value)
            if len(args) >= 2 * redis_bulk.PAIRS_PER_COMMAND:
                commands.append(args)
                args = []
        if args:
            commands.append(args)
    return commands, size


def raw_mset(client: redis.Redis, commands: list[list[bytes]]) -> None:
    pipe = client.pipeline(transaction=False)
    for i, args in enumerate(commands, 1):
        pipe.execute_command("MSET", *args)  # type: ignore[no-untyped-call]
        if i % redis_bulk.IN_FLIGHT == 0:
            pipe.execute()
    pipe.execute()


def timed(runs: int, setup: Any, body: Any) -> list[float]:
    seconds = []
    for _ in range(runs):
        setup()
        started = time.perf_counter()
        body()
        seconds.append(round(time.perf_counter() - started, 2))
    return seconds


def profile(path: str) -> dict[str, float]:
    """CPU seconds of the rehydrate path's stages without Redis: read, +encode, +MSET bytes."""
    dataset = DeltaTable(path).to_pyarrow_dataset()

    def cpu(stage: int) -> float:
        started = time.process_time()
        for batch in dataset.to_batches(batch_size=BATCH_ROWS):
            if stage >= 1:
                keys, values = encode_columns(batch, "_key")
            if stage >= 2:
                full = pc.binary_join_element_wise(b"bench:", pc.cast(keys, pa.binary()), b"")
                redis_bulk._bulk_pairs(full, values)
        return time.process_time() - started

    read, encode, assemble = cpu(0), cpu(1), cpu(2)
    return {
        "read_cpu_s": round(read, 2),
        "encode_cpu_s": round(encode - read, 2),
        "mset_bytes_cpu_s": round(assemble - encode, 2),
    }


@contextlib.contextmanager
def kafka() -> Iterator[str]:
    existing = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if existing:
        yield existing
        return
    with KafkaBroker() as broker:
        yield broker.bootstrap_servers


def entities_in(client: redis.Redis) -> int:
    """The map's entity keys in Redis: a rehydrated map holds its watermark and its marker
    beside them, which are not entities."""
    prefix = entity_key(MAP, "").encode()
    return sum(
        1
        for k in client.scan_iter(match=entity_key(MAP, "*"), count=10_000)
        if k[len(prefix) :].decode() not in RESERVED_KEYS
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    n = args.entities
    import hiredis

    emit(
        name="setup",
        python=platform.python_version(),
        hiredis=hiredis.__version__,
        cpus=os.cpu_count(),
        loadavg_1m=loadavg(),
        entities=n,
        runs=args.runs,
    )
    work = Path(tempfile.mkdtemp(prefix="bench-rehydrate-"))
    try:
        with kafka() as bootstrap, RedisServer() as server:
            cfg = config(bootstrap, server.url, work)
            path = table_path(cfg, MAP)
            emit(name="table", **make_table(path, n))
            client = redis.Redis.from_url(server.url, socket_timeout=300)
            commands, size = encoded_pairs(path)
            base = timed(args.runs, client.flushall, lambda: raw_mset(client, commands))
            assert client.dbsize() == n
            best_base = min(base)
            emit(
                name="baseline_raw_mset",
                units="s, entities/s",
                seconds=best_base,
                runs_s=base,
                entities_per_s=round(n / best_base),
                avg_entity_bytes=round(size / n),
                loadavg_1m=loadavg(),
            )
            commands.clear()
            reports = []
            runs = timed(
                args.runs, client.flushall, lambda: reports.append(rehydrate(cfg, MAP, client))
            )
            assert reports[-1].written == n and entities_in(client) == n
            best = min(runs)
            emit(
                name="rehydrate",
                units="s, entities/s",
                seconds=best,
                runs_s=runs,
                entities_per_s=round(n / best),
                ratio_to_baseline=round(best_base / best, 3),
                target_entities_per_s=TARGET_PER_S,
                loadavg_1m=loadavg(),
            )
            emit(name="profile", units="CPU s, no Redis", entities=n, **profile(path))
            redis_cpu = client.info("cpu")
            emit(
                name="done",
                redis_cpu_s=round(redis_cpu["used_cpu_user"] + redis_cpu["used_cpu_sys"], 2),
                loadavg_1m=loadavg(),
            )
            client.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
