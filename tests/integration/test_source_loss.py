"""Source records gone before a map read them: retention (here ``delete-records``) under a
map that lags, or a topic deleted and created again behind its checkpoint. The map fails with
a message naming map, topic, partition and the offsets missing, in the run's log and in its
status; ``reset-offsets`` or ``rebuild`` let it go on, as the message and the README say."""

from __future__ import annotations

import logging
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import yaml
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner

from materializer.checkpoints.files import CheckpointFiles
from materializer.cli import app
from materializer.config import parse_config
from materializer.config.names import checkpoint_path
from materializer.contract.control import Control
from materializer.contract.redis_layout import physical_name
from materializer.job import start_map
from materializer.ops.rebuild import rebuild
from materializer.run.supervised import SupervisedMap
from materializer.run.supervisor import Supervisor
from materializer.runtime.progress import BatchLog
from materializer.testing import create_topic, produce
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import Event, fold_latest
from materializer.testing.waiting import wait_until
from materializer.v1 import admin_service_pb2 as admin_pb
from tests.helpers.admin import call
from tests.helpers.slices import FIELDS, SCHEMA, redis_map, slice_config

RESET_OR_REBUILD = (
    "To go on, skip them with `materializer reset-offsets {m} --to earliest` (what the map "
    "holds stays; records it reads again change nothing), or fold it again from what the "
    "topics still hold with `materializer rebuild {m}`; then `materializer restart {m}` (or "
    "start the run again)."
)
REBUILD = (
    "Its state orders events by the old topic's offsets, so the new records would be folded "
    "wrongly: fold it again from what the topics hold now with `materializer rebuild {m}`, "
    "then `materializer restart {m}` (or start the run again)."
)


def _produce(kafka: str, topic: str, partition: int, keys: list[str], tag: str) -> list[Event]:
    """One record per key into one partition: (partition, offset, key, value) of each."""
    records: list[tuple[bytes | None, bytes | None]] = [
        (k.encode(), orjson.dumps({"id": k, "name": f"{tag}-{i}", "age": i}))
        for i, k in enumerate(keys)
    ]
    positions = produce(kafka, topic, records, partition=partition)
    return [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]


def _delete_below(kafka: str, topic: str, partition: int, offset: int) -> None:
    """``kafka-delete-records``: the partition starts at ``offset`` from now on."""
    admin = AdminClient({"bootstrap.servers": kafka})
    for future in admin.delete_records([TopicPartition(topic, partition, offset)]).values():
        future.result(30)


def _recreate(kafka: str, topic: str, partitions: int) -> None:
    """Delete the topic and create it again, empty, under the same name."""
    admin = AdminClient({"bootstrap.servers": kafka})
    admin.delete_topics([topic])[topic].result(30)

    def created() -> bool:
        try:
            create_topic(kafka, partitions, name=topic)
        except KafkaException as exc:  # still being deleted
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            return False
        return True

    wait_until(f"topic {topic} created again", created)


