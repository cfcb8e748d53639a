"""Each MERGE commit of a map's Delta table records the source offsets its version reflects,
for delta-rs and Spark readers alike, with either merge engine, and never more than the
version's rows hold."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from deltalake import DeltaTable

from materializer.config.names import checkpoint_path
from materializer.contract.redis_layout import table_marks_key
from materializer.contract.table_layout import table_path
from materializer.contract.table_marks import TableMark, decode, table_mark, table_watermark
from materializer.delta.positions import MergedPositions
from materializer.job import start_map
from materializer.testing import produce
from materializer.testing.reference import fold_latest
from tests.helpers.slices import (
    FIELDS,
    config,
    delta_map_rs,
    end_offsets,
    slice_config,
    user_events,
)

Event = tuple[int, int, bytes | None, bytes | None]


@pytest.mark.parametrize("engine", ["delta_rs", "spark"])
def test_each_merge_records_the_source_offsets_its_version_reflects(
    engine, spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(3)
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name="marked")
    doc["delta"]["merge_engine"] = engine
    cfg = config(doc)
    events: list[Event] = []
    queries = start_map(spark, cfg, "marked")
    try:
        for wave in range(3):
            records = user_events(200, 30, seed=wave)
            positions = produce(kafka_bootstrap, topic, records)
            events += [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
            queries.process_all_available()
    finally:
        queries.stop()

    path = table_path(cfg, "marked")
    table = DeltaTable(path)
    ends = end_offsets([(p, o) for p, o, _, _ in events])
    newest = table_watermark(table)
    assert newest is not None
    assert newest.offsets == {topic: ends}

    # The fold appended one mark per committed watermark, the last one naming the same offsets.
    marks = [TableMark.from_entry(f) for _, f in redis_client.xrange(table_marks_key("marked"))]
    assert marks and marks[-1] is not None and marks[-1].watermark == newest

    # Spark's DESCRIBE HISTORY shows the very JSON delta-rs returns, in its userMetadata column.
    history = {c["version"]: c for c in table.history()}
    described = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    by_version = {row["version"]: row["userMetadata"] for row in described}
    merges = [v for v, c in history.items() if c["operation"] == "MERGE"]
    assert merges
    for version in merges:
        assert by_version[version] == history[version]["userMetadata"]
        assert decode(by_version[version]) is not None
    recorded = decode(by_version[max(merges)])
    assert recorded is not None and recorded.watermark == newest
    assert recorded.changelog  # how far the version merged the changelog

    # No version claims a record its rows lack: each key's row is its state after some
    # prefix of its partition that holds every record below the recorded offsets.
    claims = 0
    for version in sorted(merges):
        mark = table_mark(DeltaTable(path, version=version))
        assert mark is not None
        rows = delta_map_rs_at(path, version)
        _assert_reflects(rows, events, mark.watermark.offsets.get(topic, {}))
        claims += 1
    assert claims == len(merges)
    # And the newest holds exactly the reference fold of everything produced.
    assert delta_map_rs(path) == fold_latest(events, "id", FIELDS)


def delta_map_rs_at(path: str, version: int) -> dict[str, Any]:
    rows = DeltaTable(path, version=version).to_pyarrow_table().to_pylist()
    return {r.pop("_key"): {k: v for k, v in r.items() if v is not None} for r in rows}


def _assert_reflects(rows: dict[str, Any], events: list[Event], below: dict[int, int]) -> None:
    """Every key's row (or its absence) is a state the key had once all of its events below
    ``below`` were folded, and never one from before."""
    per_key: dict[str, list[Event]] = {}
    for event in sorted(events, key=lambda e: (e[0], e[1])):
        key = _key(event)
        if key is not None:
            per_key.setdefault(key, []).append(event)
    for key, mine in per_key.items():
        claimed = [e for e in mine if e[1] < below.get(e[0], 0)]
        later = mine[len(claimed) :]
        allowed = [fold_latest(claimed, "id", FIELDS).get(key)]
        allowed += [
            fold_latest(mine[: len(claimed) + i + 1], "id", FIELDS).get(key)
            for i in range(len(later))
        ]
        assert rows.get(key) in allowed, (key, rows.get(key), allowed[0])
    assert set(rows) <= set(per_key)


def _key(event: Event) -> str | None:
    _, _, kafka_key, value = event
    if value is None:
        return None if kafka_key is None else kafka_key.decode()
    doc = orjson.loads(value)
    return str(doc["id"]) if doc.get("id") is not None else None


def test_a_batch_applied_on_the_executors_marks_where_its_changelog_ended(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    """A batch larger than the driver takes is applied by executor tasks, each with its own
    producer: their delivery reports come back with the counts, and the mark holds the
    furthest of them; the first batch's comes from the log ends."""
    from confluent_kafka.admin import AdminClient

    from materializer.clients.kafka_offsets import partition_offsets
    from materializer.config.names import changelog_topic
    from materializer.redis.sink import DRIVER_ROWS

    topic = new_topic(3)
    cfg = config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name="wide"))
    events: list[Event] = []
    queries = start_map(spark, cfg, "wide")
    try:
        for n in (50, DRIVER_ROWS + 2000):
            records = [
                (f"k{i % 4000}".encode(), orjson.dumps({"id": f"k{i % 4000}", "age": i}))
                for i in range(n)
            ]
            positions = produce(kafka_bootstrap, topic, records)
            events += [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
            queries.process_all_available()
    finally:
        queries.stop()

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    changelog = changelog_topic(cfg, "wide")
    log_ends = partition_offsets(admin, [changelog], "latest")[changelog]
    marks = [TableMark.from_entry(f) for _, f in redis_client.xrange(table_marks_key("wide"))]
    assert len(marks) >= 2 and all(m is not None for m in marks)
    assert marks[-1] is not None and marks[-1].changelog == log_ends
    ends = end_offsets([(p, o) for p, o, _, _ in events])
    assert table_watermark(DeltaTable(table_path(cfg, "wide"))) == marks[-1].watermark
    assert marks[-1].watermark.offsets == {topic: ends}


def test_a_delta_batch_takes_the_newest_mark_it_has_reached_and_otherwise_carries_one(
    redis_url, redis_client, tmp_path: Path, monkeypatch
):
    from materializer.config import RedisConfig
    from materializer.contract.watermark import Watermark
    from materializer.delta import marks as delta_marks
    from materializer.delta.marks import SourceOffsets
    from materializer.redis.watermark import WatermarkSink

    name = f"picked{tmp_path.name[-6:]}"
    config = RedisConfig(url=redis_url)
    sink = WatermarkSink(config, name, lambda _: {})
    for batch in range(40):  # more than one read of the stream
        watermark = Watermark(batch, {"src": {0: 100 + batch}}, 1, "fold")
        sink.commit(watermark, {0: 10 * batch, 1: 5 * batch})
    sink.commit(Watermark(39, {"src": {0: 139}}, 1, "fold"), {0: 999, 1: 999})  # a replay
    assert redis_client.xlen(table_marks_key(name)) == 40

    reached: dict[int, dict[str, dict[int, int]]] = {}
    merged = MergedPositions((str(tmp_path / "no-table"), None), "cl")
    offsets = SourceOffsets(config, name, lambda b: reached[b], merged)

    def recorded(batch: int, ends: dict[int, int]) -> int | None:
        reached[batch] = {"cl": ends}
        text = offsets.user_metadata(batch)
        mark = decode(text)
        assert mark is not None and mark.changelog == {"cl": ends}  # always recorded
        return None if mark.watermark is None else mark.watermark.batch_id

    assert recorded(0, {0: 0}) == 0  # partition 1 at 0 too: a missing partition reads as 0
    assert recorded(1, {0: 95, 1: 47}) == 9  # mark 9 ends at (90, 45), mark 10 at (100, 50)
    assert recorded(2, {0: 95, 1: 60}) == 9  # partition 0 holds mark 10 back
    assert recorded(3, {0: 400, 1: 400}) == 39  # past every mark: waits, then takes the newest
    monkeypatch.setattr(delta_marks, "MARK_WAIT_SECONDS", 0.0)
    redis_client.delete(table_marks_key(name))
    assert recorded(4, {0: 500, 1: 500}) == 39  # no mark left: the last one carried


@pytest.mark.parametrize("engine", ["delta_rs", "spark"])
def test_a_delta_query_behind_its_table_starts_where_the_table_stands(
    engine, spark, kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    """Another writer (the real-time path's shared Delta query) merged the changelog past
    the map's own Delta checkpoint: the map's query starts where the table's newest commit
    says and merges no change below it again, which would set keys back to older values."""
    topic = new_topic(3)
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name="behind")
    doc["delta"]["merge_engine"] = engine
    cfg = config(doc)
    own = Path(checkpoint_path(cfg, "behind", "delta"))
    path = table_path(cfg, "behind")
    events: list[Event] = []

    def run(wave: int | None) -> None:
        queries = start_map(spark, cfg, "behind")
        try:
            if wave is not None:
                records = user_events(300, 20, seed=wave)
                positions = produce(kafka_bootstrap, topic, records)
                events.extend(
                    (p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)
                )
            queries.process_all_available()
        finally:
            queries.stop()

    run(0)
    first = DeltaTable(path).version()
    # The map's own Delta query stands still; another writer merges wave 1.
    shutil.move(own, tmp_path / "left-behind")
    run(1)
    merged = table_mark(DeltaTable(path))
    assert merged is not None and merged.changelog
    version = DeltaTable(path).version()
    shutil.rmtree(own)
    shutil.copytree(tmp_path / "left-behind", own)  # the checkpoint the map joined with

    run(None)
    assert DeltaTable(path).version() == version  # wave 1's changes were not merged again

    run(2)
    newest = table_mark(DeltaTable(path))
    assert newest is not None
    for changelog, ends in merged.changelog.items():
        assert all(newest.changelog[changelog][p] >= o for p, o in ends.items())
    for later in range(first + 1, DeltaTable(path).version() + 1):
        mark = table_mark(DeltaTable(path, version=later))
        assert mark is not None and mark.watermark is not None
        _assert_reflects(delta_map_rs_at(path, later), events, mark.watermark.offsets[topic])
    assert delta_map_rs(path) == fold_latest(events, "id", FIELDS)


def test_an_empty_batch_commits_a_newer_mark_of_its_own(
    spark, redis_url, redis_client, tmp_path: Path
):
    """A map that stopped leaves a last mark after its last changes (the real-time path's
    last one): no later MERGE would record it, so the first Delta batch that merges nothing
    commits it alone, once, and an empty batch with no newer mark commits nothing."""
    from materializer import record_columns as c
    from materializer.batch import Batch
    from materializer.config import RedisConfig
    from materializer.contract.watermark import Watermark
    from materializer.delta.marks import SourceOffsets
    from materializer.delta.sink import DeltaSink
    from materializer.redis.watermark import WatermarkSink

    name = f"quiet{tmp_path.name[-6:]}"
    path = str(tmp_path / "table")
    config = RedisConfig(url=redis_url)
    marks = WatermarkSink(config, name, lambda _: {})
    reached: dict[int, dict[str, dict[int, int]]] = {}
    offsets = SourceOffsets(config, name, lambda b: reached[b], MergedPositions((path, None), "cl"))
    sink = DeltaSink(path, user_metadata=offsets.user_metadata, mark_only=offsets.mark_only)
    schema = f"{c.KEY} STRING, {c.DELETED} BOOLEAN, {c.ENTITY} STRUCT<id: STRING>"
    rows = spark.createDataFrame([("k1", False, ("k1",))], schema)
    empty = spark.createDataFrame([], schema)

    marks.commit(Watermark(0, {"src": {0: 5}}, 1, "fold"), {0: 3})
    reached[0] = {"cl": {0: 3}}
    sink.write(Batch(rows, 0, "app"))
    assert table_watermark(DeltaTable(path)) == Watermark(0, {"src": {0: 5}}, 1, "fold")
    version = DeltaTable(path).version()

    reached[1] = {"cl": {0: 3}}
    sink.write(Batch(empty, 1, "app", count=0))  # nothing newer: nothing committed
    assert DeltaTable(path).version() == version
    # Records that changed nothing in the changelog (dead letters), then the stop's mark.
    last = Watermark(7, {"src": {0: 9}}, 2, "live")
    marks.commit(last, {0: 3})
    reached[2] = {"cl": {0: 3}}
    sink.write(Batch(empty, 2, "app", count=0))
    assert DeltaTable(path).version() == version + 1
    assert table_watermark(DeltaTable(path)) == last
    assert delta_map_rs(path) == {"k1": {"id": "k1"}}  # no rows touched
    sink.write(Batch(empty, 2, "app", count=0))  # a replay of the batch
    reached[3] = {"cl": {0: 3}}
    sink.write(Batch(empty, 3, "app", count=0))  # the mark is recorded already
    assert DeltaTable(path).version() == version + 1
    newer = Watermark(8, {"src": {0: 10}}, 3, "live")
    marks.commit(newer, {0: 3})
    reached[4] = {"cl": {0: 3}}
    sink.write(Batch(empty, 4, "app"))  # not counted: found empty as it is read
    assert table_watermark(DeltaTable(path)) == newer
