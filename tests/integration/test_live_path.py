"""The real-time path against real Kafka, Redis and Spark: maps that share one query in
Real-time Mode (one of each fold mode) fold as the plain-Python reference does, and a
crash of the whole process group (kill -9) mid-stream repeats and loses nothing, in
Redis, in the changelog or in the dead letters (an ``aggregate`` map's counts and sums
show a record folded twice)."""

from __future__ import annotations

import random
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from materializer.config.names import LIVE_GROUP, changelog_topic, dead_letter_topic
from materializer.contract.redis_layout import entity_key, meta_key
from materializer.contract.watermark import Watermark
from materializer.live.positions import committed
from materializer.testing import Producing, create_topic
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import Event, fold_aggregate, fold_latest, fold_merge
from materializer.testing.waiting import wait_until
from tests.helpers.runs import config_file
from tests.helpers.slices import read_committed

pytestmark = pytest.mark.integration

SCHEMA = "id STRING, name STRING, seq BIGINT"
FIELDS = ["id", "name", "seq"]
KEYS = 40
MODES = ("aggregate", "merge", "latest")
"""The fold modes of ``live_maps``' maps, in their order."""
AGGREGATES = {
    "events": ("count", None),
    "named": ("count", "name"),
    "total": ("sum", "seq"),
    "low": ("min", "seq"),
    "top": ("max", "name"),
    "opening": ("first", "name"),
    "closing": ("last", "seq"),
}
FOLDS: dict[str, dict[str, Any]] = {
    "latest": {"mode": "latest"},
    "merge": {"mode": "merge"},
    "aggregate": {
        "mode": "aggregate",
        "aggregates": {n: {"fn": fn, "field": f} for n, (fn, f) in AGGREGATES.items()},
    },
}


INDEXES: dict[str, list[Any]] = {
    "latest": ["name", {"field": "seq", "kind": "sorted"}],
    "merge": ["name", {"field": "seq", "kind": "sorted"}],
    "aggregate": ["top", {"field": "total", "kind": "sorted"}],
}
"""The indexes of ``live_maps``' maps, by fold mode."""


def indexed(mode: str) -> list[str]:
    """The fields a map of ``mode`` indexes."""
    return [i if isinstance(i, str) else i["field"] for i in INDEXES[mode]]


def reference(mode: str, events: list[Event]) -> dict[str, dict[str, Any]]:
    """What a map folded as ``mode`` holds after ``events``, folded in plain Python."""
    if mode == "aggregate":
        return fold_aggregate(events, "id", AGGREGATES)
    return (fold_merge if mode == "merge" else fold_latest)(events, "id", FIELDS)


def records(
    rng: random.Random, n: int, first: int, mode: str = "latest"
) -> list[tuple[bytes | None, bytes | None]]:
    """``n`` records over ``KEYS`` keys: mostly upserts, some deletes (tombstones), some
    that cannot be folded (not JSON, or without the key field). For a ``merge`` map, some
    upserts leave ``name`` out (it stays) or set it to null (it goes); for an ``aggregate``
    map, some set it to null (``count`` of it skips them, ``first`` takes the null)."""
    out: list[tuple[bytes | None, bytes | None]] = []
    for seq in range(first, first + n):
        key = f"k{rng.randrange(KEYS)}"
        roll = rng.random()
        if roll < 0.08:
            out.append((key.encode(), None))
        elif roll < 0.12:
            out.append((key.encode(), b"{not json " + str(seq).encode()))
        elif roll < 0.14:
            out.append((key.encode(), orjson.dumps({"name": f"no id {seq}", "seq": seq})))
        else:
            doc: dict[str, Any] = {"id": key, "name": f"n{seq}", "seq": seq}
            if mode == "merge" and roll < 0.3:
                doc.pop("name")
            elif mode != "latest" and roll < 0.4:
                doc["name"] = None
            out.append((key.encode(), orjson.dumps(doc)))
    return out


def failing(value: bytes | None) -> bool:
    """Whether the record goes to the dead letters (the reference's skipped records)."""
    if value is None:
        return False
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return True
    return not isinstance(doc, dict) or doc.get("id") is None


class LiveProcess:
    """``tests.helpers.live_process`` over the maps: the real-time query in a process of its own."""

    def __init__(self, config: Path, maps: list[str]) -> None:
        self.args = [sys.executable, "-m", "tests.helpers.live_process", str(config)]
        self.args += [str(config.parent / "live-checkpoint"), *maps]
        self.log = config.parent / "live.log"
        self.proc: ManagedProcess | None = None

    def start(self) -> None:
        self.proc = ManagedProcess(self.args, self.log)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()


def folded_to(client: redis.Redis, name: str, ends: dict[int, int], topic: str) -> bool:
    """Whether the map's watermark has passed every record produced so far."""
    watermark = Watermark.from_hash(client.hgetall(meta_key(name)))
    if watermark is None:
        return False
    reached = watermark.offsets.get(topic, {})
    return all(reached.get(p, 0) >= end for p, end in ends.items())