def _fold_available(spark: Any, cfg: Any, name: str) -> None:
    queries = start_map(spark, cfg, name)
    try:
        queries.process_all_available()
    finally:
        queries.stop()


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def _status(config_file: Path, name: str) -> dict[str, Any]:
    result = _cli("status", name, "-c", str(config_file), "--json")
    return orjson.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_fold_spark_fails_over_deleted_records_is_reported_then_reset_or_rebuild(
    spark,
    kafka_bootstrap,
    redis_url,
    redis_client: redis.Redis,
    new_topic,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
):
    topic = new_topic(2)
    name = f"lag{uuid.uuid4().hex[:6]}"
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name)
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    cfg = parse_config(doc)
    c = str(config_file)

    a0 = _produce(kafka_bootstrap, topic, 0, [f"a{i}" for i in range(10)], "a")
    a1 = _produce(kafka_bootstrap, topic, 1, [f"k{i}" for i in range(10)], "a")
    _fold_available(spark, cfg, name)
    assert redis_map(redis_client, name) == fold_latest(a0 + a1, "id", FIELDS)

    # The map lags: wave b arrives, and retention takes partition 0's records up to offset 15
    # before the map reads them (offsets 10 to 14 carry keys nothing else mentions).
    b0 = _produce(kafka_bootstrap, topic, 0, [f"gone{i}" for i in range(5)], "b")
    b0 += _produce(kafka_bootstrap, topic, 0, [f"k{i}" for i in range(5)], "b")
    b1 = _produce(kafka_bootstrap, topic, 1, [f"k{i}" for i in range(5, 15)], "b")
    assert [o for _, o, _, _ in b0] == list(range(10, 20))
    _delete_below(kafka_bootstrap, topic, 0, 15)
    kept = [e for e in b0 if e[1] >= 15] + b1

    # The run's supervisor holds the map's queries when Spark fails its fold.
    supervisor = Supervisor(spark, cfg, BatchLog())
    queries = start_map(spark, cfg, name)
    m = SupervisedMap(name, state="running", queries=queries)
    wait_until("Spark to fail the fold", lambda: not queries.fold.isActive)
    assert "failOnDataLoss" in str(queries.fold.exception())
    with caplog.at_level(logging.ERROR, logger="materializer.run"):
        supervisor.step(m, Control())
    expected = (
        f"map {name} cannot read on from its checkpoint: topic {topic} partition 0: offsets 10 "
        "to 14 were deleted before the map read them (the map's next offset is 10, the "
        f"partition now starts at 15). {RESET_OR_REBUILD.format(m=name)}"
    )
    assert (m.state, m.error) == ("failed", expected)
    assert f"map {name} failed, the others keep running: {expected}" in caplog.text

    # Spark planned a batch over the missing records: the reset drops it and goes on.
    files = CheckpointFiles(checkpoint_path(cfg, name, "fold"))
    planned, committed = files.last_planned(), files.last_committed()
    assert planned is not None and committed is not None and planned > committed
    dry = _cli("reset-offsets", name, "-c", c, "--to", "earliest", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"batch {planned} was planned over records that are gone" in dry.output
    assert files.last_planned() == planned
    reset = _cli("reset-offsets", name, "-c", c, "--to", "earliest")
    assert reset.exit_code == 0, reset.output
    assert files.position() == {topic: {0: 15, 1: 0}}
    _fold_available(spark, cfg, name)
    # Everything folded before stays, the records left are folded once, the gone ones never.
    assert redis_map(redis_client, name) == fold_latest(a0 + a1 + kept, "id", FIELDS)

    # A rebuild folds a new copy from what the topic holds now: partition 0's first wave is
    # gone from Kafka, so from the map too.
    generation = rebuild(spark, cfg, name, grace_seconds=0)
    assert generation == 1
    still_there = fold_latest(a1 + kept, "id", FIELDS)
    assert redis_map(redis_client, physical_name(name, 1)) == still_there
    assert redis_map(redis_client, name) == {}


def test_a_run_names_what_is_gone_in_log_and_status_and_goes_on_after_the_way_out(
    spark, kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    lost_topic, recreated_topic, other_topic = new_topic(2), new_topic(2), new_topic(1)
    suffix = uuid.uuid4().hex[:6]
    lost, recreated, other = f"lost{suffix}", f"recr{suffix}", f"ok{suffix}"
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, other_topic, map_name=other)
    for name, topic in ((lost, lost_topic), (recreated, recreated_topic)):
        doc["maps"][name] = {
            "source": {"topics": [topic], "schema": SCHEMA},
            "key": "id",
            "changelog": {"topic": f"{name}.changelog"},
        }
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    cfg = parse_config(doc)
    c = str(config_file)

    # Both maps fold a first wave, then stop.
    a0 = _produce(kafka_bootstrap, lost_topic, 0, [f"a{i}" for i in range(10)], "a")
    a1 = _produce(kafka_bootstrap, lost_topic, 1, [f"k{i}" for i in range(10)], "a")
    _produce(kafka_bootstrap, recreated_topic, 0, [f"r{i}" for i in range(20)], "old")
    _produce(kafka_bootstrap, recreated_topic, 1, [f"q{i}" for i in range(10)], "old")
    for name in (lost, recreated):
        _fold_available(spark, cfg, name)
    _produce(kafka_bootstrap, other_topic, 0, ["o1"], "o")

    # While they are stopped: retention takes records the first has not read, and the
    # second's topic is deleted and created again with one partition and 5 records.
    b0 = _produce(kafka_bootstrap, lost_topic, 0, [f"gone{i}" for i in range(5)], "b")
    b0 += _produce(kafka_bootstrap, lost_topic, 0, [f"k{i}" for i in range(5)], "b")
    b1 = _produce(kafka_bootstrap, lost_topic, 1, [f"k{i}" for i in range(5, 15)], "b")
    _delete_below(kafka_bootstrap, lost_topic, 0, 15)
    kept = [e for e in b0 if e[1] >= 15] + b1
    _recreate(kafka_bootstrap, recreated_topic, 1)
    new = _produce(kafka_bootstrap, recreated_topic, 0, [f"r{i}" for i in range(5)], "new")

    lost_error = (
        f"map {lost} cannot read on from its checkpoint: topic {lost_topic} partition 0: "
        "offsets 10 to 14 were deleted before the map read them (the map's next offset is 10, "
        f"the partition now starts at 15). {RESET_OR_REBUILD.format(m=lost)}"
    )
    recreated_error = (
        f"map {recreated} cannot read on from its checkpoint: topic {recreated_topic} "
        "partition 0: the map's next offset 20 is past the partition's end 5 (offsets 5 to 19 "
        "were removed: the topic was deleted and created again, or truncated); topic "
        f"{recreated_topic} partition 1 no longer exists (the map's next offset in it was 10; "
        "the topic was deleted, or created again with fewer partitions). "
        f"{REBUILD.format(m=recreated)}"
    )

    args = [sys.executable, "-m", "materializer", "run", "-c", c]
    proc = ManagedProcess(args, tmp_path / "run.log")
    try:
        wait_until("the other map running", lambda: redis_map(redis_client, other) != {})
        wait_until(
            "both maps reported failed",
            lambda: (
                _status(config_file, lost)["state"] == "failed"
                and _status(config_file, recreated)["state"] == "failed"
            ),
        )
        log = proc.log()
        assert f"map {lost} failed, the others keep running: {lost_error}" in log
        assert f"map {recreated} failed, the others keep running: {recreated_error}" in log
        # The same words in `status` (which exits 1 for a failed map) and in GetStatus.
        status = _cli("status", "-c", c)
        assert status.exit_code == 1
        assert f"{lost}: {lost_error}" in " ".join(status.output.split())
        for name, error in ((lost, lost_error), (recreated, recreated_error)):
            assert _status(config_file, name)["error"] == error
            (got,) = call(cfg, "GetStatus", admin_pb.GetStatusRequest(map=name)).maps
            assert (got.state, got.error) == (admin_pb.MapStatus.State.FAILED, error)
        assert _status(config_file, other)["state"] == "running"

        # Records deleted: skip them and restart the map under the live run.
        reset = _cli("reset-offsets", lost, "-c", c, "--to", "earliest")
        assert reset.exit_code == 0, reset.output
        restarted = _cli("restart", lost, "-c", c)
        assert restarted.exit_code == 0, restarted.output
        later = _produce(kafka_bootstrap, lost_topic, 1, ["k1", "late"], "c")
        expected = fold_latest(a0 + a1 + kept + later, "id", FIELDS)
        wait_until("the map to fold on", lambda: redis_map(redis_client, lost) == expected)
        assert _status(config_file, lost)["state"] == "running"
        assert _status(config_file, lost)["error"] == ""

        # A topic created anew: a reset would fold the new records wrongly, so it is refused;
        # a rebuild folds what the new topic holds, and the map goes on on that copy.
        refused = _cli("reset-offsets", recreated, "-c", c, "--to", "earliest")
        assert refused.exit_code == 2
        assert f"not reset: {recreated_error}" in " ".join(refused.output.split())
        assert rebuild(spark, cfg, recreated, grace_seconds=0) == 1
        restarted = _cli("restart", recreated, "-c", c)
        assert restarted.exit_code == 0, restarted.output
        new += _produce(kafka_bootstrap, recreated_topic, 0, ["r1", "r9"], "newer")
        physical = physical_name(recreated, 1)
        expected = fold_latest(new, "id", FIELDS)
        wait_until(
            "the rebuilt map to fold on", lambda: redis_map(redis_client, physical) == expected
        )
        assert _status(config_file, recreated)["state"] == "running"

        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.wait(150)
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert proc.proc.returncode == 0, log[-3000:]
