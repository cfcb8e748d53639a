"""Exactly-once in effect: replayed batches and crashed runs change nothing twice."""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
import yaml
from deltalake.exceptions import TableNotFoundError

from materializer import record_columns as c
from materializer.batch import Batch
from materializer.config import RedisConfig
from materializer.contract.redis_layout import changes_key, meta_key
from materializer.contract.watermark import Watermark
from materializer.delta.sink import DeltaSink
from materializer.redis.watermark import WatermarkSink
from materializer.runtime.crash import CRASH_ENV
from materializer.testing import produce
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import fold_aggregate, fold_latest
from materializer.testing.waiting import wait_until
from tests.helpers.query_redis import write_batch
from tests.helpers.slices import (
    FIELDS,
    delta_map_rs,
    delta_map_spark,
    end_offsets,
    read_committed,
    redis_map,
    slice_config,
    watermark,
)


def _latest_version(spark, path: str) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, path).history(1).select("version").first()[0])


@pytest.mark.parametrize("engine", ["delta_rs", "spark"])
def test_replayed_batch_adds_no_delta_commit(spark, warehouse: Path, engine):
    from pyspark.sql.types import BooleanType, StringType, StructField, StructType

    entity = StructType([StructField("id", StringType()), StructField("name", StringType())])
    rows_schema = StructType(
        [
            StructField(c.KEY, StringType()),
            StructField(c.DELETED, BooleanType()),
            StructField(c.ENTITY, entity),
        ]
    )
    path = str(warehouse / f"replay-{engine}")
    sink = DeltaSink(path, engine=engine)
    first = spark.createDataFrame(
        [("a", False, ("a", "Ann")), ("b", False, ("b", "Bob"))], rows_schema
    )
    sink.write(Batch(first, batch_id=0, app_id="query-1:replay"))
    after_first = _latest_version(spark, path)

    # The same batch again, as after a crash between the Delta commit and the checkpoint commit.
    changed = spark.createDataFrame([("a", False, ("a", "Changed"))], rows_schema)
    sink.write(Batch(changed, batch_id=0, app_id="query-1:replay"))
    assert _latest_version(spark, path) == after_first
    assert delta_map_spark(spark, Path(path)) == {
        "a": {"id": "a", "name": "Ann"},
        "b": {"id": "b", "name": "Bob"},
    }

    # The next batch id commits, and deletes remove rows.
    delete_b = spark.createDataFrame([("b", True, None)], rows_schema)
    sink.write(Batch(delete_b, batch_id=1, app_id="query-1:replay"))
    assert _latest_version(spark, path) == after_first + 1
    assert delta_map_spark(spark, Path(path)) == {"a": {"id": "a", "name": "Ann"}}

    # A new checkpoint restarts batch ids at 0 under a new app id: that write is real.
    sink.write(Batch(changed, batch_id=0, app_id="query-2:replay"))
    assert _latest_version(spark, path) == after_first + 2
    assert delta_map_spark(spark, Path(path)) == {"a": {"id": "a", "name": "Changed"}}


def test_replayed_batch_adds_no_change_entries_and_commits_its_watermark_once(
    redis_url, redis_client
):
    name = f"replayed{random.randrange(10**9)}"
    batch = {"a": b'{"id":"a"}', "b": b'{"id":"b"}'}
    write_batch(redis_url, name, 0, batch, {"t": {0: 2}})
    assert redis_client.xlen(changes_key(name)) == 2
    write_batch(redis_url, name, 0, batch, {"t": {0: 2}})  # the same batch after a crash
    assert redis_client.xlen(changes_key(name)) == 2
    write_batch(redis_url, name, 1, {"a": None}, {"t": {0: 3}})
    assert redis_client.xlen(changes_key(name)) == 3
    assert redis_client.get(f"{name}:a") is None

    sink = WatermarkSink(RedisConfig(url=redis_url), name, lambda _: {})
    committed = Watermark.from_hash(redis_client.hgetall(meta_key(name)))
    assert (committed.batch_id, committed.offsets) == (1, {"t": {0: 3}})
    # An older batch of the same query, replayed, leaves the watermark where it is.
    sink.commit(Watermark(batch_id=0, offsets={"t": {0: 2}}, app_id=committed.app_id))
    assert Watermark.from_hash(redis_client.hgetall(meta_key(name))) == committed
    # A new checkpoint's batch 0 is a new batch, not a replay.
    sink.commit(Watermark(batch_id=0, app_id="q2:replayed"))
    assert Watermark.from_hash(redis_client.hgetall(meta_key(name))) == Watermark(
        batch_id=0, app_id="q2:replayed"
    )


def _txn_versions(table: Path) -> list[tuple[str, int]]:
    """Every (app id, version) transaction recorded in the Delta log, in commit order."""
    found = []
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = orjson.loads(line)
            if "txn" in action:
                found.append((action["txn"]["appId"], int(action["txn"]["version"])))
    return found


MAPS = ("crash", "crash_agg")
AGGREGATES = {
    "events": {"fn": "count"},
    "age_total": {"fn": "sum", "field": "age"},
    "oldest": {"fn": "max", "field": "age"},
    "first_name": {"fn": "first", "field": "name"},
}
AGGREGATES_REFERENCE = {name: (a["fn"], a.get("field")) for name, a in AGGREGATES.items()}


def _events(start: int, n: int, keys: int, rng: random.Random):
    out = []
    for i in range(start, start + n):
        uid = f"k{rng.randrange(keys)}"
        if rng.random() < 0.08:
            out.append((uid.encode(), None))
        else:
            out.append((uid.encode(), orjson.dumps({"id": uid, "name": f"v{i}", "age": i % 90})))
    return out


