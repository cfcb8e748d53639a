"""Enrichment benchmark: a streaming enrichment into Kafka against the raw read of its input.

All in one run, on one broker, one Redis and one Spark session:

  users       K user events (~200 bytes, K distinct keys) into a 4-partition topic,
              folded by a ``latest`` map ``bench_users`` into Redis and Delta;
  produce     N JSON orders (~180 bytes) into a 4-partition topic, each naming a
              ``user_id``: one of the K users, or (1 in 20) a user who does not exist;
  baseline    Spark's batch ``kafka`` read + ``count()`` of the orders topic;
  enrich_<lookups>_<guarantee>
              a new enrichment reads the whole orders topic, joins each order
              with its user (left join: a miss passes with ``user: null``) and
              writes it to a new output topic, for (redis, at_least_once),
              (redis, exactly_once) and (delta, at_least_once); timed from the
              query's start until it has processed everything, then the output
              is read back (``read_committed``) and checked: N records, the
              expected number of misses, sampled hits equal to the map's entities;
              each batch's time is split into reading and joining it (Spark
              computes and caches the joined batch) and writing it to the output
              (and, at least once, committing the group's offsets).

Each enrichment reads at most ``--max-offsets`` records per micro-batch (so an
exactly-once transaction stays bounded) with a ``0 seconds`` trigger.

    .venv/bin/python bench/enrich.py [--events N] [--users K] [--max-offsets M]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Consumer, TopicPartition
from harness import (
    PARTITIONS,
    TIMINGS,
    baseline_read,
    emit,
    map_config,
    produce_all,
    produce_bulk,
    services,
    setup_line,
    timed,
)

from materializer import job
from materializer.contract.redis_layout import entity_key
from materializer.enrichment.job import ENRICH_QUERY, start_enrichment
from materializer.enrichment.outputs import KafkaOutput, TransactionalOutput
from materializer.runtime.group_offsets import GroupOffsetsSink
from materializer.runtime.projector import Projector
from materializer.spark.session import build_spark_session
from materializer.testing import create_topic

MAP = "bench_users"
FIELDS = ["name", "city", "plan"]
LOOKUPS = [{"map": MAP, "key_field": "user_id", "alias": "user", "fields": FIELDS}]
MISS_EVERY = 20
"""One order in 20 names a user who does not exist."""
RUNS = [("redis", "at_least_once"), ("redis", "exactly_once"), ("delta", "at_least_once")]
CHANNELS = ["web", "ios", "android", "store"]
CURRENCIES = ["EUR", "USD", "JPY", "NOK"]


def order(seq: int, users: int, rng: random.Random) -> tuple[bytes, bytes, bool]:
    """One ~180-byte JSON order keyed by its id, and whether its user exists."""
    hit = seq % MISS_EVERY != 0
    user = f"user-{rng.randrange(users):06d}" if hit else f"ghost-{rng.randrange(10**6):06d}"
    oid = f"order-{seq:08d}"
    doc = {
        "order_id": oid,
        "user_id": user,
        "amount": round(rng.random() * 500, 2),
        "currency": CURRENCIES[seq % len(CURRENCIES)],
        "items": 1 + seq % 7,
        "sku": f"sku-{rng.randrange(10**6):06d}",
        "channel": CHANNELS[seq % len(CHANNELS)],
        "status": "placed",
        "created_at": 1_700_000_000_000 + seq,
    }
    return oid.encode(), orjson.dumps(doc), hit


def produce_orders(bootstrap: str, topic: str, n: int, users: int) -> dict[str, Any]:
    """N orders, one in 20 naming a user who does not exist."""
    rng = random.Random(43)
    misses = 0

    def orders() -> Iterator[tuple[bytes, bytes]]:
        nonlocal misses
        for seq in range(n):
            key, value, hit = order(seq, users, rng)
            misses += not hit
            yield key, value

    produced = produce_all(bootstrap, topic, orders())
    return {**produced, "misses": misses}


def read_output(bootstrap: str, topic: str) -> list[bytes | None]:
    """Every committed value of ``topic``, read from the start to its end (``read_committed``:
    transaction markers take offsets, so the end is where positions reach the high marks)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-check-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
        }
    )
    values: list[bytes | None] = []
    try:
        partitions = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        tps = [TopicPartition(topic, p) for p in partitions]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        idle = 0
        while idle < 5:
            msgs = consumer.consume(num_messages=10_000, timeout=1.0)
            for m in msgs:
                if m.error() is not None:
                    raise RuntimeError(str(m.error()))
                values.append(m.value())
            if msgs:
                idle = 0
                continue
            idle += 1
            if all(tp.offset >= ends[tp.partition] for tp in consumer.position(tps)):
                break
    finally:
        consumer.close()
    return values


