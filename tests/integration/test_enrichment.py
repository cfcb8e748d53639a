"""Streaming enrichments: events joined with a folded map and written back to Kafka.

The reference is a join computed in plain Python from the produced user events
(folded by ``fold_latest``) and the produced orders: each lookup's miss policy,
both lookup modes (Redis, the Delta table) and both guarantees are checked
against it record by record.
"""

from __future__ import annotations

import copy
import random
import uuid
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from materializer.config import parse_config
from materializer.enrichment.job import start_enrichment
from materializer.job import start_map
from materializer.testing import produce
from materializer.testing.reference import fold_latest
from materializer.testing.waiting import wait_until
from tests.helpers.slices import (
    FIELDS,
    delta_map_rs,
    end_offsets,
    read_committed,
    redis_map,
    slice_config,
    watermark,
)

USERS = 40
LOOKUPS = [
    # A left join that passes a miss with a null member.
    {"map": "users", "key_field": "user_id", "alias": "user", "fields": ["name", "age"]},
    # A miss leaves the event out.
    {"map": "users", "key_field": "buyer.id", "alias": "buyer", "on_miss": "drop"},
    # A miss sends the event to the dead-letter topic.
    {"map": "users", "key_field": "seller_id", "alias": "seller", "on_miss": "dead_letter"},
    # A miss leaves the member out.
    {"map": "users", "key_field": "referrer_id", "alias": "referrer", "on_miss": "omit"},
]


def group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The offsets ``group`` has committed for the two partitions of ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = [TopicPartition(topic, p) for p in (0, 1)]
        return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
    finally:
        consumer.close()


def user_events(rng: random.Random) -> list[tuple[bytes, bytes | None]]:
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(300):
        uid = f"u{rng.randrange(USERS)}"
        if rng.random() < 0.1:
            out.append((uid.encode(), None))
        else:
            doc = {"id": uid, "name": f"n{i}", "age": rng.randrange(90), "tags": ["a"]}
            out.append((uid.encode(), orjson.dumps(doc)))
    return out


def order_events(rng: random.Random, n: int) -> list[tuple[bytes, bytes]]:
    """Orders naming users that exist, that were deleted, that never were, or nobody."""

    def someone() -> Any:
        roll = rng.random()
        if roll < 0.75:
            return f"u{rng.randrange(USERS)}"
        if roll < 0.85:
            return f"ghost{rng.randrange(5)}"
        return None

    out = []
    for i in range(n):
        doc: dict[str, Any] = {"order_id": f"o{i}", "amount": rng.randrange(1000)}
        for field in ("user_id", "seller_id", "referrer_id"):
            if (who := someone()) is not None:
                doc[field] = who
        doc["buyer"] = {"id": someone() if rng.random() < 0.9 else f"u{rng.randrange(USERS)}"}
        out.append((f"o{i}".encode(), orjson.dumps(doc)))
    out.append((b"bad", b"{not json"))  # undecodable: a dead letter
    out.append((b"array", b"[1, 2]"))  # JSON, but not an object: a dead letter
    return out


def reference(
    orders: list[tuple[bytes, bytes]], users: dict[str, dict[str, Any]]
) -> tuple[dict[str, dict[str, Any]], set[str], set[bytes]]:
    """Per order id the enriched event, the ids dropped, and the keys of dead letters."""
    enriched: dict[str, dict[str, Any]] = {}
    dropped: set[str] = set()
    dead: set[bytes] = set()
    for key, value in orders:
        try:
            doc = orjson.loads(value)
        except orjson.JSONDecodeError:
            dead.add(key)
            continue
        if not isinstance(doc, dict):
            dead.add(key)
            continue
        out = copy.deepcopy(doc)
        outcome = "out"
        for lookup in LOOKUPS:
            where: Any = doc
            for part in lookup["key_field"].split("."):
                where = where.get(part) if isinstance(where, dict) else None
            entity = users.get(where) if isinstance(where, str) else None
            alias = lookup["alias"]
            if entity is not None:
                fields = lookup.get("fields")
                out[alias] = {f: entity[f] for f in fields if f in entity} if fields else entity
                continue
            policy = lookup.get("on_miss", "null")
            if policy == "drop":
                outcome = "drop"
                break
            if policy == "dead_letter":
                outcome = "dead"
                break
            if policy == "omit":
                out.pop(alias, None)
            else:
                out[alias] = None
        if outcome == "out":
            enriched[doc["order_id"]] = out
        elif outcome == "drop":
            dropped.add(doc["order_id"])
        else:
            dead.add(key)
    return enriched, dropped, dead