@pytest.mark.timeout(1500)  # four JVM starts and two maps: slow on a busy machine
def test_kill_9_mid_stream_then_restart_matches_reference(
    kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    doc = slice_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        map_name="crash",
        spark={"conf": {"spark.driver.memory": "1g"}},
    )
    # A second map on the same topic counts and sums per key: its figures are exact
    # only if no event is folded twice or lost across the crashes.
    doc["maps"]["crash_agg"] = {
        **doc["maps"]["crash"],
        "fold": {"mode": "aggregate", "aggregates": AGGREGATES},
        "changelog": {"topic": f"{doc['maps']['crash']['changelog']['topic']}.agg"},
    }
    # Orders enriched with the map's users, exactly once and at least once, in the same run.
    orders_topic = new_topic(2)
    outputs = {g: f"{orders_topic}.{g}" for g in ("exactly_once", "at_least_once")}
    doc["enrichments"] = {
        name: {
            "source": {"topics": [orders_topic]},
            "lookups": [{"map": "crash", "key_field": "user"}],
            "output": {"topic": outputs[guarantee], "guarantee": guarantee},
        }
        for name, guarantee in (("crash_eo", "exactly_once"), ("crash_alo", "at_least_once"))
    }
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    rng = random.Random(7)
    records = _events(0, 2000, 60, rng)
    positions = produce(kafka_bootstrap, topic, records)
    orders: list[str] = []

    produced_lock = threading.Lock()
    stop_producing = threading.Event()

    def keep_producing() -> None:
        start = len(records)
        while not stop_producing.is_set():
            batch = _events(start, 100, 60, rng)
            done = produce(kafka_bootstrap, topic, batch)
            ids = [f"o{len(orders) + i}" for i in range(20)]
            produce(
                kafka_bootstrap,
                orders_topic,
                [(None, orjson.dumps({"id": o, "user": f"k{rng.randrange(60)}"})) for o in ids],
            )
            with produced_lock:
                records.extend(batch)
                positions.extend(done)
                orders.extend(ids)
            start += len(batch)
            stop_producing.wait(0.4)

    def run(crash_after: str | None = None) -> ManagedProcess:
        args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
        env = dict(os.environ)
        if crash_after:
            env[CRASH_ENV] = crash_after
        return ManagedProcess(args, tmp_path / "run.log", env=env)

    def next_batch() -> None:
        before = [watermark(redis_client, m) for m in MAPS]

        def advanced() -> bool:
            after = [watermark(redis_client, m) for m in MAPS]
            return all(
                a is not None and (b is None or a.batch_id > b.batch_id)
                for a, b in zip(after, before, strict=True)
            )

        wait_until("a new batch of every map", advanced, timeout=300)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    # Three crashes: the first two runs kill themselves at a drill's point (between the
    # Redis writes and the Delta commit; after an enrichment's transaction committed but
    # not Spark's batch), the third is killed with kill -9 of the whole process group
    # from outside, anywhere inside a batch. A fourth run finishes the work.
    proc: ManagedProcess | None = None
    try:
        for drill in ("redis", "transaction", None):
            proc = run(crash_after=f"{drill}:{rng.randint(1, 3)}" if drill else None)
            if drill:
                proc.proc.wait(300)
                assert proc.proc.returncode == -signal.SIGKILL, proc.tail()
            else:
                next_batch()
                time.sleep(rng.uniform(0, 1.5))  # anywhere inside the next batch
                proc.kill()
        proc = run()
        next_batch()
        stop_producing.set()
        producer.join(30)
        with produced_lock:
            expected_ends = end_offsets(positions)
        wait_until(
            "the restarted run to catch up",
            lambda: all(
                (w := watermark(redis_client, m)) is not None
                and w.offsets.get(topic) == expected_ends
                for m in MAPS
            ),
            timeout=300,
        )
        events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
        reference = fold_latest(events, "id", FIELDS)
        counts = fold_aggregate(events, "id", AGGREGATES_REFERENCE)

        # The tables trail Redis by a trigger of their own query: wait for them while
        # the run is up, since a stop ends each query after its batch in flight.
        def tables_caught_up() -> bool:
            try:
                return (
                    delta_map_rs(tmp_path / "warehouse" / "crash") == reference
                    and delta_map_rs(tmp_path / "warehouse" / "crash_agg") == counts
                )
            except TableNotFoundError:
                return False  # its first commit is still to come

        wait_until("the Delta tables to catch up", tables_caught_up, timeout=300)

        # Each order's output once for read_committed consumers; at least once otherwise.
        def enriched(guarantee: str) -> list[str]:
            return [
                orjson.loads(m.value())["id"]
                for m in read_committed(kafka_bootstrap, outputs[guarantee])
            ]

        for guarantee in outputs:
            wait_until(
                f"every order enriched ({guarantee})",
                lambda guarantee=guarantee: set(enriched(guarantee)) == set(orders),
                timeout=300,
            )
        assert sorted(enriched("exactly_once")) == sorted(orders)
    finally:
        stop_producing.set()
        if proc is not None:
            proc.stop(timeout=150)
            assert proc.proc.returncode is not None, proc.tail()

    assert redis_map(redis_client, "crash") == reference
    assert delta_map_rs(tmp_path / "warehouse" / "crash") == reference
    assert redis_map(redis_client, "crash_agg") == counts
    assert delta_map_rs(tmp_path / "warehouse" / "crash_agg") == counts

    # No batch id was committed twice to Delta, and all came from one checkpoint's app id.
    for map_name in MAPS:
        txns = _txn_versions(tmp_path / "warehouse" / map_name)
        versions = [v for _, v in txns]
        assert len(set(versions)) == len(versions)
        assert versions == sorted(versions)
        assert len({app for app, _ in txns}) == 1
