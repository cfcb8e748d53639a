"""``materializer jvm-archive``: write the driver's class data archive by running the product.

The archive holds the classes a JVM loaded, so it is made by a JVM that did what a
run does: a ``materializer run`` of one map per fold mode over a topic of its own
broker, with dead letters, executor- and driver-side batches and Delta MERGEs, on a
Redis of its own (``materializer.testing``). The JVM writes the archive as it exits,
so the run is stopped as an orchestrator would and waited for to the last process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
import yaml

from materializer.contract.redis_layout import meta_key
from materializer.contract.watermark import Watermark
from materializer.errors import SetupError
from materializer.jvm import session_jars
from materializer.spark.class_archive import TRAINING_ENV, archive_path
from materializer.testing import KafkaBroker, RedisServer, create_topic, produce
from materializer.testing.process import ManagedProcess
from materializer.testing.waiting import wait_until

SCHEMA = "id STRING, plan STRING, score DOUBLE, seq BIGINT"
FOLDS = {
    "latest": {"mode": "latest"},
    "merge": {"mode": "merge"},
    "aggregate": {
        "mode": "aggregate",
        "aggregates": {
            "events": {"fn": "count"},
            "score": {"fn": "sum", "field": "score"},
            "plan": {"fn": "last", "field": "plan"},
        },
    },
}
PARTITIONS = 4
BACKLOG = 20_000
"""Events before the run starts: a first batch large enough for the executors' path."""
LIVE = 500
"""Events once it has folded them: batches small enough for the driver's path."""
EXIT_SECONDS = 300.0
"""How long the trained JVM may take to exit: it writes the archive as it does."""


def _events(start: int, count: int) -> list[tuple[bytes, bytes]]:
    rows = []
    for seq in range(start, start + count):
        key = f"k{seq % 2_000}"
        doc = {"id": key, "plan": ("free", "pro")[seq % 2], "score": seq / 7, "seq": seq}
        rows.append((key.encode(), json.dumps(doc).encode()))
    rows.append((b"bad", b"{not json"))  # one for the dead-letter path
    return rows


def _config(work: Path, bootstrap: str, redis_url: str, topic: str) -> Path:
    maps = {
        mode: {
            "source": {"topics": [topic], "format": "json", "schema": SCHEMA},
            "key": "id",
            "fold": fold,
            "on_error": "dead_letter",
        }
        for mode, fold in FOLDS.items()
    }
    doc = {
        "kafka": {"bootstrap_servers": bootstrap},
        "redis": {"url": redis_url},
        "delta": {"root": str(work / "warehouse"), "trigger_interval": "1s"},
        "spark": {"checkpoint_root": str(work / "checkpoints")},
        "catalog": {"topic": f"{topic}.maps"},
        "metrics": {"port": 0},
        "maps": maps,
    }
    path = work / "archive.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _folded(client: redis.Redis, topic: str, ends: dict[int, int]) -> bool:
    for mode in FOLDS:
        mark = Watermark.from_hash(client.hgetall(meta_key(mode)))
        offsets = mark.offsets.get(topic, {}) if mark else {}
        if any(offsets.get(p, -1) < end for p, end in ends.items()):
            return False
    return True


def _tables_written(work: Path) -> bool:
    logs = [work / "warehouse" / mode / "_delta_log" for mode in FOLDS]
    return all(len(list(log.glob("*.json"))) >= 2 for log in logs)


def _ends(positions: list[tuple[int, int]]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for partition, offset in positions:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends


def _exit_in_full(proc: ManagedProcess) -> None:
    """SIGTERM the run and wait for its whole process group: the JVM writes last."""
    group = proc.proc.pid
    proc.proc.send_signal(signal.SIGTERM)
    proc.proc.wait(EXIT_SECONDS)
    deadline = time.monotonic() + EXIT_SECONDS
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise SetupError(f"the trained run's JVM did not exit within {EXIT_SECONDS:.0f} s")


def build_archive(say: Callable[[str], None], force: bool = False) -> Path:
    """Write the archive for this java and these jars (``class_archive.archive_path``);
    one already there is kept unless ``force``."""
    target = archive_path(session_jars())
    if target is None:
        raise SetupError("no java found (JAVA_HOME or PATH): the archive is made by one")
    if target.exists() and not force:
        say(f"up to date: {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    with (
        tempfile.TemporaryDirectory(prefix="materializer-archive-") as tmp,
        KafkaBroker() as kafka,
        RedisServer() as server,
    ):
        work = Path(tmp)
        client = redis.Redis.from_url(server.url)
        topic = create_topic(kafka.bootstrap_servers, PARTITIONS)
        ends = _ends(produce(kafka.bootstrap_servers, topic, _events(0, BACKLOG)))
        config = _config(work, kafka.bootstrap_servers, server.url, topic)
        env = {**os.environ, TRAINING_ENV: str(partial)}
        command = [sys.executable, "-m", "materializer", "run", "-c", str(config)]
        proc = ManagedProcess(command, work / "run.log", env=env)
        try:
            say("a run folds a backlog, then live batches, into Redis and Delta")
            wait_until("the backlog folded", lambda: _folded(client, topic, ends), 600, proc.alive)
            more = produce(kafka.bootstrap_servers, topic, _events(BACKLOG, LIVE))
            ends = {p: max(ends.get(p, 0), e) for p, e in _ends(more).items()}
            wait_until("the live batches", lambda: _folded(client, topic, ends), 600, proc.alive)
            wait_until("the Delta tables", lambda: _tables_written(work), 600, proc.alive)
            say("the run stops; its JVM writes the archive as it exits")
            _exit_in_full(proc)
        except BaseException as exc:
            # A failed run ends its log with a long traceback: enough of it to show the cause.
            log = (work / "run.log").read_text(errors="replace")[-12000:]
            say(f"the run's log ends with:\n{log}")
            if isinstance(exc, Exception):
                raise SetupError(f"the training run failed: {exc}") from None
            raise
        finally:
            proc.stop()
            client.close()
    if not partial.exists():
        raise SetupError(f"the trained JVM exited without writing {partial}")
    partial.replace(target)
    for stale in target.parent.glob("driver-*.jsa"):
        if stale != target:
            stale.unlink()
    return target
