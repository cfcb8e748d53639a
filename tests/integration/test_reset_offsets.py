"""``materializer reset-offsets``: a stopped map's fold starts where it is told, state kept."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import redis
import yaml
from typer.testing import CliRunner

from materializer.checkpoints.files import CheckpointFiles
from materializer.cli import app
from materializer.config import parse_config
from materializer.config.names import checkpoint_path
from materializer.contract.redis_layout import status_key
from materializer.contract.status import MapReport
from materializer.job import start_map
from materializer.testing import produce
from materializer.testing.reference import fold_aggregate
from tests.helpers.slices import end_offsets, group_offsets, redis_map, slice_config

AGGREGATES = {"events": ("count", None), "total": ("sum", "age")}
Event = tuple[int, int, bytes | None, bytes | None]


def _records(start: int, n: int) -> list[tuple[bytes | None, bytes | None]]:
    return [
        (f"k{i % 7}".encode(), orjson.dumps({"id": f"k{i % 7}", "age": i}))
        for i in range(start, start + n)
    ]


def _positioned(positions: list[tuple[int, int]], records: list[Any]) -> list[Event]:
    return [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def _group(kafka: str, map_name: str, topic: str) -> dict[int, int]:
    return group_offsets(kafka, f"materializer.{map_name}", topic).get(topic, {})


def test_reset_offsets_replays_skips_and_refuses(
    spark, kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    name = f"reset{uuid.uuid4().hex[:6]}"
    doc = slice_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        map_name=name,
        fold={
            "mode": "aggregate",
            "aggregates": {k: {"fn": fn, "field": f} for k, (fn, f) in AGGREGATES.items()},
        },
    )
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    cfg = parse_config(doc)
    c = str(config_file)

    def fold_available() -> None:
        queries = start_map(spark, cfg, name)
        try:
            queries.process_all_available()
        finally:
            queries.stop()

    never = _cli("reset-offsets", name, "-c", c, "--to", "earliest")
    assert never.exit_code == 2
    assert "has not folded a batch yet" in never.output

    a = _records(0, 40)
    a_events = _positioned(produce(kafka_bootstrap, topic, a), a)
    fold_available()
    assert redis_map(redis_client, name) == fold_aggregate(a_events, "id", AGGREGATES)

    # earliest: every event is read again, and the aggregates' state knows each one: none
    # counts twice.
    dry = _cli("reset-offsets", name, "-c", c, "--to", "earliest", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "nothing changed" in dry.output
    files = CheckpointFiles(checkpoint_path(cfg, name, "fold"))
    batch = files.last_committed()
    assert batch is not None
    assert files.end_offsets(batch) == {topic: end_offsets([(p, o) for p, o, _, _ in a_events])}
    done = _cli("reset-offsets", name, "-c", c, "--to", "earliest")
    assert done.exit_code == 0, done.output
    assert files.end_offsets(batch) == {topic: {0: 0, 1: 0}}
    assert _group(kafka_bootstrap, name, topic) == {0: 0, 1: 0}
    fold_available()
    expected = list(a_events)
    assert redis_map(redis_client, name) == fold_aggregate(expected, "id", AGGREGATES)

    # a time: the events from then on are read again, and still count once.
    time.sleep(0.05)
    since = datetime.now(UTC)
    time.sleep(0.05)
    b = _records(40, 30)
    b_events = _positioned(produce(kafka_bootstrap, topic, b), b)
    fold_available()
    expected += b_events
    at = _cli("reset-offsets", name, "-c", c, "--to", since.isoformat())
    assert at.exit_code == 0, at.output
    first_b = {p: min(o for q, o, _, _ in b_events if q == p) for p, _, _, _ in b_events}
    assert _group(kafka_bootstrap, name, topic) == first_b
    fold_available()
    assert redis_map(redis_client, name) == fold_aggregate(expected, "id", AGGREGATES)

    # latest: what arrived while the map was stopped is skipped for good.
    c_records = _records(70, 20)
    c_events = _positioned(produce(kafka_bootstrap, topic, c_records), c_records)
    latest = _cli("reset-offsets", name, "-c", c, "--to", "latest")
    assert latest.exit_code == 0, latest.output
    d = _records(90, 10)
    d_events = _positioned(produce(kafka_bootstrap, topic, d), d)
    fold_available()
    expected += d_events
    assert redis_map(redis_client, name) == fold_aggregate(expected, "id", AGGREGATES)
    ends = end_offsets([(p, o) for p, o, _, _ in a_events + b_events + c_events + d_events])
    assert _group(kafka_bootstrap, name, topic) == ends

    # refused: a materializer reports the map running, or the position is not one.
    now = int(time.time() * 1000)
    redis_client.hset(status_key(name), mapping=MapReport("running", reported_at_ms=now).to_hash())
    busy = _cli("reset-offsets", name, "-c", c, "--to", "earliest")
    assert busy.exit_code == 2
    assert f"map {name!r} is running" in busy.output
    redis_client.delete(status_key(name))
    bad = _cli("reset-offsets", name, "-c", c, "--to", "yesterday")
    assert bad.exit_code == 2
    assert "--to 'yesterday'" in bad.output
    unknown = _cli("reset-offsets", "nosuchmap", "-c", c, "--to", "earliest")
    assert unknown.exit_code == 2
    assert "maps.nosuchmap: no such map" in unknown.output
