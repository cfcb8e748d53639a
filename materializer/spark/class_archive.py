"""The driver JVM's class data archive: Spark's classes loaded and verified once, at install.

A cold ``materializer run`` spends seconds of its first minute loading, verifying
and linking the ten thousand classes Spark, Kafka's client and Delta need; on a
machine of few cores that work competes with the first batches. Java's
application class data sharing (a dynamic archive, JDK 13 and later) keeps them
as a memory-mapped file that every later JVM maps instead
(docs/decisions/0024-a-class-data-archive-for-the-driver.md).

An archive holds classes of the JVM's own class path only, and is valid only for
the same JVM build and the same jars. So the driver takes the product's jars on
its class path (``spark_conf``), and the archive's file name is a digest of the
java binary, PySpark's jars and ours: a JVM or a jar that changed reads no stale
archive, it simply starts without one. ``materializer jvm-archive`` writes it
(``make setup`` and the container image run it once).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from materializer.jvm import jars_dir

TRAINING_ENV = "MATERIALIZER_CLASS_ARCHIVE_OUT"
"""Set by ``materializer jvm-archive`` for the run it trains on: that run's driver writes
the archive to this path as its JVM exits, instead of reading one."""


def java_binary() -> Path | None:
    """The java that PySpark will start: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if found is None or not Path(found).exists():
        return None
    return Path(found).resolve()


def _pyspark_jars() -> list[Path]:
    import pyspark

    return sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))


def archive_path(classpath: Sequence[Path]) -> Path | None:
    """Where the archive for this java and these jars lives (it may not exist yet);
    None when no java is found."""
    java = java_binary()
    if java is None:
        return None
    digest = hashlib.sha256()
    for path in [java, *_pyspark_jars(), *classpath]:
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return jars_dir() / "class-archive" / f"driver-{digest.hexdigest()[:16]}.jsa"


def java_options(classpath: Sequence[Path]) -> list[str]:
    """The driver's JVM options for its archive: write one (a training run), read the one
    that matches, or none."""
    training = os.environ.get(TRAINING_ENV)
    if training:
        return [f"-XX:ArchiveClassesAtExit={training}"]
    path = archive_path(classpath)
    if path is None or not path.exists():
        return []
    return [f"-XX:SharedArchiveFile={path}"]
