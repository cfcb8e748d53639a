"""The hand-overs ``worker_group.py`` measures: each map's feed and follower (every sample
Redis showed, as ``live.py`` follows it), a worker killed or stopped until its maps are
fresh again on the survivor, and the ``--kills`` rounds of kill, replacement and settle.
What they return is raw moments; ``worker_group_lines.py`` turns them into the lines."""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import redis
from freshness import Follower
from harness import emit
from live import wait_for
from runtime_maps import Feed
from worker_group_processes import Group, session_processes

FRESH_S = 1.0
"""A map is fresh when Redis shows its sampled events within this of their produce."""


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
