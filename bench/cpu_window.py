"""CPU accounting of a benchmark window: the cores each group of processes used, and how
busy the whole machine was meanwhile (Linux ``/proc``)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of one process (Linux ``/proc``); ``None`` when it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``): with the
    benchmark's own processes, it shows how much other work shared the cores."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class CpuWindow:
    """CPU used by groups of processes between ``begin`` and ``end``, in cores."""

    def __init__(self, groups: dict[str, Sequence[int]]) -> None:
        self.groups = groups

    def _sample(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for name, pids in self.groups.items():
            seconds = [cpu_seconds(p) for p in pids]
            out[name] = None if not pids or None in seconds else sum(s or 0 for s in seconds)
        out["machine"] = machine_busy()
        return out

    def begin(self) -> None:
        self._before, self._at = self._sample(), time.monotonic()

    def end(self) -> dict[str, float | None]:
        after, wall = self._sample(), time.monotonic() - self._at
        cores: dict[str, float | None] = {}
        for name, value in after.items():
            before = self._before[name]
            used = None if value is None or before is None else value - before
            cores[f"{name}_cpu_cores"] = None if used is None else round(used / wall, 2)
        cores["machine_busy_cores"] = cores.pop("machine_cpu_cores")
        return cores


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it now (its JVM, Python workers, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def rss_bytes(pids: Sequence[int]) -> int:
    """The resident memory of the processes, summed (``VmRSS``)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total
