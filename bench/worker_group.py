"""A worker group through real ``materializer run`` processes: how soon a lost or leaving
worker's maps are fresh again, what the other maps feel meanwhile, and each worker's memory.

Four ``latest`` maps (JSON with a schema, each over a topic of its own with 4
partitions, ``--keys`` keys each, dead letters on, every cadence at its default)
in one file, run by two workers, ``materializer run --group NAME`` each, named by
``MATERIALIZER_WORKER_ID`` (every ``worker`` setting at its default: a 6 s session).
Once every map holds every key in Redis and in Delta and the two workers run two
maps each, a producer feeds ``--rate`` events/s split evenly over the four topics
until the end, and one event in ``--sample-every`` of each map is followed until
Redis shows it (produce to visible, as ``live.py`` measures it). After
``--warmup-seconds``:

- ``worker_group_memory``: the resident memory (``VmRSS`` in ``/proc``) of each
  worker's processes, its session's: the driver's Python, its JVM and any PySpark
  Python workers, summed per worker and split Python / JVM (and the session's
  ``Pss``, where the PySpark workers' pages shared with their daemon count once);
  again, for the workers then running, just before the graceful stop.
- ``worker_group_failover``: ``--kills`` rounds. Each SIGKILLs the process group of
  one worker (the one started last, so the one taking the maps over has run since the
  start, warm as a long-running worker is), as a lost node would. For each map the
  worker ran (its status hash's ``worker`` just before the kill): the seconds from
  the kill until the map is *fresh again*, that is, until the moment Redis first
  shows a sampled event of the map produced after the kill within 1 s of its
  produce (as the follower sees it, polling every 5 ms). Beside it: when its status
  first named the surviving worker as running it (``taken_over_s``), the moved maps'
  p99 over the ``--window-seconds`` before the kill, and the slowest of each one's
  samples produced in the ``--window-seconds`` after it was fresh again
  (``after_fresh_max_ms``: whether it stayed so). After that window a replacement
  worker starts and the group shares the maps two and two again
  (``replacement_shared_s``, from its launch); the maps it is handed wait for its
  first batches, so the round goes on once every map is fresh again
  (``replacement_fresh_s``; ``join_max_ms``, the slowest sample of any map
  meanwhile), and ``--settle-seconds`` later comes the next kill.
- ``worker_group_graceful``: the worker that has run longest gets SIGTERM, the
  process itself, as an orchestrator sends it (a rolling upgrade stops an old worker
  once its replacement has joined): it finishes its batches and leaves the group,
  and the last replacement takes its maps over at once. They are fresh again as
  above, counting only what Redis shows once the worker has exited (it may fold a
  batch more after the SIGTERM). Their extra staleness: the slowest produce to
  visible of their samples produced from 5 s before the SIGTERM until
  ``--window-seconds`` after both are fresh again, minus their p99 over the
  ``--window-seconds`` before that (the steady state). Also the seconds until the
  worker exited, and its exit code.
- ``worker_group_others``: the freshness of the maps the killed or stopped worker
  did not run, over the samples produced in each rebalance's window (from the kill
  or SIGTERM until every moved map is fresh again), all windows together; beside
  each window, the same maps' p99 over the ``--window-seconds`` before it.

Each of these lines gives its goal and whether it was met; a sample never seen
(within 120 s of the end) counts against every goal it falls under. Before them,
``worker_group_start`` (from the workers' launch to the maps whole and shared) and a
``worker_group_kill`` line as each round ends.

    .venv/bin/python bench/worker_group.py [--kills 5] [--rate 5000] [--warmup-seconds 60]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis
import yaml
from freshness import Follower
from harness import PARTITIONS, emit, produce_bulk, services, setup_line
from live import catch_up, map_section, nearest_rank, wait_for, write_config
from runtime_maps import Feed

from materializer.testing import create_topic
from materializer.testing.group import running_workers
from materializer.testing.process import ManagedProcess

MODE = "latest"
MAPS = 4
FRESH_S = 1.0
"""A map is fresh when Redis shows its sampled events within this of their produce."""
FAILOVER_GOAL_S = 30.0
GRACEFUL_GOAL_S = 10.0
OTHERS_GOAL_P99_MS = 1000.0
LEAD_S = 5.0
"""The hand-over window of a graceful stop starts this long before the SIGTERM: events
produced then may wait for the hand-over, and a steady sample takes far less."""
MIB = 1024 * 1024


class Stream:
    """One map's feed and follower: every sample Redis showed, as (produced, visible)."""

    def __init__(
        self,
        name: str,
        topic: str,
        rate: int,
        bootstrap: str,
        redis_url: str,
        args: argparse.Namespace,
    ) -> None:
        self.name = name
        self.follower = Follower(redis_url, name)
        self.feed = Feed(bootstrap, topic, rate, args.keys, args.sample_every, self.follower)

    def start(self) -> None:
        self.follower.thread.start()
        self.feed.start()

    def seen(self, since: float = 0.0) -> list[tuple[float, float]]:
        """(produced, visible) of each sample Redis showed from ``since`` on, in the order
        seen (``perf_counter`` seconds); safe while the follower appends."""
        sequences, latencies = self.follower.sequences, self.follower.latencies
        out: list[tuple[float, float]] = []
        for i in range(len(sequences) - 1, -1, -1):  # latencies[i] is appended first
            sent = self.feed.sent_at[sequences[i]]
            visible = sent + latencies[i]
            if visible < since:
                break
            out.append((sent, visible))
        return out[::-1]

    def fresh_again(self, since: float, gone: float | None = None) -> float | None:
        """When Redis first showed, from ``gone`` on (default ``since``), a sample produced
        from ``since`` on within ``FRESH_S`` of its produce; None: not yet."""
        return next(
            (
                v
                for s, v in self.seen(since if gone is None else gone)
                if s >= since and v - s <= FRESH_S
            ),
            None,
        )

    def latencies_ms(self, start: float, end: float) -> list[float]:
        """Produce to visible of the samples produced in [start, end), sorted."""
        return sorted((v - s) * 1000 for s, v in self.seen() if start <= s < end)

    def unseen(self, start: float, end: float) -> int:
        """Samples produced in [start, end) that Redis never showed (after ``finish``)."""
        return sum(start <= sent < end for _, _, sent in self.follower.waiting)


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
    counts = collections.Counter(group.owners(client, names).values())
    now = time.perf_counter()
    return [
        {
            **memory(name, proc, counts[name]),
            "up_s": round(now - group.started_at[name]),
        }
        for name, proc in sorted(group.alive.items())
    ]


