"""Log lines a collector parses: JSON with the record's own fields, Spark's JVM following."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from materializer.clients import logs
from materializer.clients.logs import JsonFormatter, LogFormat, configure_logging
from materializer.config import SparkConfig
from materializer.spark.session import spark_conf

OPTION = "-Dlog4j2.configurationFile=file:"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level, chosen = root.handlers[:], root.level, logs._format
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logs._format = chosen


def line(record: logging.LogRecord) -> dict[str, object]:
    parsed = orjson.loads(JsonFormatter().format(record))
    assert isinstance(parsed, dict)
    return parsed


def test_a_batch_line_carries_its_fields_as_keys():
    record = logging.makeLogRecord(
        {
            "name": "materializer.batches",
            "levelname": "INFO",
            "msg": "query=%s batch=%d",
            "args": ("users.fold", 7),
            "query": "users.fold",
            "batch": 7,
            "rows_in": 120,
            "rows_out": None,
            "lag": 3,
        }
    )
    entry = line(record)
    assert entry["message"] == "query=users.fold batch=7"
    assert entry["logger"] == "materializer.batches" and entry["level"] == "INFO"
    assert {k: entry[k] for k in ("query", "batch", "rows_in", "rows_out", "lag")} == {
        "query": "users.fold",
        "batch": 7,
        "rows_in": 120,
        "rows_out": None,
        "lag": 3,
    }
    assert str(entry["time"]).endswith("Z")


def test_an_exception_and_a_field_json_cannot_hold_stay_on_one_line():
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.makeLogRecord(
        {"msg": "failed", "exc_info": exc_info, "path": Path("/x/y"), "levelname": "ERROR"}
    )
    text = JsonFormatter().format(record)
    assert "\n" not in text
    entry = orjson.loads(text)
    assert entry["path"] == "/x/y"
    assert "ValueError: bad" in entry["exception"]


def test_json_logging_gives_spark_a_log4j2_file_of_the_same_keys(restore_logging):
    configure_logging("INFO", LogFormat.JSON)
    options = spark_conf(SparkConfig())["spark.driver.extraJavaOptions"]
    option = options.split()[0]
    assert option.startswith(OPTION)
    pattern = Path(option.removeprefix(OPTION)).read_text()
    for key in ("time", "level", "logger", "message", "exception"):
        assert f'"{key}":' in pattern
    # The config's own JVM options follow, so a -D it sets wins over ours.
    own = spark_conf(SparkConfig(conf={"spark.driver.extraJavaOptions": "-Dx=1"}))
    assert own["spark.driver.extraJavaOptions"] == f"{options} -Dx=1"


def test_text_logging_leaves_spark_its_own_configuration(restore_logging):
    configure_logging("INFO", LogFormat.TEXT)
    options = spark_conf(SparkConfig()).get("spark.driver.extraJavaOptions", "")
    assert "log4j2" not in options
    custom = SparkConfig(conf={"spark.driver.extraJavaOptions": "-Dx=1"})
    assert spark_conf(custom)["spark.driver.extraJavaOptions"].split()[-1] == "-Dx=1"


CHILD = """
import logging, os, subprocess
from materializer.clients.logs import LogFormat, configure_logging
configure_logging("ERROR", LogFormat.JSON, own_stderr=True)
logging.getLogger("app").error("mine", extra={"batch": 3})
logging.getLogger("app").info("below the level")
subprocess.run("echo 'WARNING: plain from a child' >&2", shell=True, check=True)
os.write(2, b'{"level":"WARN","logger":"org.apache.spark.X","message":"as is"}\\n')
raise RuntimeError("boom")
"""


def test_a_json_process_turns_everything_on_its_stderr_into_json_lines():
    """What the JVM's launcher, librdkafka or an uncaught exception write to descriptor 2,
    kept whatever the level: it may be why the command failed."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    entries = [orjson.loads(text) for text in done.stderr.splitlines()]
    by_logger = {entry["logger"]: entry for entry in entries}
    assert len(entries) == len(by_logger) == 4, done.stderr
    assert by_logger["app"]["batch"] == 3
    assert by_logger["stderr"]["message"] == "WARNING: plain from a child"
    assert by_logger["org.apache.spark.X"]["message"] == "as is"
    uncaught = by_logger["materializer"]
    assert uncaught["level"] == "CRITICAL" and "RuntimeError: boom" in uncaught["exception"]
