"""Shared helpers of the pipeline tests: one-map configs, events, reading the stores back."""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from materializer.config import AppConfig, parse_config
from materializer.contract.redis_layout import RESERVED_KEYS, meta_key
from materializer.contract.watermark import Watermark

if TYPE_CHECKING:
    from materializer.testing import Producing

SCHEMA = "id STRING, name STRING, age INT, tags ARRAY<STRING>"
FIELDS = ["id", "name", "age", "tags"]


def slice_config(
    tmp: Path, kafka: str, redis_url: str, topic: str, map_name: str = "users", **extra: Any
) -> dict[str, Any]:
    """A one-map config document (plain data, so tests can also dump it to YAML).

    The map's changelog topic is new for every document: tests share one
    broker, and a Delta table fed from another test's changelog would hold its
    entities too.
    """
    extra.setdefault("changelog", {"topic": f"{map_name}.changelog.{uuid.uuid4().hex[:8]}"})
    return {
        "kafka": {"bootstrap_servers": kafka},
        "redis": {"url": redis_url},
        # Tests run several materializers on one machine: no fixed metrics port.
        "metrics": {"port": 0},
        "delta": {"root": str(tmp / "warehouse"), "trigger_interval": "500 milliseconds"},
        "spark": {
            # local[2] leaves the real-time path no task slots beyond two cores: these maps
            # fold in micro-batches, said here rather than found out by each run.
            "path": "microbatch",
            "master": "local[2]",
            "checkpoint_root": str(tmp / "checkpoints"),
            "trigger_interval": "200 milliseconds",
            "shuffle_partitions": 2,
            **extra.pop("spark", {}),
        },
        "maps": {map_name: {"source": {"topics": [topic], "schema": SCHEMA}, "key": "id", **extra}},
    }


GROUP_AGGREGATES = {"events": {"fn": "count"}, "age_total": {"fn": "sum", "field": "age"}}
"""The fold of a worker group's maps whose names end in ``agg``."""


def group_config(
    tmp: Path, kafka: str, redis_url: str, topics: dict[str, str], group: str
) -> dict[str, Any]:
    """Maps named by ``topics`` (a name ending in ``agg`` counts and sums per key, the others
    keep each key's latest record), shared by a worker group; one checkpoint folder on
    this host, which every worker of the group reaches."""
    doc: dict[str, Any] = {"maps": {}}
    for name, topic in topics.items():
        one = slice_config(
            tmp,
            kafka,
            redis_url,
            topic,
            map_name=name,
            spark={"conf": {"spark.driver.memory": "768m"}},
        )
        doc = {**one, "maps": {**doc["maps"], **one["maps"]}}
        if name.endswith("agg"):
            doc["maps"][name]["fold"] = {"mode": "aggregate", "aggregates": GROUP_AGGREGATES}
    doc["catalog"] = {"topic": f"maps-{uuid.uuid4().hex[:8]}", "poll_interval": "200 ms"}
    doc["worker"] = {"group": group}
    return doc


def config(doc: dict[str, Any]) -> AppConfig:
    return parse_config(doc)


def entities(client: redis.Redis, map_name: str) -> dict[str, bytes]:
    """Every entity of the map in Redis, as the bytes Redis holds.

    A running fold may delete a key between the SCAN that lists it and its GET (a
    tombstone): such a key is absent, as it would be had the SCAN come a moment later.
    """
    out: dict[str, bytes] = {}
    for key in client.scan_iter(match=f"{map_name}:*", count=1000):
        name = key.decode().split(":", 1)[1]
        value = client.get(key) if name not in RESERVED_KEYS else None
        if value is not None:
            out[name] = value
    return out


def redis_map(client: redis.Redis, map_name: str) -> dict[str, Any]:
    """Every entity of a map in Redis, decoded."""
    return {name: orjson.loads(raw) for name, raw in entities(client, map_name).items()}


def _drop_nulls(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if v is not None}


def delta_map_rs(path: Path | str, storage_options: dict[str, str] | None = None) -> dict[str, Any]:
    """The Delta table read with delta-rs (no JVM), keyed by ``_key``.

    A local table whose folder exists but whose log holds no commit yet is being
    created (Delta makes the folders first): it is read again for a few seconds.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    deadline = time.monotonic() + 10
    while True:
        try:
            table = DeltaTable(str(path), storage_options=storage_options)
            rows = table.to_pyarrow_table().to_pylist()
            return {r.pop("_key"): _drop_nulls(r) for r in rows}
        except TableNotFoundError:
            # The folder (and then _delta_log) exist before the first commit's file does.
            local = storage_options is None and Path(path).is_dir()
            if not local or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def delta_map_spark(spark: Any, path: Path) -> dict[str, Any]:
    """The Delta table read with Spark, keyed by ``_key``."""
    rows = [r.asDict(recursive=True) for r in spark.read.format("delta").load(str(path)).collect()]
    return {r.pop("_key"): _drop_nulls(r) for r in rows}


def watermark(client: redis.Redis, map_name: str) -> Watermark | None:
    return Watermark.from_hash(client.hgetall(meta_key(map_name)))


def end_offsets(positions: list[tuple[int, int]]) -> dict[int, int]:
    """Next offset per partition after the produced records."""
    ends: dict[int, int] = {}
    for partition, offset in positions:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends


def read_topic(bootstrap: str, topic: str) -> list[Any]:
    """Every record of a topic, from the beginning to its end now."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}"})
    out = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            while True:
                msg = consumer.poll(5.0)
                if msg is None:
                    raise AssertionError(f"{topic}/{p} ended before offset {high}")
                if msg.error() is None:
                    out.append(msg)
                    if msg.offset() >= high - 1:
                        break
    finally:
        consumer.close()
    return out