def test_enrichments_match_a_reference_join_from_redis_and_from_delta(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    rng = random.Random(11)
    users_topic, orders_topic = new_topic(2), new_topic(2)
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, users_topic, map_name="users")
    suffix = uuid.uuid4().hex[:6]
    outputs = {"live": f"enriched.live.{suffix}", "backfill": f"enriched.backfill.{suffix}"}
    doc["enrichments"] = {
        # Live lookups in Redis, each batch in one transaction, keyed by the order id.
        "live": {
            "source": {"topics": [orders_topic]},
            "lookups": LOOKUPS,
            "output": {"topic": outputs["live"], "key": "order_id", "guarantee": "exactly_once"},
            "dead_letter": {"topic": f"live.dlq.{suffix}"},
        },
        # A join with the Delta table, through Spark's kafka writer, keyed as the input was.
        "backfill": {
            "source": {"topics": [orders_topic]},
            "lookups": LOOKUPS,
            "lookups_from": "delta",
            "output": {"topic": outputs["backfill"]},
            "dead_letter": {"topic": f"backfill.dlq.{suffix}"},
        },
    }
    cfg = parse_config(doc)
    user_records = user_events(rng)
    positions = produce(kafka_bootstrap, users_topic, user_records)
    events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, user_records, strict=True)]
    users = fold_latest(events, "id", FIELDS)

    queries = [start_map(spark, cfg, "users", side_outputs=False)]
    try:
        wait_until(
            "the users folded into Redis and Delta",
            lambda: (
                (w := watermark(redis_client, "users")) is not None
                and w.offsets.get(users_topic) == end_offsets(positions)
                and (tmp_path / "warehouse" / "users").exists()
                and delta_map_rs(tmp_path / "warehouse" / "users") == users
            ),
        )
        assert redis_map(redis_client, "users") == users
        orders = order_events(rng, 400)
        order_positions = produce(kafka_bootstrap, orders_topic, orders)
        enriched, dropped, dead = reference(orders, users)
        assert dropped and dead and len(enriched) > 100  # every policy is exercised
        queries += [start_enrichment(spark, cfg, name) for name in ("live", "backfill")]

        for name, topic in outputs.items():
            wait_until(
                f"{name}'s output",
                lambda topic=topic: len(read_committed(kafka_bootstrap, topic)) >= len(enriched),
            )
            records = read_committed(kafka_bootstrap, topic)
            got = {}
            for msg in records:
                event = orjson.loads(msg.value())
                assert event["order_id"] not in got, f"{name}: {event['order_id']} twice"
                got[event["order_id"]] = event
                assert msg.key() == event["order_id"].encode()
            assert got == enriched, name
            dlq = read_committed(kafka_bootstrap, doc["enrichments"][name]["dead_letter"]["topic"])
            assert {m.key() for m in dlq} == dead
            for m in dlq:
                headers = dict(m.headers())
                assert headers["x-source-topic"] == orders_topic.encode()
                stage = headers["x-error-stage"]
                assert stage == (b"decode" if m.key() in (b"bad", b"array") else b"enrich")
                assert m.value() == dict(orders)[m.key()]  # the original record
            # The batches' end offsets went to the group: with the transactions for "live".
            wait_until(
                f"{name}'s group offsets",
                lambda name=name: (
                    group_offsets(kafka_bootstrap, f"materializer.{name}", orders_topic)
                    == end_offsets(order_positions)
                ),
            )
    finally:
        for q in queries:
            q.stop()
