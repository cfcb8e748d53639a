"""Ingest benchmark: the foundation slice against raw reads of the same topic.

All in one run, on one broker:
  (a) Spark's batch ``kafka`` read + count of the topic (the baseline);
  (b) a plain confluent-kafka consume of the topic;
  (c) the slice end to end: decode, latest fold, Delta MERGE, Redis writes;
then freshness: produce at a steady rate into a live map and measure
produce-to-visible-in-Redis latency. Prints one JSON object per line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Consumer, Producer

from materializer.config import parse_config
from materializer.layout import entity_key
from materializer.pipeline.job import start_map
from materializer.spark.session import build_spark_session
from materializer.testing import KafkaBroker, RedisServer, create_topic

SCHEMA = (
    "id STRING, name STRING, email STRING, city STRING, age INT, score DOUBLE, "
    "plan STRING, device STRING, country STRING, updated_at BIGINT, seq BIGINT"
)
CITIES = ["Lisbon", "Oslo", "Kyoto", "Austin", "Lagos", "Lima", "Pune", "Graz"]


def emit(**fields: Any) -> None:
    print(orjson.dumps(fields).decode(), flush=True)


def event(seq: int, keys: int, rng: random.Random) -> tuple[bytes, bytes]:
    uid = f"user-{rng.randrange(keys):06d}"
    doc = {
        "id": uid,
        "name": f"Name {seq % 9973}",
        "email": f"{uid}@example.org",
        "city": CITIES[seq % len(CITIES)],
        "age": 18 + seq % 60,
        "score": round(rng.random() * 1000, 3),
        "plan": "pro" if seq % 3 else "free",
        "device": ("ios", "android", "web")[seq % 3] + f"-{rng.randrange(10**6):06d}",
        "country": ("PT", "NO", "JP", "US", "NG", "PE", "IN", "AT")[seq % 8],
        "updated_at": 1_700_000_000_000 + seq,
        "seq": seq,
    }
    return uid.encode(), orjson.dumps(doc)


def producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 500_000,
            "enable.idempotence": True,
        }
    )


def produce_bulk(bootstrap: str, topic: str, n: int, keys: int) -> dict[str, Any]:
    rng = random.Random(42)
    prod = producer(bootstrap)
    started = time.perf_counter()
    size = 0
    for seq in range(n):
        key, value = event(seq, keys, rng)
        size += len(value)
        while True:
            try:
                prod.produce(topic, value=value, key=key)
                break
            except BufferError:
                prod.poll(0.05)
        if seq % 10_000 == 0:
            prod.poll(0)
    prod.flush(120)
    seconds = time.perf_counter() - started
    return {
        "events": n,
        "seconds": round(seconds, 2),
        "events_per_s": round(n / seconds),
        "avg_value_bytes": round(size / n),
    }


def spark_read_count(spark: Any, bootstrap: str, topic: str) -> tuple[int, float]:
    started = time.perf_counter()
    count = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
        .count()
    )
    return count, time.perf_counter() - started


def confluent_consume(bootstrap: str, topic: str, n: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            "queued.min.messages": 200_000,
        }
    )
    consumer.subscribe([topic])
    seen = 0
    started = None
    try:
        while seen < n:
            msgs = consumer.consume(num_messages=10_000, timeout=1.0)
            if msgs and started is None:
                started = time.perf_counter()
            seen += sum(1 for m in msgs if m.error() is None)
    finally:
        consumer.close()
    assert started is not None
    return time.perf_counter() - started


def map_config(bootstrap: str, redis_url: str, work: Path, topic: str, name: str) -> Any:
    return parse_config(
        {
            "kafka": {"bootstrap_servers": bootstrap},
            "redis": {"url": redis_url},
            "delta": {"root": str(work / "warehouse")},
            "spark": {
                "checkpoint_root": str(work / "checkpoints"),
                "trigger_interval": "0 seconds",
            },
            "maps": {
                name: {
                    "source": {"topics": [topic], "schema": SCHEMA},
                    "key": "id",
                    "on_error": os.environ.get("ON_ERROR", "dead_letter"),
                }
            },
        }
    )


def freshness(
    bootstrap: str, redis_url: str, spark: Any, work: Path, rate: int, seconds: float, keys: int
) -> dict[str, Any]:
    topic = create_topic(bootstrap, 4)
    cfg = map_config(bootstrap, redis_url, work, topic, "fresh")
    queries = start_map(spark, cfg, "fresh")
    client = redis.Redis.from_url(redis_url)
    rng = random.Random(7)
    pending: dict[str, tuple[int, float]] = {}
    lock = threading.Lock()
    latencies: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set() or pending:
            with lock:
                items = list(pending.items())
            if items:
                values = client.mget([entity_key("fresh", k) for k, _ in items])
                now = time.perf_counter()
                with lock:
                    for (key, (seq, sent)), raw in zip(items, values, strict=True):
                        if raw is not None and orjson.loads(raw)["seq"] >= seq:
                            latencies.append(now - sent)
                            if pending.get(key, (None,))[0] == seq:
                                del pending[key]
            time.sleep(0.005)
            if done.is_set() and time.perf_counter() > deadline:
                break

    # Warm up: the first batch of a new query carries its start-up cost.
    prod = producer(bootstrap)
    key, value = event(0, keys, rng)
    prod.produce(topic, key=key, value=value)
    prod.flush(10)
    queries.process_all_available()

    poller = threading.Thread(target=poll, daemon=True)
    deadline = float("inf")
    poller.start()
    tick = 0.01
    per_tick = max(1, int(rate * tick))
    started = time.perf_counter()
    seq = 1
    while time.perf_counter() - started < seconds:
        tick_start = time.perf_counter()
        for _ in range(per_tick):
            key, value = event(seq, keys, rng)
            prod.produce(topic, key=key, value=value)
            if seq % 25 == 0:  # sample every 25th event, keeping the poller light
                with lock:
                    pending[key.decode()] = (seq, time.perf_counter())
            seq += 1
        prod.poll(0)
        time.sleep(max(0.0, tick - (time.perf_counter() - tick_start)))
    prod.flush(30)
    sent_seconds = time.perf_counter() - started
    deadline = time.perf_counter() + 60
    done.set()
    poller.join(90)
    queries.stop()
    client.close()
    ms = sorted(x * 1000 for x in latencies)
    q = statistics.quantiles(ms, n=100)
    return {
        "offered_events_per_s": rate,
        "achieved_events_per_s": round((seq - 1) / sent_seconds),
        "samples": len(ms),
        "unresolved": len(pending),
        "p50_ms": round(q[49], 1),
        "p90_ms": round(q[89], 1),
        "p99_ms": round(q[98], 1),
        "max_ms": round(ms[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=5_000)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="materializer-bench-"))
    with contextlib.ExitStack() as stack:
        bootstrap = (
            os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
            or stack.enter_context(KafkaBroker(heap="1g")).bootstrap_servers
        )
        redis_url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
        stack.callback(shutil.rmtree, work, True)
        emit(
            name="setup",
            python=sys.version.split()[0],
            cpus=os.cpu_count(),
            master=args.master,
            events=args.events,
            keys=args.keys,
            partitions=4,
        )

        topic = create_topic(bootstrap, 4)
        emit(name="produce", **produce_bulk(bootstrap, topic, args.events, args.keys))

        cfg = map_config(bootstrap, redis_url, work, topic, "ingest")
        spark = build_spark_session(cfg.spark.model_copy(update={"master": args.master}))
        stack.callback(spark.stop)
        spark_read_count(spark, bootstrap, topic)  # warm the JVM and the connector
        count, a_seconds = min(
            (spark_read_count(spark, bootstrap, topic) for _ in range(2)), key=lambda r: r[1]
        )
        assert count == args.events, count
        a = args.events / a_seconds
        emit(name="a_spark_kafka_read_count", seconds=round(a_seconds, 2), events_per_s=round(a))

        b_seconds = confluent_consume(bootstrap, topic, args.events)
        b = args.events / b_seconds
        emit(name="b_confluent_consume", seconds=round(b_seconds, 2), events_per_s=round(b))

        started = time.perf_counter()
        queries = start_map(spark, cfg, "ingest")
        queries.process_all_available()
        c_seconds = time.perf_counter() - started
        queries.stop()
        client = redis.Redis.from_url(redis_url)
        entities = sum(1 for _ in client.scan_iter(match="ingest:user-*", count=10_000))
        client.close()
        c = args.events / c_seconds
        emit(
            name="c_slice_end_to_end",
            seconds=round(c_seconds, 2),
            events_per_s=round(c),
            entities_in_redis=entities,
        )
        emit(name="ratios", c_over_a=round(c / a, 3), c_over_b=round(c / b, 3), target_c_over_a=0.5)

        emit(
            name="freshness",
            **freshness(bootstrap, redis_url, spark, work, args.rate, args.seconds, args.keys),
            target_p99_ms=1000,
        )


if __name__ == "__main__":
    main()
