"""A map folded by a real run, with the events it was fed: what rehydrate and verify start from."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis
import yaml

from materializer.contract.redis_layout import meta_key
from materializer.contract.watermark import Watermark
from materializer.job import start_map
from materializer.testing import produce
from materializer.testing.reference import fold_latest
from tests.helpers.slices import FIELDS, config, entities, slice_config

NAMES = ["Ann", 'Zoë "Q" \\ back', "line\nbreak\ttab\x01ctl", "☃ snow", "plain"]


def events(start: int, n: int, keys: int) -> list[tuple[bytes | None, bytes | None]]:
    """Updates over ``keys`` keys with some null fields and names that need escaping."""
    out: list[tuple[bytes | None, bytes | None]] = []
    for i in range(start, start + n):
        key = f"u{i % keys}"
        doc: dict[str, Any] = {"id": key, "name": NAMES[i % len(NAMES)]}
        if i % 4:
            doc["age"] = i
        if i % 3:
            doc["tags"] = ["a", f"t{i}"]
        out.append((key.encode(), orjson.dumps(doc)))
    return out


def tombstones(*keys: str) -> list[tuple[bytes | None, bytes | None]]:
    return [(k.encode(), None) for k in keys]


@dataclass
class FoldedMap:
    """A map the pipeline folded, its config file, and what Redis held when it stopped."""

    name: str
    config_file: Path
    doc: dict[str, Any]
    redis_url: str
    produced: list[tuple[int, int, bytes | None, bytes | None]]
    snapshot: dict[str, bytes]
    meta: Watermark

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)

    def reference(self) -> dict[str, Any]:
        return fold_latest(self.produced, "id", FIELDS)


def run_map(
    spark: Any,
    kafka: str,
    redis_url: str,
    topic: str,
    tmp: Path,
    lag_delta: bool,
) -> FoldedMap:
    """Fold events (updates, deletes) into a new map; with ``lag_delta`` the Delta query stops
    halfway, so the table misses the second half that Redis and the changelog have."""
    name = f"rh{uuid.uuid4().hex[:8]}"
    doc = slice_config(tmp, kafka, redis_url, topic, map_name=name)
    cfg = config(doc)
    config_file = tmp / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    first = events(0, 40, 12) + tombstones("u3", "u5") + events(40, 5, 4)
    second = events(100, 20, 30) + tombstones("u1", "u20") + events(200, 3, 2)
    positions = produce(kafka, topic, first)
    queries = start_map(spark, cfg, name)
    try:
        queries.process_all_available()
        if lag_delta:
            queries.side[0].stop()
        positions += produce(kafka, topic, second)
        if lag_delta:
            queries.fold.processAllAvailable()
        else:
            queries.process_all_available()
    finally:
        queries.stop()
    produced = [(p, o, k, v) for (p, o), (k, v) in zip(positions, first + second, strict=True)]
    client = redis.Redis.from_url(redis_url)
    try:
        meta = Watermark.from_hash(client.hgetall(meta_key(name)))
        assert meta is not None
        return FoldedMap(name, config_file, doc, redis_url, produced, entities(client, name), meta)
    finally:
        client.close()
