"""``materializer run`` as users run it: a process, several maps, signals, logs."""

from __future__ import annotations

import random
import signal
import sys
from pathlib import Path

import orjson
import yaml

from materializer.testing import produce
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import fold_latest
from materializer.testing.waiting import wait_until
from tests.helpers.slices import FIELDS, SCHEMA, delta_map_rs, redis_map, slice_config, watermark


def test_failed_map_is_reported_the_others_keep_going_and_sigterm_exits(
    kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    good_topic, bad_topic = new_topic(1), new_topic(1)
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, good_topic, map_name="runok")
    doc["maps"]["runfail"] = {
        "source": {"topics": [bad_topic], "schema": SCHEMA},
        "key": "id",
        "on_error": "fail",
    }
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    produce(kafka_bootstrap, bad_topic, [(b"x", b"{broken")])
    first = produce(kafka_bootstrap, good_topic, [(b"a", orjson.dumps({"id": "a", "age": 1}))])

    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    proc = ManagedProcess(args, tmp_path / "run.log")
    try:
        wait_until(
            "the good map's first batch", lambda: watermark(redis_client, "runok") is not None
        )
        wait_until("the failing map to be reported", lambda: "map runfail failed" in proc.log())
        # The good map goes on after the other failed.
        more = produce(kafka_bootstrap, good_topic, [(b"b", orjson.dumps({"id": "b", "age": 2}))])
        assert more[0][1] > first[0][1]
        wait_until(
            "the good map to fold the later record",
            lambda: redis_map(redis_client, "runok").keys() == {"a", "b"},
        )
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.wait(120)
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert proc.proc.returncode == 1, log[-3000:]
    assert "record " in log and "failed at decode" in log
    assert "query=runok.fold batch=0 rows_in=1 rows_out=1" in log
    assert "failed: runfail" in log
    assert watermark(redis_client, "runfail") is None


def test_sigterm_right_after_redis_shows_every_entity_leaves_delta_equal_to_it(
    kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name="stopme")
    # The Delta query's next trigger lies far beyond the test: only the stop can bring the
    # table up to what Redis holds.
    doc["delta"]["trigger_interval"] = "10 minutes"
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    rng = random.Random(5)
    records: list[tuple[bytes, bytes | None]] = []
    for i in range(400):
        key = f"s{rng.randrange(60)}"
        value = None if rng.random() < 0.1 else orjson.dumps({"id": key, "age": i})
        records.append((key.encode(), value))

    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    proc = ManagedProcess(args, tmp_path / "run.log")
    try:
        positions = produce(kafka_bootstrap, topic, records)
        events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
        reference = fold_latest(events, "id", FIELDS)
        wait_until(
            "Redis to hold every entity", lambda: redis_map(redis_client, "stopme") == reference
        )
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.wait(150)
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert proc.proc.returncode == 0, log[-3000:]
    assert delta_map_rs(tmp_path / "warehouse" / "stopme") == reference
    assert redis_map(redis_client, "stopme") == reference
    # A clean stop: no stack trace, nothing cut short.
    assert "Traceback" not in log and "Exception" not in log, log[-3000:]
    assert "cut its Delta table's catch-up short" not in log
    assert "map stopme stopped" in log


def test_json_logs_give_one_object_per_line_with_batch_fields_spark_included(
    kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(1)
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name="jsonlog")
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    produce(kafka_bootstrap, topic, [(b"a", orjson.dumps({"id": "a", "age": 1})), (b"x", b"{")])

    args = [sys.executable, "-m", "materializer", "--log-format", "json", "run"]
    proc = ManagedProcess([*args, "-c", str(config_file)], tmp_path / "run.log")
    try:
        wait_until("the first batch", lambda: watermark(redis_client, "jsonlog") is not None)
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.wait(150)
    finally:
        proc.stop()
    lines = [line for line in proc.log_path.read_text().splitlines() if line.strip()]
    entries = []
    for line in lines:
        entry = orjson.loads(line)  # every line, Spark's and the JVM's included, is JSON
        assert {"time", "level", "logger", "message"} <= entry.keys(), line
        entries.append(entry)
    batches = [e for e in entries if e.get("query") == "jsonlog.fold" and "batch" in e]
    assert batches, lines[-20:]
    first = batches[0]
    assert (first["batch"], first["rows_in"], first["rows_out"]) == (0, 2, 1)
    assert isinstance(first["duration_ms"], int) and first["lag"] == 0
    # Where the batch's time went, by Spark's phases: the sink's work and the checkpoint's.
    assert {"addBatch", "walCommit", "commitOffsets"} <= first["phases_ms"].keys()
    assert all(isinstance(ms, int) for ms in first["phases_ms"].values())
    assert any(e["logger"].startswith("org.apache.") for e in entries), lines[:20]
    assert proc.proc.returncode == 0
