"""A map a run starts opens with one small batch of its fold alone, then runs as usual.

The first tests drive the run's supervisor one turn at a time; the last starts
``materializer run`` as users do and reads its batches from outside: its log and Redis."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import redis

from materializer.config import parse_config
from materializer.contract.control import Control
from materializer.job import OPENING_RECORDS
from materializer.run.supervised import SupervisedMap
from materializer.run.supervisor import Supervisor
from materializer.runtime.progress import BatchLog
from materializer.testing import produce
from materializer.testing.reference import Event, fold_latest
from materializer.testing.waiting import wait_until
from tests.helpers.runs import (
    config_file,
    fold_batches,
    keys_written,
    materializer_run,
    records_per_batch,
)
from tests.helpers.slices import (
    FIELDS,
    Produced,
    delta_map_rs,
    end_offsets,
    redis_map,
    slice_config,
    watermark,
)


def _events(kafka: str, topic: str, n: int) -> list[Event]:
    records: list[tuple[bytes | None, bytes | None]] = []
    for i in range(n):
        key = f"u{i % (2 * OPENING_RECORDS)}"
        records.append((key.encode(), orjson.dumps({"id": key, "name": f"n{i}", "age": i % 90})))
    positions = produce(kafka, topic, records)
    return [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]


def _folded(client: redis.Redis, name: str, topic: str) -> int:
    """Records the map's watermark says it has folded."""
    mark = watermark(client, name)
    offsets = mark.offsets.get(topic, {}) if mark else {}
    return sum(offsets.values()) if offsets else 0


def test_a_backlog_opens_with_one_bounded_batch_then_the_rest_with_the_delta_query(
    spark, kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    name = f"open{uuid.uuid4().hex[:6]}"
    events = _events(kafka_bootstrap, topic, 3 * OPENING_RECORDS)
    ends = end_offsets([(p, o) for p, o, _, _ in events])
    cfg = parse_config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name))
    supervisor = Supervisor(spark, cfg, BatchLog())
    m = SupervisedMap(name)
    supervisor.start(m)
    try:
        queries = m.queries
        assert queries is not None and queries.opening
        assert queries.side == []  # the Delta query waits for the fold's first batch
        wait_until("the opening batch", queries.opened)
        assert queries.fold.lastProgress["numInputRows"] == OPENING_RECORDS
        # Its entities show before the rest of the backlog is read.
        assert _folded(redis_client, name, topic) == OPENING_RECORDS
        assert len(redis_map(redis_client, name)) == OPENING_RECORDS  # of 20,000 keys

        supervisor.step(m, Control())
        assert m.state == "running" and m.queries is not queries
        assert not m.queries.opening and len(m.queries.side) == 1
        assert not queries.fold.isActive
        wait_until(
            "every record folded",
            lambda: _folded(redis_client, name, topic) == sum(ends.values()),
        )
        assert redis_map(redis_client, name) == fold_latest(events, "id", FIELDS)
    finally:
        if m.queries is not None:
            m.queries.stop()


def test_a_map_with_nothing_to_fold_opens_at_once(
    spark, kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    topic = new_topic(1)
    name = f"open{uuid.uuid4().hex[:6]}"
    cfg = parse_config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name))
    supervisor = Supervisor(spark, cfg, BatchLog())
    m = SupervisedMap(name)
    supervisor.start(m)
    try:
        assert m.queries is not None and m.queries.opening
        wait_until("the opening's empty trigger", m.queries.opened)
        supervisor.step(m, Control())
        assert m.queries is not None and not m.queries.opening
        events = _events(kafka_bootstrap, topic, 50)
        wait_until("the live records", lambda: redis_map(redis_client, name) != {})
        wait_until(
            "every record folded",
            lambda: redis_map(redis_client, name) == fold_latest(events, "id", FIELDS),
        )
    finally:
        if m.queries is not None:
            m.queries.stop()


def test_a_run_opens_a_map_on_a_backlog_with_one_bounded_batch_then_folds_it_all(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    name = f"open{uuid.uuid4().hex[:6]}"
    fed = Produced(kafka_bootstrap, topic, redis_client, keys=2 * OPENING_RECORDS)
    fed.produce(3 * OPENING_RECORDS)
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name)
    with materializer_run(config_file(doc, tmp_path)) as proc:
        wait_until("every record folded", lambda: fed.folded(name), timeout=600, alive=proc.alive)
        wait_until(
            "the Delta table to hold every entity",
            lambda: delta_map_rs(tmp_path / "warehouse" / name) == fed.expected(),
            alive=proc.alive,
            retry_errors=True,  # no table until the Delta query, after the opening, commits
        )
    log = proc.log()

    # One batch of OPENING_RECORDS first, by the run's log and by the watermark it committed.
    assert f"map {name} opening: one batch of its fold first" in log, log[-3000:]
    assert f"query={name}.fold batch=0 rows_in={OPENING_RECORDS} " in log, log[-3000:]
    batches = fold_batches(redis_client, name)
    first, ends = batches[0]
    assert first == 0 and sum(ends.values()) == OPENING_RECORDS, batches[:3]
    # It wrote the keys of exactly the records below its watermark: 10,000 of 20,000 keys.
    below = {
        key.decode()
        for (partition, offset), (key, _) in zip(fed.positions, fed.records, strict=True)
        if key is not None and offset < ends.get(partition, 0)
    }
    assert len(below) == OPENING_RECORDS
    assert keys_written(redis_client, name, 0) == below

    # Then the map ran as usual and folded the rest, exactly.
    assert f"map {name} running" in log
    sizes = records_per_batch(batches)
    assert len(sizes) > 1 and sum(sizes) == 3 * OPENING_RECORDS, sizes
    assert redis_map(redis_client, name) == fed.expected()
