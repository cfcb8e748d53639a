"""Several topics feed one map: profile and address events of the same users."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

from materializer.contract.table_layout import table_path
from materializer.job import start_map
from materializer.testing import produce
from materializer.testing.reference import fold_merge
from tests.helpers.slices import config, delta_map_rs, redis_map, slice_config

SCHEMA = "id STRING, name STRING, email STRING, address STRUCT<city: STRING, zip: STRING>, ts LONG"


def _profiles(rng: random.Random, n: int, users: int) -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(n):
        uid = f"u{rng.randrange(users)}"
        doc: dict[str, Any] = {"id": uid, "name": f"name-{i}"}
        if rng.random() < 0.5:
            doc["email"] = f"{uid}-{i}@example.com"
        out.append((uid.encode(), orjson.dumps(doc)))
    return out


def _addresses(rng: random.Random, n: int, users: int) -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(n):
        uid = f"u{rng.randrange(users)}"
        address = {"city": rng.choice(["Oslo", "Lima", "Pune"]), "zip": f"{i:05d}"}
        out.append((uid.encode(), orjson.dumps({"id": uid, "address": address})))
    return out


def _events(topic_records: list[tuple[list[tuple[int, int]], list[tuple[bytes, bytes]]]]):
    """Per topic, (partition, offset, key, value) of each produced record."""
    return [
        [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
        for positions, records in topic_records
    ]


def test_profile_and_address_topics_merge_into_one_entity(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    profiles_topic, addresses_topic = new_topic(2), new_topic(3)
    doc = slice_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        profiles_topic,
        map_name="people",
        fold={"mode": "merge"},
    )
    doc["maps"]["people"]["source"] = {
        "topics": [profiles_topic, addresses_topic],
        "schema": SCHEMA,
    }
    cfg = config(doc)
    rng = random.Random(11)
    profiles = _profiles(rng, 300, 40)
    addresses = _addresses(rng, 200, 50)
    at_profiles = produce(kafka_bootstrap, profiles_topic, profiles)
    at_addresses = produce(kafka_bootstrap, addresses_topic, addresses)
    queries = start_map(spark, cfg, "people")
    try:
        queries.process_all_available()
    finally:
        queries.stop()

    # Each topic owns its fields, so the merged entity is each topic's fold merged together.
    by_profile, by_address = (
        fold_merge(events, "id")
        for events in _events([(at_profiles, profiles), (at_addresses, addresses)])
    )
    expected = {
        uid: {**by_profile.get(uid, {}), **by_address.get(uid, {})}
        for uid in by_profile.keys() | by_address.keys()
    }
    assert redis_map(redis_client, "people") == expected
    assert delta_map_rs(Path(table_path(cfg, "people"))) == expected


def test_latest_by_event_time_across_topics(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    web, mobile = new_topic(2), new_topic(1)
    doc = slice_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        web,
        map_name="seen",
        fold={"mode": "latest", "event_time": "ts"},
    )
    doc["maps"]["seen"]["source"] = {"topics": [web, mobile], "schema": SCHEMA}
    cfg = config(doc)
    rng = random.Random(5)
    stamps = rng.sample(range(1_000_000), 400)  # distinct: the latest is unambiguous
    produced: dict[str, list[tuple[bytes, bytes]]] = {web: [], mobile: []}
    for i, ts in enumerate(stamps):
        uid = f"u{rng.randrange(30)}"
        topic = web if i % 2 else mobile
        value = {"id": uid, "name": f"{topic}-{i}", "ts": ts}
        produced[topic].append((uid.encode(), orjson.dumps(value)))
    for topic, records in produced.items():
        produce(kafka_bootstrap, topic, records)
    queries = start_map(spark, cfg, "seen")
    try:
        queries.process_all_available()
    finally:
        queries.stop()

    latest: dict[str, dict[str, Any]] = {}
    for records in produced.values():
        for _, value in records:
            event = orjson.loads(value)
            if event["id"] not in latest or latest[event["id"]]["ts"] < event["ts"]:
                latest[event["id"]] = event
    assert redis_map(redis_client, "seen") == latest
    assert delta_map_rs(Path(table_path(cfg, "seen"))) == latest


def test_merge_by_event_time_applies_late_patches_underneath(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    doc = slice_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        map_name="late",
        fold={"mode": "merge", "event_time": "ts"},
    )
    doc["maps"]["late"]["source"]["schema"] = SCHEMA
    cfg = config(doc)
    rng = random.Random(3)
    stamps = rng.sample(range(1_000_000), 300)  # arrival order is not event-time order
    records = []
    for i, ts in enumerate(stamps):
        uid = f"u{rng.randrange(25)}"
        value: dict[str, Any] = {"id": uid, "ts": ts}
        if rng.random() < 0.6:
            value["name"] = f"n{i}"
        if rng.random() < 0.3:
            value["email"] = None if rng.random() < 0.3 else f"e{i}@example.com"
        records.append((uid.encode(), orjson.dumps(value)))
    half = len(records) // 2
    queries = start_map(spark, cfg, "late")
    try:
        produce(kafka_bootstrap, topic, records[:half])
        queries.process_all_available()
        produce(kafka_bootstrap, topic, records[half:])
        queries.process_all_available()
    finally:
        queries.stop()

    # The reference folds in event-time order: (ts, arrival) stands in for (partition, offset).
    by_time = [(orjson.loads(v)["ts"], i, k, v) for i, (k, v) in enumerate(records)]
    expected = fold_merge(by_time, "id")
    assert redis_map(redis_client, "late") == expected
    assert delta_map_rs(Path(table_path(cfg, "late"))) == expected
