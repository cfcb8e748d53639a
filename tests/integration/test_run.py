"""``materializer run`` as users run it: a process, several maps, signals, logs."""

from __future__ import annotations

import os
import random
import signal
import sys
from pathlib import Path

import orjson
import pytest
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


def _jvm_of(pid: int) -> int:
    """The JVM PySpark started under the driver ``pid``."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].endswith(b"java"):
                return int(child)
    raise AssertionError(f"no JVM under {pid}")


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie not yet reaped counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _deliver(proc: ManagedProcess, path: str) -> None:
    """A stop as the world sends it: to the driver alone (kill), to the run's whole process
    group (a terminal's Ctrl-C or its closing, systemd's KillMode=control-group), or to the
    JVM alone."""
    if path == "driver-sigterm":
        proc.proc.send_signal(signal.SIGTERM)
    elif path == "group-sigterm":
        os.killpg(proc.proc.pid, signal.SIGTERM)
    elif path == "group-sigint":
        os.killpg(proc.proc.pid, signal.SIGINT)
    elif path == "group-sighup":
        os.killpg(proc.proc.pid, signal.SIGHUP)
    elif path == "jvm-sigterm":
        os.kill(_jvm_of(proc.proc.pid), signal.SIGTERM)
    else:
        raise ValueError(path)


@pytest.mark.parametrize(
    "path", ["driver-sigterm", "group-sigterm", "group-sigint", "group-sighup", "jvm-sigterm"]
)
def test_a_stop_right_after_redis_shows_every_entity_leaves_delta_equal_to_it(
    kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path, path: str
):
    topic = new_topic(2)
    name = "stop_" + path.replace("-", "_")
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name)
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
        wait_until("Redis to hold every entity", lambda: redis_map(redis_client, name) == reference)
        jvm = _jvm_of(proc.proc.pid)
        _deliver(proc, path)
        proc.proc.wait(150)
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert proc.proc.returncode == 0, log[-3000:]
    assert delta_map_rs(tmp_path / "warehouse" / name) == reference
    assert redis_map(redis_client, name) == reference
    # A clean stop: no stack trace, nothing cut short, and the JVM gone with the run.
    assert "Traceback" not in log and "Exception" not in log, log[-3000:]
    assert "cut its Delta table's catch-up short" not in log
    assert f"map {name} stopped" in log
    wait_until("the JVM to end with the run", lambda: _gone(jvm))


def test_a_run_writes_its_checkpoints_and_tables_without_a_chmod_or_readlink_process(
    kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    """Hadoop, without its native library, sets each file's permissions by running chmod; a
    stop signal to the run's process group then kills that child under a checkpoint or a
    Delta commit. It also runs readlink on both sides of each rename, twice a checkpoint
    file. The run's local file system does both itself: a ``chmod`` and a ``readlink``
    first on the PATH that fail (as a killed one does) and leave a trace are never run."""
    topic = new_topic(2)
    name = "no_chmod"
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name)
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    stubs, trace = tmp_path / "bin", tmp_path / "children-ran"
    stubs.mkdir()
    for command in ("chmod", "readlink"):
        (stubs / command).write_text(f'#!/bin/sh\necho {command} "$@" >> {trace}\nexit 143\n')
        (stubs / command).chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
    records = [
        (f"c{i % 30}".encode(), orjson.dumps({"id": f"c{i % 30}", "age": i})) for i in range(200)
    ]
    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    proc = ManagedProcess(args, tmp_path / "run.log", env=env)
    try:
        positions = produce(kafka_bootstrap, topic, records)
        events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
        reference = fold_latest(events, "id", FIELDS)
        wait_until("Redis to hold every entity", lambda: redis_map(redis_client, name) == reference)
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.wait(150)
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert proc.proc.returncode == 0, log[-3000:]
    assert delta_map_rs(tmp_path / "warehouse" / name) == reference
    assert not trace.exists(), trace.read_text()
    checkpoint = next((tmp_path / "checkpoints").rglob("commits/0"))
    assert checkpoint.stat().st_mode & 0o777 == 0o644  # Hadoop's default, its umask 022 applied


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


def test_a_driver_killed_alone_takes_its_jvm_with_it(
    kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(1)
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name="orphan")
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    produce(kafka_bootstrap, topic, [(b"a", orjson.dumps({"id": "a", "age": 1}))])

    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    proc = ManagedProcess(args, tmp_path / "run.log")
    try:
        wait_until("the first batch", lambda: watermark(redis_client, "orphan") is not None)
        jvm = _jvm_of(proc.proc.pid)
        os.kill(proc.proc.pid, signal.SIGKILL)  # the driver only: its JVM is not signalled
        proc.proc.wait(30)
        wait_until("the JVM to end with its driver", lambda: _gone(jvm))
    finally:
        proc.stop()
