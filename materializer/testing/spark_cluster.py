"""A Spark standalone cluster (one master, N workers) run from the installed pyspark.

Every daemon is a local process bound to 127.0.0.1 on free ports, so a job can be
checked on real executors (jars shipped, Python workers, a fold applied from
another JVM's tasks) without a cluster manager to set up.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from materializer.errors import SetupError
from materializer.testing.ports import free_port
from materializer.testing.process import ManagedProcess
from materializer.testing.waiting import wait_until

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """The installed pyspark package: it ships ``bin/spark-class`` and Spark's jars."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SetupError("pyspark is not installed: it provides the Spark standalone daemons")
    return Path(spec.origin).parent


def get_json(url: str, timeout: float = 10.0) -> Any:
    """A JSON document from one of Spark's HTTP endpoints."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback http
        return orjson.loads(response.read())


class SparkStandalone:
    """``with SparkStandalone() as c: c.master_url``; stops every daemon on exit.

    The workers' executors are children of their worker's process, so stopping
    a worker's process group also ends any executor it still runs.
    """

    def __init__(
        self,
        workers: int = 2,
        cores_per_worker: int = 1,
        memory_per_worker: str = "1g",
        workdir: Path | None = None,
        daemon_memory: str = "256m",
    ) -> None:
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory_per_worker = memory_per_worker
        self.port = free_port()
        self.webui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.webui_url = f"http://127.0.0.1:{self.webui_port}"
        self._daemon_memory = daemon_memory
        self._workdir = workdir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._procs: list[ManagedProcess] = []

    def _env(self, work: Path) -> dict[str, str]:
        """Daemons (and so executors) on loopback, configured by nothing but their flags."""
        conf_dir = work / "conf"
        conf_dir.mkdir(exist_ok=True)
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_CONF_DIR=str(conf_dir),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(work / "logs"),
            SPARK_DAEMON_MEMORY=self._daemon_memory,
        )
        return env

    def _spark_class(self, main: str, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), main, *args]

    def start(self, timeout: float = 180.0) -> SparkStandalone:
        """Start the master, then the workers; wait until the master lists them all ALIVE."""
        if self._workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="materializer-spark-")
            self._workdir = Path(self._tmp.name)
        work = self._workdir
        (work / "logs").mkdir(parents=True, exist_ok=True)
        env = self._env(work)
        try:
            master = ManagedProcess(
                self._spark_class(
                    MASTER_CLASS,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--webui-port",
                    str(self.webui_port),
                ),
                work / "logs" / "master.log",
                env=env,
            )
            self._procs.append(master)
            wait_until(
                "spark master",
                lambda: "status" in self.state(),
                timeout,
                master.alive,
                retry_errors=True,
            )
            for i in range(self.workers):
                worker_dir = work / f"worker-{i}"
                worker_dir.mkdir(exist_ok=True)
                self._procs.append(
                    ManagedProcess(
                        self._spark_class(
                            WORKER_CLASS,
                            "--host",
                            "127.0.0.1",
                            "--port",
                            str(free_port()),
                            "--webui-port",
                            str(free_port()),
                            "--cores",
                            str(self.cores_per_worker),
                            "--memory",
                            self.memory_per_worker,
                            "--work-dir",
                            str(worker_dir),
                            self.master_url,
                        ),
                        work / "logs" / f"worker-{i}.log",
                        env=env,
                    )
                )
            wait_until(
                f"{self.workers} spark workers",
                lambda: len(self.alive_workers()) == self.workers,
                timeout,
                lambda: all(p.alive() for p in self._procs),
                retry_errors=True,
            )
        except Exception as exc:
            tails = "\n".join(f"--- {p.log_path.name}\n{p.tail(20)}" for p in self._procs)
            self.stop()
            raise SetupError(f"Spark standalone cluster did not start: {exc}\n{tails}") from exc
        return self

    def executor_files(self, app_id: str) -> list[Path]:
        """The files in the working folders of ``app_id``'s executors: where an executor
        keeps what it fetched from the driver (jars, files), and its logs."""
        if self._workdir is None:
            return []
        return sorted(p for p in self._workdir.glob(f"worker-*/{app_id}/*/*") if p.is_file())

    def state(self) -> dict[str, Any]:
        """The master's JSON: ``workers``, ``activeapps``, ``completedapps``, cores in use."""
        state: dict[str, Any] = get_json(f"{self.webui_url}/json/")
        return state

    def alive_workers(self) -> list[dict[str, Any]]:
        """The workers the master counts as ALIVE (a restarted worker leaves a DEAD entry)."""
        return [w for w in self.state()["workers"] if w["state"] == "ALIVE"]

    def executors_by_worker(self, app_id: str) -> dict[str, list[str]]:
        """Executor ids of an application on each ALIVE worker, running or finished.

        The master knows how many cores an application holds, only a worker
        knows which executors it launched, so each worker's own JSON is read.
        """
        out: dict[str, list[str]] = {}
        for worker in self.alive_workers():
            doc = get_json(f"{worker['webuiaddress']}/json/")
            executors = doc.get("executors", []) + doc.get("finishedexecutors", [])
            out[worker["id"]] = [str(e["id"]) for e in executors if e["appid"] == app_id]
        return out

    def logs(self) -> dict[str, str]:
        """The end of each daemon's log, by file name, for error messages."""
        return {p.log_path.name: p.tail() for p in self._procs}

    def stop(self) -> None:
        """Stop the workers (and their executors), then the master; drop a temp work dir."""
        for proc in reversed(self._procs):
            proc.stop(timeout=20)
        self._procs = []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
