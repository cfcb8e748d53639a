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

    def _sample(self) -> dict[str, dict[int, float]]:
        """CPU seconds of each process of each group that can be read now."""
        out: dict[str, dict[int, float]] = {}
        for name, pids in self.groups.items():
            seconds = {p: cpu_seconds(p) for p in pids}
            out[name] = {p: s for p, s in seconds.items() if s is not None}
        return out

    def begin(self) -> None:
        self._before, self._busy, self._at = self._sample(), machine_busy(), time.monotonic()

    def end(self) -> dict[str, float | None]:
        """Cores per group over the window: the processes read at both ends (a short-lived
        worker that ended inside the window is left out, as its CPU can no longer be read);
        ``None`` for a group none of whose processes lasted the window."""
        after, busy, wall = self._sample(), machine_busy(), time.monotonic() - self._at
        cores: dict[str, float | None] = {}
        for name, now in after.items():
            before = self._before[name]
            lasted = now.keys() & before.keys()
            used = sum(now[p] - before[p] for p in lasted)
            cores[f"{name}_cpu_cores"] = round(used / wall, 2) if lasted else None
        cores["machine_busy_cores"] = round((busy - self._busy) / wall, 2)
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
