"""``materializer run`` as users run it: a process, several maps, signals, logs."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import orjson
import pytest
import yaml
from slice_helpers import SCHEMA, redis_map, slice_config, wait_for, watermark

from materializer.testing import produce
from materializer.testing.process import ManagedProcess

pytestmark = pytest.mark.integration


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
        wait_for("the good map's first batch", lambda: watermark(redis_client, "runok") is not None)
        wait_for("the failing map to be reported", lambda: "map runfail failed" in proc.log())
        # The good map goes on after the other failed.
        more = produce(kafka_bootstrap, good_topic, [(b"b", orjson.dumps({"id": "b", "age": 2}))])
        assert more[0][1] > first[0][1]
        wait_for(
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