def read_committed(bootstrap: str, topic: str) -> list[Any]:
    """Every committed record of a topic now, as a ``read_committed`` consumer sees them.

    Transaction markers take offsets but are never delivered, so the end is
    where every partition's position reaches its log end, or where polls
    find nothing more.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    out: list[Any] = []
    try:
        partitions = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        idle = 0
        while idle < 3:
            msg = consumer.poll(0.5)
            if msg is None:
                idle += 1
                at = consumer.position([TopicPartition(topic, p) for p in partitions])
                if all(tp.offset >= ends[tp.partition] for tp in at):
                    break
            elif msg.error() is None:
                idle = 0
                out.append(msg)
    finally:
        consumer.close()
    return out


def group_offsets(bootstrap: str, group: str, topic: str) -> dict[str, dict[int, int]]:
    """The group's committed offsets on ``topic`` (partitions without a commit left out),
    asked again for up to 30 s while the group's coordinator loads or moves.

    Read by a consumer of the group, not the admin API: librdkafka's
    ListConsumerGroupOffsets dereferences a consumer's group state that an admin
    client does not have when the coordinator asks to be looked up again (a
    broker just started or resumed), and the process dies of SIGSEGV.
    """
    moving = {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    deadline = time.monotonic() + 30
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        wanted = [TopicPartition(topic, p) for p in partitions]
        while True:
            try:
                held = consumer.committed(wanted, timeout=30)
                break
            except KafkaException as exc:
                if exc.args[0].code() not in moving or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        consumer.close()
    for tp in held:
        if tp.error is not None:
            raise KafkaException(tp.error)
    # Partitions without a commit report OFFSET_INVALID.
    found = {tp.partition: tp.offset for tp in held if tp.offset >= 0}
    return {topic: found} if found else {}


def user_events(n: int, keys: int, seed: int) -> list[tuple[bytes | None, bytes | None]]:
    """Upserts over ``keys`` ids with some tombstones, keyed by id."""
    rng = random.Random(seed)
    out: list[tuple[bytes | None, bytes | None]] = []
    for i in range(n):
        uid = f"u{rng.randrange(keys)}"
        if rng.random() < 0.1:
            out.append((uid.encode(), None))
            continue
        doc = {"id": uid, "name": f"name-{i}", "age": rng.randrange(100)}
        if rng.random() < 0.3:
            doc["tags"] = [f"t{rng.randrange(5)}"]
        if rng.random() < 0.1:
            doc["name"] = None
        out.append((uid.encode(), orjson.dumps(doc)))
    return out


class Produced:
    """Keyed records produced to a topic, and what a ``latest`` map of them should hold."""

    def __init__(self, bootstrap: str, topic: str, client: redis.Redis, keys: int) -> None:
        self.bootstrap, self.topic, self.client, self.keys = bootstrap, topic, client, keys
        self.records: list[tuple[bytes | None, bytes | None]] = []
        self.positions: list[tuple[int, int]] = []
        self.producer: Producing | None = None

    def produce(self, n: int) -> None:
        """``n`` more records over the same keys, ``u<i % keys>``, each with a name and an age."""
        from materializer.testing import Producing

        start = len(self.records)
        records: list[tuple[bytes | None, bytes | None]] = []
        for i in range(start, start + n):
            key = f"u{i % self.keys}"
            records.append((key.encode(), orjson.dumps({"id": key, "name": f"n{i}", "age": i})))
        # One producer for every call: one of its own per call takes half a second to start.
        if self.producer is None:
            self.producer = Producing(self.bootstrap)
        self.positions += self.producer.send(self.topic, records)
        self.records += records

    def folded(self, physical: str) -> bool:
        """Whether that copy of the map has a watermark past every record produced."""
        mark = Watermark.from_hash(self.client.hgetall(meta_key(physical)))
        return mark is not None and mark.offsets.get(self.topic) == end_offsets(self.positions)

    def expected(self) -> dict[str, Any]:
        """The reference fold (``latest``) of every record produced."""
        from materializer.testing.reference import fold_latest

        pairs = zip(self.positions, self.records, strict=True)
        return fold_latest([(p, o, k, v) for (p, o), (k, v) in pairs], "id", FIELDS)