def percentiles(ms: list[float]) -> dict[str, float | None]:
    """p50, p99 and max of sorted milliseconds (nearest rank)."""
    if not ms:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "p50_ms": round(nearest_rank(ms, 50), 1),
        "p99_ms": round(nearest_rank(ms, 99), 1),
        "max_ms": round(ms[-1], 1),
    }


def hand_over(
    group: Group,
    client: redis.Redis,
    streams: dict[str, Stream],
    how: str,
    victim: str,
    timeout: float,
) -> dict[str, Any]:
    """Kill (``kill``) or stop (``stop``) the worker ``victim``; wait until each of its
    maps is fresh again. The moment, the maps that moved, when each was first reported
    running by the survivor and when each was fresh again (seconds from the moment)."""
    names = sorted(streams)
    if not group.balanced(client, names):
        raise RuntimeError("the maps are not shared two and two before a hand-over")
    owners = group.owners(client, names)
    (survivor,) = (name for name in group.alive if name != victim)
    moved = sorted(m for m, w in owners.items() if w == victim)
    proc = group.alive.pop(victim)
    stopped: dict[str, float] = {}

    def stop() -> None:
        proc.stop()  # SIGTERM to the process itself; SIGKILL only past the chart's grace
        stopped["at"] = time.perf_counter()

    stopper = threading.Thread(target=stop, name=f"stop-{victim}")
    at = time.perf_counter()
    if how == "kill":
        proc.kill()  # SIGKILL of its process group, as a lost node
    else:
        stopper.start()
    taken: dict[str, float] = {}
    fresh: dict[str, float] = {}

    def all_fresh() -> bool:
        group.check()
        if any(m not in taken for m in moved):
            now, owners_now = time.perf_counter(), group.owners(client, names)
            for m in moved:
                if m not in taken and owners_now.get(m) == survivor:
                    taken[m] = now - at
        # A worker told to stop may fold a batch more before it goes: what counts is
        # seen once it is gone.
        gone = at if how == "kill" else stopped.get("at")
        if gone is None:
            return False
        for m in moved:
            if m not in fresh:
                visible = streams[m].fresh_again(at, gone)
                if visible is not None:
                    fresh[m] = visible - at
        return len(fresh) == len(moved)

    wait_for(
        f"maps {', '.join(moved)} of {victim} fresh again on {survivor}",
        all_fresh,
        timeout,
        group.alive[survivor],
        interval=0.05,
    )
    out: dict[str, Any] = {
        "worker": victim,
        "survivor": survivor,
        "maps": moved,
        "at": at,
        "fresh_at": at + max(fresh.values()),
        "taken_over_s": {m: round(taken[m], 2) if m in taken else None for m in moved},
        "fresh_again_s": {m: round(fresh[m], 2) for m in moved},
    }
    if how == "kill":  # anything of its session still there once the maps moved
        out["processes_left_behind"] = len(session_processes(proc.proc.pid))
    else:
        out["stopper"], out["stopped"], out["proc"] = stopper, stopped, proc
    return out


