"""Where the resolved JVM jars live.

``make jars`` resolves jvm/pom.xml into ``jvm/lib/{spark,kafka}``. An installed
package (a container image, say) points ``MATERIALIZER_JARS_DIR`` at the same
folder. Nothing is ever downloaded when a job starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from materializer.errors import SetupError

JARS_DIR_ENV = "MATERIALIZER_JARS_DIR"


def jars_dir() -> Path:
    """The folder holding ``spark/`` and ``kafka/`` jar folders."""
    env = os.environ.get(JARS_DIR_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "jvm" / "lib"


def jars(module: str) -> list[Path]:
    """The jars of one module (``spark`` or ``kafka``), sorted; an error says how to get them."""
    folder = jars_dir() / module
    found = sorted(folder.glob("*.jar"))
    if not found:
        raise SetupError(
            f"no {module} jars in {folder}: run `make jars` in a checkout, "
            f"or set {JARS_DIR_ENV} to a folder holding the resolved jars"
        )
    return found


def session_jars() -> list[Path]:
    """The jars every Spark session's driver loads: Spark's Kafka source, Delta and Avro, the
    real-time path's writer and the local file system (``spark.session``). Its class data
    archive is made for exactly these."""
    return jars("spark") + jars("live") + jars("localfs")