def live_maps(
    prefix: str, bootstrap: str, redis_url: str, tmp_path: Path, spark: dict[str, Any]
) -> tuple[list[str], dict[str, str], Path]:
    """A map of each of ``MODES``, named from ``prefix``, each of a topic of its own (two
    partitions) holding ``records``' JSON, in a configuration file with ``spark``'s
    settings: their names, their topics and the file."""
    suffix = uuid.uuid4().hex[:8]
    names = [f"{prefix}_{mode[0]}_{suffix}" for mode in MODES]
    topics = {name: create_topic(bootstrap, 2) for name in names}
    doc = {
        "kafka": {"bootstrap_servers": bootstrap},
        "redis": {"url": redis_url},
        "delta": {"root": str(tmp_path / "warehouse")},
        "spark": {**spark, "checkpoint_root": str(tmp_path / "checkpoints")},
        "metrics": {"port": 0},
        "maps": {
            name: {
                "source": {"topics": [topic], "format": "json", "schema": SCHEMA},
                "key": "id",
                "on_error": "dead_letter",
                "fold": FOLDS[mode],
                "indexes": INDEXES[mode],
            }
            for (name, topic), mode in zip(topics.items(), MODES, strict=True)
        },
    }
    return names, topics, config_file(doc, tmp_path)


def test_maps_sharing_a_live_query_equal_the_reference_across_a_kill(
    kafka_bootstrap: str, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    spark = {"master": "local[6]"}
    names, topics, path = live_maps("live", kafka_bootstrap, redis_url, tmp_path, spark)
    rng = random.Random(11)
    produced: dict[str, list[Event]] = {name: [] for name in names}
    ends: dict[str, dict[int, int]] = {name: {} for name in names}
    # One producer for every round: one of its own per round takes half a second to start.
    producer = Producing(kafka_bootstrap)

    def produce_round(n: int, first: int) -> None:
        for name, mode in zip(names, MODES, strict=True):
            batch = records(rng, n, first, mode)
            for (partition, offset), (key, value) in zip(
                producer.send(topics[name], batch), batch, strict=True
            ):
                produced[name].append((partition, offset, key, value))
                ends[name][partition] = max(ends[name].get(partition, 0), offset + 1)

    def stream(rounds: int, n: int, first: int) -> None:
        for i in range(rounds):
            produce_round(n, first + i * n)
            time.sleep(0.01)

    def all_folded() -> bool:
        """Every record in Redis, and its changelog and dead letters committed in Kafka: the
        position of each map's last committed transaction is past it."""
        return all(
            folded_to(redis_client, n, ends[n], topics[n]) and committed_to(n, ends[n])
            for n in names
        )

    def committed_to(name: str, at: dict[int, int]) -> bool:
        group = LIVE_GROUP.replace("{map}", name)
        reached = committed(_config(path).kafka, group, {topics[name]: sorted(at)})
        return all(reached.get(topics[name], {}).get(p, 0) >= end for p, end in at.items())

    live = LiveProcess(path, names)
    live.start()
    try:
        produce_round(300, 0)
        wait_until("the first records folded", all_folded, 240, live.alive)
        # Records keep arriving, a few every 10 ms, while the whole process group is
        # killed mid-stream.
        streaming = threading.Thread(target=lambda: stream(30, 20, 1000))
        streaming.start()
        time.sleep(0.15)
        assert live.proc is not None
        live.proc.kill()
        streaming.join()
        produce_round(300, 5000)
        live.start()
        wait_until("every record folded after the restart", all_folded, 240, live.alive)
    finally:
        if live.proc is not None:
            live.proc.stop()
            if live.proc.proc.returncode not in (0, -15, 143):
                print(live.proc.tail(80), file=sys.stderr)

    for name, mode in zip(names, MODES, strict=True):
        expected = reference(mode, produced[name])
        keys = {k.decode().split(":", 1)[1] for k in redis_client.keys(f"{name}:k*")}
        assert keys == set(expected), name
        for key, entity in expected.items():
            stored = redis_client.get(entity_key(name, key))
            assert stored is not None and orjson.loads(stored) == entity, (name, key)
        # The changelog (as a read_committed reader such as the Delta query sees it): its
        # last record per key is the entity, a tombstone where the key ended deleted.
        last: dict[str, bytes | None] = {}
        for msg in read_committed(kafka_bootstrap, changelog_topic(_config(path), name, 0)):
            last[msg.key().decode()] = msg.value()
        for key in last.keys() | expected.keys():
            value = last.get(key)
            if key in expected:
                assert value is not None and orjson.loads(value) == expected[key], (name, key)
            else:
                assert value is None, (name, key)
        # Every record that cannot be folded is a dead letter once: none lost, none twice.
        letters = read_committed(kafka_bootstrap, dead_letter_topic(_config(path), name))
        sent = sorted((k, v) for _, _, k, v in produced[name] if failing(v))
        assert sorted((m.key(), m.value()) for m in letters) == sent, name


def _config(path: Path) -> Any:
    from materializer.config import load_config

    return load_config(path)


def test_the_state_keys_spark_computes_are_the_layouts(spark: Any) -> None:
    """The real-time query computes each record's state key in Spark
    (``live.columns.state_key_column``); Redis must see the key ``redis_layout.state_key``
    gives, with a hash tag or without, whatever the key holds."""
    from pyspark.sql import functions as F

    from materializer.contract.redis_layout import state_key
    from materializer.live.columns import state_key_column

    keys = ["k37", "a{b}c", "{x}", "{}", "a{}b}", "a{b", "ü{é}", "x\n{y}", "}{a}", "{", "}"]
    keys += ["k{a}{b}", "{{a}}", "", "名前{タグ}"]
    frame = spark.createDataFrame([(k,) for k in keys], "k string")
    rows = frame.select("k", state_key_column("m.g1", F.col("k")).alias("s")).collect()
    assert {r.k: bytes(r.s) for r in rows} == {k: state_key("m.g1", k) for k in keys}