def every_map_fresh(group: Group, streams: dict[str, Stream], since: float) -> float | None:
    """When the last of the maps was fresh again from ``since`` on; None: one is not yet.
    Raises if a worker exited."""
    group.check()
    moments = [s.fresh_again(since) for s in streams.values()]
    return None if None in moments else max(m for m in moments if m is not None)


def failover(
    group: Group,
    client: redis.Redis,
    streams: dict[str, Stream],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """``--kills`` rounds: a kill, its maps fresh again, a window, a replacement that takes
    its share, every map fresh again, and a settle."""
    names = sorted(streams)
    rounds = []
    for n in range(1, args.kills + 1):
        moved = hand_over(group, client, streams, "kill", group.newest(), args.takeover_timeout)
        time.sleep(max(0.0, moved["fresh_at"] + args.window_seconds - time.perf_counter()))
        launched = time.perf_counter()
        replacement = group.start()
        wait_for(
            f"{replacement} to take its share of the maps",
            lambda: group.balanced(client, names),
            600,
            group.alive[replacement],
        )
        shared = time.perf_counter()
        # The maps handed to the new worker wait for its first batches: the next kill
        # comes once every map is fresh again, and warm for --settle-seconds.
        wait_for(
            f"every map fresh again after {replacement} joined",
            lambda shared=shared: every_map_fresh(group, streams, shared) is not None,
            args.takeover_timeout,
            group.alive[replacement],
        )
        moved["replacement"] = replacement
        moved["launched"] = launched
        moved["join_fresh_at"] = every_map_fresh(group, streams, shared)
        moved["replacement_shared_s"] = round(shared - launched, 1)
        moved["replacement_fresh_s"] = round(moved["join_fresh_at"] - launched, 1)
        rounds.append({"round": n, **moved})
        emit(
            name="worker_group_kill",
            round=n,
            units="s",
            **{k: v for k, v in moved.items() if not k.endswith("at") and k != "launched"},
        )
        time.sleep(args.settle_seconds)
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=int, default=5000, help="events/s over the four maps")
    parser.add_argument("--keys", type=int, default=25_000, help="keys of each map")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--warmup-seconds", type=float, default=60)
    parser.add_argument(
        "--window-seconds",
        type=float,
        default=20,
        help="after a map is fresh again, before the replacement starts; the steady state "
        "before each kill or stop",
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=30,
        help="after every map is fresh again with the replacement in, before the next kill "
        "or the SIGTERM",
    )
    parser.add_argument("--takeover-timeout", type=float, default=300)
    parser.add_argument("--sample-every", type=int, default=10)
    parser.add_argument("--keep-logs", help="copy every worker's log into this folder")
    args = parser.parse_args()
    if args.kills < 1:
        parser.error("--kills must be at least 1")
    if args.settle_seconds < args.window_seconds:
        parser.error("--settle-seconds must be at least --window-seconds")

    work = Path(tempfile.mkdtemp(prefix="materializer-worker-group-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        bootstrap, redis_url = stack.enter_context(services())
        setup_line("local[*]", 0, args.keys)
        client = redis.Redis.from_url(redis_url)
        stack.callback(client.close)
        names = [f"wg{i}" for i in range(1, MAPS + 1)]
        topics = {name: create_topic(bootstrap, PARTITIONS) for name in names}
        for topic in topics.values():
            produce_bulk(bootstrap, topic, args.keys, args.keys)  # each map starts whole
        config = write_config(work, bootstrap, redis_url, topics[names[0]], MODE)
        doc = yaml.safe_load(config.read_text())
        doc["maps"] = {name: map_section(topic, MODE) for name, topic in topics.items()}
        config.write_text(yaml.safe_dump(doc))

        group = Group(work, config, f"bench-{uuid.uuid4().hex[:8]}")
        if args.keep_logs:  # after every worker stopped
            stack.callback(keep_logs, work, Path(args.keep_logs))
        stack.callback(group.stop_all)
        started = time.perf_counter()
        first = [group.start(), group.start()]
        start = {
            name: catch_up(client, group.alive[first[0]], name, work, args.keys, started)
            for name in names
        }
        wait_for(
            "two maps on each worker",
            lambda: group.balanced(client, names),
            600,
            group.alive[first[1]],
        )
        emit(
            name="worker_group_start",
            units="s",
            shared_s=round(time.perf_counter() - started, 1),
            maps=start,
        )

        streams = {
            name: Stream(
                name,
                topics[name],
                args.rate * (i + 1) // MAPS - args.rate * i // MAPS,
                bootstrap,
                redis_url,
                args,
            )
            for i, name in enumerate(names)
        }
        for stream in streams.values():
            stream.start()
        try:
            time.sleep(args.warmup_seconds)
            warm_memory = memory_line(group, client, names)
            rounds = failover(group, client, streams, args)
            later_memory = memory_line(group, client, names)
            graceful = hand_over(
                group, client, streams, "stop", group.oldest(), args.takeover_timeout
            )
            time.sleep(max(0.0, graceful["fresh_at"] + args.window_seconds - time.perf_counter()))
            graceful["stopper"].join()
        except BaseException:
            for stream in streams.values():
                with contextlib.suppress(RuntimeError):
                    stream.feed.stop()
                stream.follower.finish(drain_seconds=0)
            raise
        for stream in streams.values():
            stream.feed.stop()
        for stream in streams.values():
            stream.follower.finish(drain_seconds=120)

        common = {
            "rate": args.rate,
            "achieved_events_per_s": sum(s.feed.achieved() for s in streams.values()),
            "keys_per_map": args.keys,
            "maps": MAPS,
        }
        emit(
            name="worker_group_memory",
            units="MiB",
            after_warmup=warm_memory,
            before_graceful_stop=later_memory,
            goal=None,
            met=None,
        )
        failover_lines(rounds, streams, args, common)
        graceful_line(graceful, streams, args, common)
        others_line([*rounds, graceful], streams, args, common)


def failover_lines(
    rounds: list[dict[str, Any]],
    streams: dict[str, Stream],
    args: argparse.Namespace,
    common: dict[str, Any],
) -> None:
    per_kill = []
    for r in rounds:
        at, fresh_at = r["at"], r["fresh_at"]
        before = sorted(
            x for m in r["maps"] for x in streams[m].latencies_ms(at - args.window_seconds, at)
        )
        after = {
            m: percentiles(streams[m].latencies_ms(fresh_at, fresh_at + args.window_seconds))[
                "max_ms"
            ]
            for m in r["maps"]
        }
        join = sorted(
            x for s in streams.values() for x in s.latencies_ms(r["launched"], r["join_fresh_at"])
        )
        per_kill.append(
            {
                "round": r["round"],
                "killed": r["worker"],
                "survivor": r["survivor"],
                "fresh_again_s": r["fresh_again_s"],
                "taken_over_s": r["taken_over_s"],
                "before_kill_p99_ms": percentiles(before)["p99_ms"],
                "after_fresh_max_ms": after,
                "processes_left_behind": r["processes_left_behind"],
                "replacement": r["replacement"],
                "replacement_shared_s": r["replacement_shared_s"],
                "replacement_fresh_s": r["replacement_fresh_s"],
                "join_max_ms": percentiles(join)["max_ms"],
            }
        )
    seconds = sorted(s for r in rounds for s in r["fresh_again_s"].values())
    taken = sorted(s for r in rounds for s in r["taken_over_s"].values() if s is not None)
    emit(
        name="worker_group_failover",
        units="s",
        **common,
        kills=len(rounds),
        maps_taken_over=len(seconds),
        session_timeout_s=6,
        fresh_within_s=FRESH_S,
        per_kill=per_kill,
        seconds=seconds,
        p50_s=nearest_rank(seconds, 50),
        p99_s=nearest_rank(seconds, 99),
        max_s=seconds[-1],
        taken_over_p50_s=nearest_rank(taken, 50) if taken else None,
        taken_over_max_s=taken[-1] if taken else None,
        goal_s=FAILOVER_GOAL_S,
        met=seconds[-1] <= FAILOVER_GOAL_S,
    )


def graceful_line(
    graceful: dict[str, Any],
    streams: dict[str, Stream],
    args: argparse.Namespace,
    common: dict[str, Any],
) -> None:
    at, moved = graceful["at"], graceful["maps"]
    steady = sorted(
        x for m in moved for x in streams[m].latencies_ms(at - LEAD_S - args.window_seconds, at)
    )
    end = graceful["fresh_at"] + args.window_seconds
    window = sorted(x for m in moved for x in streams[m].latencies_ms(at - LEAD_S, end))
    unseen = sum(streams[m].unseen(at - LEAD_S, end) for m in moved)
    steady_p99 = nearest_rank(steady, 99)
    extra_s = (window[-1] - steady_p99) / 1000
    proc: ManagedProcess = graceful["proc"]
    exited = graceful["stopped"].get("at")
    emit(
        name="worker_group_graceful",
        units="s, ms",
        **common,
        stopped=graceful["worker"],
        survivor=graceful["survivor"],
        moved_maps=moved,
        worker_exit_s=round(exited - at, 2) if exited is not None else None,
        worker_exit_code=proc.proc.returncode,
        taken_over_s=graceful["taken_over_s"],
        fresh_again_s=graceful["fresh_again_s"],
        steady_samples=len(steady),
        steady_p99_ms=round(steady_p99, 1),
        handover_samples=len(window),
        handover_unresolved=unseen,
        handover_max_ms=round(window[-1], 1),
        handover_p99_ms=round(nearest_rank(window, 99), 1),
        extra_staleness_s=round(extra_s, 2),
        goal_extra_staleness_s=GRACEFUL_GOAL_S,
        met=extra_s <= GRACEFUL_GOAL_S and unseen == 0,
    )


def others_line(
    hand_overs: list[dict[str, Any]],
    streams: dict[str, Stream],
    args: argparse.Namespace,
    common: dict[str, Any],
) -> None:
    windows, all_ms, steady = [], [], []
    unseen = 0
    for h in hand_overs:
        at, others = h["at"], [m for m in streams if m not in h["maps"]]
        ms = sorted(x for m in others for x in streams[m].latencies_ms(at, h["fresh_at"]))
        before = sorted(
            x for m in others for x in streams[m].latencies_ms(at - args.window_seconds, at)
        )
        unseen += sum(streams[m].unseen(at, h["fresh_at"]) for m in others)
        all_ms += ms
        steady += before
        windows.append(
            {
                "after": f"kill {h['round']}" if "round" in h else "SIGTERM",
                "seconds": round(h["fresh_at"] - at, 1),
                "samples": len(ms),
                **percentiles(ms),
                "before_p99_ms": percentiles(before)["p99_ms"],
            }
        )
    all_ms.sort()
    steady.sort()
    p99 = percentiles(all_ms)["p99_ms"]
    emit(
        name="worker_group_others",
        units="ms",
        **common,
        windows=windows,
        samples=len(all_ms),
        unresolved=unseen,
        **percentiles(all_ms),
        steady_before_p99_ms=percentiles(steady)["p99_ms"],
        goal_p99_ms=OTHERS_GOAL_P99_MS,
        met=p99 is not None and p99 <= OTHERS_GOAL_P99_MS and unseen == 0,
    )


def keep_logs(work: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for log in work.glob("w*.log"):
        with contextlib.suppress(OSError):
            shutil.copy(log, into / log.name)


if __name__ == "__main__":
    main()
