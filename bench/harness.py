"""What the benchmarks share: services, the event generator, baselines and batch timing.

Every benchmark produces the same ~200-byte JSON user events, measures its
baseline (Spark's batch ``kafka`` read of the same topic) in the same run and
prints one JSON object per line.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from materializer.config import AppConfig, parse_config
from materializer.contract.redis_layout import RESERVED_KEYS
from materializer.delta.sink import DeltaSink
from materializer.redis.sink import RedisFoldSink
from materializer.redis.watermark import WatermarkSink
from materializer.runtime.projector import Projector
from materializer.testing import KafkaBroker, RedisServer

PARTITIONS = 4
SCHEMA = (
    "id STRING, name STRING, email STRING, city STRING, age INT, score DOUBLE, "
    "plan STRING, device STRING, country STRING, updated_at BIGINT, seq BIGINT"
)
CITIES = ["Lisbon", "Oslo", "Kyoto", "Austin", "Lagos", "Lima", "Pune", "Graz"]
COUNTRIES = ["PT", "NO", "JP", "US", "NG", "PE", "IN", "AT"]


def emit(**fields: Any) -> None:
    print(orjson.dumps(fields).decode(), flush=True)


def event(seq: int, key_index: int, rng: random.Random) -> tuple[bytes, bytes]:
    """One ~200-byte JSON event; its Kafka key is its ``id``."""
    uid = f"user-{key_index:06d}"
    doc = {
        "id": uid,
        "name": f"Name {seq % 9973}",
        "email": f"{uid}@example.org",
        "city": CITIES[seq % len(CITIES)],
        "age": 18 + seq % 60,
        "score": round(rng.random() * 1000, 3),
        "plan": "pro" if seq % 3 else "free",
        "device": ("ios", "android", "web")[seq % 3] + f"-{rng.randrange(10**6):06d}",
        "country": COUNTRIES[seq % len(COUNTRIES)],
        "updated_at": 1_700_000_000_000 + seq,
        "seq": seq,
    }
    return uid.encode(), orjson.dumps(doc)


def key_order(n: int, keys: int, rng: random.Random) -> Iterator[int]:
    """N key indexes: shuffled passes over all K keys, so exactly min(N, K) distinct keys."""
    indexes = list(range(keys))
    emitted = 0
    while emitted < n:
        rng.shuffle(indexes)
        yield from indexes[: n - emitted]
        emitted += min(keys, n - emitted)


def bulk_producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 4 * 1024 * 1024,
            "batch.num.messages": 100_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1024 * 1024,
            "enable.idempotence": True,
        }
    )


def produce_all(
    bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes]]
) -> dict[str, Any]:
    """Produce every record as fast as the producer takes them: count, seconds, value bytes."""
    prod = bulk_producer(bootstrap)
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    started = time.perf_counter()
    size = n = 0
    for key, value in records:
        size += len(value)
        n += 1
        while True:
            try:
                prod.produce(topic, value=value, key=key, on_delivery=delivered)
                break
            except BufferError:
                prod.poll(0.05)
        if n % 5_000 == 0:
            prod.poll(0)
    remaining = prod.flush(120)
    seconds = time.perf_counter() - started
    if errors or remaining:
        raise RuntimeError(f"produce failed: {errors[:3]} ({remaining} undelivered)")
    return {
        "events": n,
        "seconds": round(seconds, 2),
        "events_per_s": round(n / seconds),
        "avg_value_bytes": round(size / n),
        "mb_per_s": round(size / seconds / 1e6, 1),
    }


def produce_bulk(bootstrap: str, topic: str, n: int, keys: int) -> dict[str, Any]:
    """N user events over ``keys`` keys."""
    rng = random.Random(42)
    records = (event(seq, k, rng) for seq, k in enumerate(key_order(n, keys, rng)))
    return {"distinct_keys": min(n, keys), **produce_all(bootstrap, topic, records)}


def spark_read_count(
    spark: Any, bootstrap: str, topic: str, ending: str = "latest"
) -> tuple[float, int]:
    """Seconds for a batch read of the topic and ``count()``; checks the count when whole."""
    started = time.perf_counter()
    count = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", ending)
        .load()
        .count()
    )
    return time.perf_counter() - started, count


def confluent_consume(bootstrap: str, topic: str, n: int) -> float:
    """Seconds to consume N records from the beginning of every partition (no group join)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{time.time_ns()}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            "fetch.wait.max.ms": 100,
            "queued.min.messages": 500_000,
            "queued.max.messages.kbytes": 512 * 1024,
        }
    )
    seen = 0
    try:
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        while seen < n:
            msgs = consumer.consume(num_messages=10_000, timeout=1.0)
            for m in msgs:
                if m.error() is None:
                    seen += 1
                else:
                    raise RuntimeError(str(m.error()))
        return time.perf_counter() - started
    finally:
        consumer.close()


def map_config(
    bootstrap: str,
    redis_url: str,
    work: Path,
    master: str,
    topic: str,
    name: str,
    fold: dict[str, Any] | None = None,
    *,
    max_offsets: int | None = None,
    enrichments: dict[str, Any] | None = None,
) -> AppConfig:
    """One map over the benchmark topic (``fold`` defaults to ``latest``), and any
    ``enrichments``; ``max_offsets`` bounds each micro-batch."""
    return parse_config(
        {
            "kafka": {"bootstrap_servers": bootstrap},
            "redis": {"url": redis_url},
            "delta": {"root": str(work / "warehouse")},
            "spark": {
                "master": master,
                "checkpoint_root": str(work / "checkpoints"),
                "trigger_interval": "0 seconds",
                "shuffle_partitions": 4,
                "max_offsets_per_trigger": max_offsets,
                "conf": {"spark.sql.streaming.numRecentProgressUpdates": "10000"},
            },
            "maps": {
                name: {
                    "source": {"topics": [topic], "format": "json", "schema": SCHEMA},
                    "key": "id",
                    "fold": fold or {"mode": "latest"},
                }
            },
            "enrichments": enrichments or {},
        }
    )


