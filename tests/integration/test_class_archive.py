"""The driver's class data archive that ``make setup`` writes is the one every session maps,
beside the JVM options every session's driver runs with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from materializer.jvm import session_jars
from materializer.spark.class_archive import TRAINING_ENV, archive_path, java_options
from materializer.spark.session import HUGE_METHODS, IDLE_HEAP

SESSION = """
from materializer.config import SparkConfig
from materializer.spark.session import build_spark_session
spark = build_spark_session(SparkConfig(conf={"spark.driver.extraJavaOptions": "-Xshare:on"}))
args = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
            .getInputArguments())
ours = ("-XX:SharedArchiveFile", "-Xshare", "-XX:G1", "-XX:M", "-XX:-")
print([a for a in args if a.startswith(ours)])
print(spark.range(10).count())
spark.stop()
"""


def test_setup_wrote_the_archive_for_this_java_and_these_jars():
    path = archive_path(session_jars())
    assert path is not None and path.exists(), "make setup runs `materializer jvm-archive`"
    assert java_options(session_jars()) == [f"-XX:SharedArchiveFile={path}"]


def test_a_session_maps_the_archive_and_gives_idle_heap_back():
    # -Xshare:on: a JVM that cannot map its archive (another JVM, a changed jar, a class
    # path that differs from the trained one) refuses to start instead of going on without.
    env = {k: v for k, v in os.environ.items() if k != TRAINING_ENV}
    done = subprocess.run(
        [sys.executable, "-c", SESSION], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    flags, count = done.stdout.strip().splitlines()[-2:]
    assert "SharedArchiveFile" in flags and "-Xshare:on" in flags
    assert all(f"'{option}'" in flags for option in [*IDLE_HEAP, HUGE_METHODS]), flags
    assert count == "10"


def test_another_jar_or_java_names_another_archive(tmp_path: Path, monkeypatch):
    jar = tmp_path / "extra.jar"
    jar.write_bytes(b"one")
    before = archive_path([jar])
    jar.write_bytes(b"other")
    os.utime(jar, ns=(1, 1))
    assert archive_path([jar]) != before
    # Nothing there for that class path: the JVM starts without an archive.
    assert java_options([jar]) == []
    monkeypatch.setenv(TRAINING_ENV, str(tmp_path / "new.jsa"))
    assert java_options([jar]) == [f"-XX:ArchiveClassesAtExit={tmp_path / 'new.jsa'}"]
    monkeypatch.delenv(TRAINING_ENV)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    assert archive_path([jar]) is None