def check_output(
    values: list[bytes | None], events: int, misses: int, client: redis.Redis, name: str
) -> int:
    """Fail unless the output is every order once, the misses with ``user: null`` and a sample
    of the hits carrying their user's fields as the map holds them; the hits checked."""
    if len(values) != events:
        raise RuntimeError(f"{name}: {len(values)} records in the output, expected {events}")
    docs = [orjson.loads(v) for v in values if v is not None]
    if len(docs) != events:
        raise RuntimeError(f"{name}: {events - len(docs)} records without a value")
    ids = {d["order_id"] for d in docs}
    if len(ids) != events:
        raise RuntimeError(f"{name}: {len(ids)} distinct orders in the output, expected {events}")
    nulls = sum(d["user"] is None for d in docs)
    if nulls != misses:
        raise RuntimeError(f"{name}: {nulls} orders without a user, expected {misses}")
    sample = random.Random(9).sample([d for d in docs if d["user"] is not None], 2_000)
    stored = client.mget([entity_key(MAP, d["user_id"]) for d in sample])
    for doc, raw in zip(sample, stored, strict=True):
        entity = orjson.loads(raw) if raw is not None else None
        want = {f: entity[f] for f in FIELDS} if entity else None
        if doc["user"] != want:
            raise RuntimeError(f"{name}: order {doc['order_id']} has {doc['user']}, map {want}")
    return len(sample)


def instrument() -> None:
    """Time each batch's projector and its sinks: the projector joins the batch and caches
    it (``persist`` + ``count``), then the sinks write it from the cache."""
    timed(Projector, "__call__", "projector")
    timed(KafkaOutput, "write", "output")
    timed(TransactionalOutput, "write", "output")
    timed(GroupOffsetsSink, "write", "offsets")


def batches(name: str, query: Any) -> dict[str, Any]:
    """The query's batches, and where they spent their time (seconds, summed over batches)."""
    progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    per_batch = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in progress]
    t = [TIMINGS.get((f"{name}.{ENRICH_QUERY}", p["batchId"]), {}) for p in progress]
    output = sum(x.get("output", 0) for x in t)
    offsets = sum(x.get("offsets", 0) for x in t)
    return {
        "batches": len(progress),
        "batch_s_p50": round(statistics.median(per_batch), 2) if per_batch else None,
        "batch_s_max": round(max(per_batch), 2) if per_batch else None,
        "sum_trigger_s": round(sum(per_batch), 2),
        "sum_read_and_join_s": round(sum(x.get("projector", 0) for x in t) - output - offsets, 2),
        "sum_output_s": round(output, 2),
        "sum_group_offsets_s": round(offsets, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000, help="orders")
    parser.add_argument("--users", type=int, default=100_000, help="entities in the map")
    parser.add_argument("--max-offsets", type=int, default=100_000, help="records per batch")
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()
    n = args.events

    instrument()
    work = Path(tempfile.mkdtemp(prefix="materializer-bench-enrich-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        bootstrap, redis_url = stack.enter_context(services())
        client = redis.Redis.from_url(redis_url)
        stack.callback(client.close)
        setup_line(args.master, n, args.users)

        users_topic = create_topic(bootstrap, PARTITIONS)
        orders_topic = create_topic(bootstrap, PARTITIONS)
        emit(name="users", **produce_bulk(bootstrap, users_topic, args.users, args.users))
        produced = produce_orders(bootstrap, orders_topic, n, args.users)
        emit(name="produce", **produced)

        base = map_config(bootstrap, redis_url, work, args.master, users_topic, MAP)
        spark = build_spark_session(base.spark)
        stack.callback(spark.stop)

        started = time.perf_counter()
        users = job.start_map(spark, base, MAP)
        try:
            users.process_all_available()
        finally:
            users.stop()
        emit(name="map_folded", map=MAP, seconds=round(time.perf_counter() - started, 2))

        a = baseline_read(spark, bootstrap, orders_topic, n)

        suffix = uuid.uuid4().hex[:6]
        enrichments: dict[str, dict[str, Any]] = {
            f"enrich_{lookups_from}_{guarantee}": {
                "source": {"topics": [orders_topic]},
                "lookups": LOOKUPS,
                "lookups_from": lookups_from,
                "output": {
                    "topic": f"enriched-{lookups_from}-{guarantee}-{suffix}",
                    "key": "order_id",
                    "guarantee": guarantee,
                },
            }
            for lookups_from, guarantee in RUNS
        }
        cfg = map_config(
            bootstrap,
            redis_url,
            work,
            args.master,
            users_topic,
            MAP,
            max_offsets=args.max_offsets,
            enrichments=enrichments,
        )
        for name, spec in enrichments.items():
            started = time.perf_counter()
            queries = start_enrichment(spark, cfg, name)
            try:
                queries.fold.processAllAvailable()
                seconds = time.perf_counter() - started
                profile = batches(name, queries.fold)
            finally:
                queries.stop()
            values = read_output(bootstrap, spec["output"]["topic"])
            checked = check_output(values, n, produced["misses"], client, name)
            emit(
                name=name,
                units="s, events/s",
                lookups_from=spec["lookups_from"],
                guarantee=spec["output"]["guarantee"],
                max_offsets_per_trigger=args.max_offsets,
                seconds=round(seconds, 2),
                events_per_s=round(n / seconds),
                ratio_to_spark_read=round(n / seconds / a, 3),
                output_records=len(values),
                hits_checked=checked,
                **profile,
                loadavg_1m=round(os.getloadavg()[0], 2),
            )
        emit(name="done", loadavg_1m=round(os.getloadavg()[0], 2))


if __name__ == "__main__":
    main()