# --- per-batch timing of the projector and its sinks (benchmark-side instrumentation) ---

TIMINGS: dict[tuple[str, int], dict[str, float]] = collections.defaultdict(dict)


_CURRENT = threading.local()
"""The query whose projector runs on this thread: its sinks' timings are filed under it."""


def timed(cls: type, attr: str, label: str) -> None:
    original = getattr(cls, attr)

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any) -> Any:
        if label == "projector":
            _CURRENT.query, _CURRENT.batch = f"{self.map_name}.{self.query}", args[1]
        started = time.perf_counter()
        try:
            return original(self, *args)
        finally:
            TIMINGS[(_CURRENT.query, _CURRENT.batch)][label] = time.perf_counter() - started

    setattr(cls, attr, wrapper)


def instrument() -> None:
    """Time each query's projector and sinks, keyed by ``<map>.<query>`` and batch id (the
    fold and Delta queries of a map number their batches independently)."""
    timed(Projector, "__call__", "projector")
    timed(WatermarkSink, "write", "redis")
    timed(DeltaSink, "write", "delta")
    timed(RedisFoldSink, "write", "redis_fold")


def batch_profile(query: Any) -> dict[str, Any]:
    """Where the fold query's batches spent their time, summed over its batches (seconds)."""
    progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    totals: dict[str, float] = collections.defaultdict(float)
    per_batch: list[float] = []
    for p in progress:
        d = p["durationMs"]
        per_batch.append(d.get("triggerExecution", 0) / 1000)
        for k in ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets"):
            totals[k] += d.get(k, 0) / 1000
        t = TIMINGS.get((p["name"], p["batchId"]), {})
        sinks = t.get("redis_fold", 0) + t.get("redis", 0) + t.get("delta", 0)
        totals["fold_and_count"] += t.get("projector", 0) - sinks
        for sink in ("redis_fold", "redis", "delta"):
            if sink in t:
                totals[f"{sink}_sink"] += t[sink]
    out: dict[str, Any] = {
        "batches": len(progress),
        "rows_in": sum(p["numInputRows"] for p in progress),
        "rows_out_per_batch_mean": round(
            statistics.mean(p["stateOperators"][0]["numRowsUpdated"] for p in progress), 1
        )
        if progress and progress[0].get("stateOperators")
        else None,
        "batch_s_p50": round(statistics.median(per_batch), 2) if per_batch else None,
        "batch_s_max": round(max(per_batch), 2) if per_batch else None,
        "sum_trigger_s": round(sum(per_batch), 2),
    }
    out.update({f"sum_{k}_s": round(v, 2) for k, v in totals.items()})
    return out


def entities_in_redis(redis_url: str, map_name: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        reserved = sum(client.exists(f"{map_name}:{r}") for r in RESERVED_KEYS)
        return int(client.dbsize()) - reserved
    finally:
        client.close()


def run_doc(work: Path, bootstrap: str, redis_url: str, maps: dict[str, Any]) -> dict[str, Any]:
    """A ``materializer run`` configuration of ``maps`` with every cadence at its default, as
    users run it: its warehouse and checkpoints in ``work``, no fixed metrics port."""
    return {
        "kafka": {"bootstrap_servers": bootstrap},
        "redis": {"url": redis_url},
        "delta": {"root": str(work / "warehouse")},
        "spark": {"checkpoint_root": str(work / "checkpoints")},
        "metrics": {"port": 0},
        "maps": maps,
    }


@contextlib.contextmanager
def services() -> Iterator[tuple[str, str]]:
    """(bootstrap servers, Redis URL): ``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` or our own."""
    with contextlib.ExitStack() as stack:
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or (
            stack.enter_context(KafkaBroker(heap="1g")).bootstrap_servers
        )
        redis_url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
        if os.environ.get("REDIS_URL"):
            redis.Redis.from_url(redis_url).flushdb()  # entity counts need an empty db
        yield bootstrap, redis_url


def broker_pids() -> list[int]:
    """The Kafka broker's JVM, whichever process started it: what the readers and the
    real-time path's transactions ask of it is part of what a run costs."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if "kafka.Kafka" in (entry / "cmdline").read_text():
                    found.append(int(entry.name))
    return found


def machine() -> dict[str, Any]:
    """What every setup line says of the machine: figures compare only within a run."""
    return {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def setup_line(master: str, events: int, keys: int) -> None:
    emit(
        name="setup",
        **machine(),
        master=master,
        shuffle_partitions=4,
        events=events,
        keys=keys,
        partitions=PARTITIONS,
    )


def baseline_read(spark: Any, bootstrap: str, topic: str, events: int) -> float:
    """Events/s of Spark's batch ``kafka`` read + count: warm-up, then the faster of two runs."""
    small = orjson.dumps({topic: {str(p): 1000 for p in range(PARTITIONS)}}).decode()
    spark_read_count(spark, bootstrap, topic, small)
    runs = [spark_read_count(spark, bootstrap, topic) for _ in range(2)]
    for _, count in runs:
        if count != events:
            raise RuntimeError(f"spark counted {count} records, expected {events}")
    seconds = min(s for s, _ in runs)
    emit(
        name="a_spark_kafka_read_count",
        units="s, events/s",
        seconds=round(seconds, 2),
        runs_s=[round(s, 2) for s, _ in runs],
        events_per_s=round(events / seconds),
    )
    return events / seconds
