"""The worker processes of ``worker_group.py``'s group: started as users start them
(``materializer run --group NAME``, named by ``MATERIALIZER_WORKER_ID``), watched so a
worker that exits by itself stops the benchmark, and weighed: each worker's resident
memory, read from ``/proc`` over its session (driver, JVM and PySpark workers)."""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import redis

from materializer.testing.group import running_workers
from materializer.testing.process import ManagedProcess

MIB = 1024 * 1024


class Group:
    """The worker processes of one group, started as users start them; every one ever
    started is stopped at the end."""

    def __init__(self, work: Path, config: Path, group: str) -> None:
        self.work, self.config, self.group = work, config, group
        self.alive: dict[str, ManagedProcess] = {}
        self.every: list[ManagedProcess] = []
        self.started_at: dict[str, float] = {}

    def start(self) -> str:
        name = f"w{len(self.every) + 1}"
        args = [sys.executable, "-m", "materializer", "run", "-c", str(self.config)]
        self.alive[name] = ManagedProcess(
            [*args, "--group", self.group],
            self.work / f"{name}.log",
            env={**os.environ, "MATERIALIZER_WORKER_ID": name},
        )
        self.every.append(self.alive[name])
        self.started_at[name] = time.perf_counter()
        return name

    def newest(self) -> str:
        return max(self.alive, key=lambda name: self.started_at[name])

    def oldest(self) -> str:
        return min(self.alive, key=lambda name: self.started_at[name])

    def check(self) -> None:
        """Raise, with every worker's log tail, if a worker exited by itself."""
        if all(w.alive() for w in self.alive.values()):
            return
        tails = "\n".join(f"--- {n}\n{w.tail(30)}" for n, w in self.alive.items())
        raise RuntimeError(f"a worker of the group exited by itself:\n{tails}")

    def owners(self, client: redis.Redis, names: list[str]) -> dict[str, str]:
        """Each map's worker as its status says, for the maps that report running."""
        return running_workers(client, names)

    def balanced(self, client: redis.Redis, names: list[str]) -> bool:
        """Every map running on a live worker, each worker running as many as the others
        (two and two); raises if a worker exited."""
        self.check()
        owners = self.owners(client, names)
        counts = collections.Counter(owners.values())
        return (
            len(owners) == len(names)
            and set(counts) == set(self.alive)
            and max(counts.values()) - min(counts.values()) <= 1
        )

    def stop_all(self) -> None:
        for proc in self.every:
            proc.stop()


def session_processes(sid: int) -> list[int]:
    """The processes of a session (a worker's: its driver, JVM and PySpark workers)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rpartition(")")[2].split()[3]) == sid:
                pids.append(int(stat.parent.name))
    return pids


def proc_kib(path: str, field: str) -> int:
    """A ``Field:  N kB`` line of a ``/proc`` file, in bytes; 0 when unreadable."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(path).read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def memory(name: str, proc: ManagedProcess, maps: int) -> dict[str, Any]:
    """One worker's resident memory, Python (driver and PySpark workers) and JVM apart."""
    rss: dict[str, int] = collections.defaultdict(int)
    count: dict[str, int] = collections.defaultdict(int)
    pss = 0
    for pid in session_processes(proc.proc.pid):
        with contextlib.suppress(OSError):
            program = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            kind = "jvm" if program.endswith(b"java") else "python" if b"python" in program else ""
            rss[kind or "other"] += proc_kib(f"/proc/{pid}/status", "VmRSS:")
            count[kind or "other"] += 1
            pss += proc_kib(f"/proc/{pid}/smaps_rollup", "Pss:")
    return {
        "worker": name,
        "maps": maps,
        "python_rss_mib": round(rss["python"] / MIB),
        "python_processes": count["python"],
        "jvm_rss_mib": round(rss["jvm"] / MIB),
        "other_rss_mib": round(rss["other"] / MIB),
        "total_rss_mib": round(sum(rss.values()) / MIB),
        # PySpark's workers are forks of one daemon: their shared pages count once here.
        "total_pss_mib": round(pss / MIB),
    }


def memory_line(group: Group, client: redis.Redis, names: list[str]) -> list[dict[str, Any]]:
    """Every running worker's memory, with the maps it runs and how long it has run."""
    counts = collections.Counter(group.owners(client, names).values())
    now = time.perf_counter()
    return [
        {
            **memory(name, proc, counts[name]),
            "up_s": round(now - group.started_at[name]),
        }
        for name, proc in sorted(group.alive.items())
    ]


def keep_logs(work: Path, into: Path) -> None:
    """Copy every worker's log out of the work folder before it is removed."""
    into.mkdir(parents=True, exist_ok=True)
    for log in work.glob("w*.log"):
        with contextlib.suppress(OSError):
            shutil.copy(log, into / log.name)
