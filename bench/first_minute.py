"""A live map's freshness by 30-second window from the moment it shows its first entity,
after a cold start and after a restart on its checkpoints.

Per fold mode: a topic holding one event for each of 100k keys, and a producer
feeding it ``--rate`` events/s over the same keys from before the run starts to
the end; one event in ten is followed until Redis shows it. A ``materializer
run`` of the map (every setting at its default) is launched cold; from the first
entity Redis shows, the samples produced in each ``--window-seconds`` window are
one line's figures, for ``--seconds``. Then the run gets SIGTERM and is launched
again at once, on its checkpoints, and the windows start over from the first
batch the new run folds (its watermark moving past where the old one stopped).

Goals: p99 ≤ 1 s in every window from 30 s after the first entity; p99 ≤ 0.5 s in
a steady state (each window).

    .venv/bin/python bench/first_minute.py [--modes latest,merge,aggregate] [--seconds 180]
        [--path microbatch|realtime]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from bulk_run import any_entity
from freshness import Follower
from harness import PARTITIONS, emit, produce_bulk, services, setup_line
from isolation import folded
from live import nearest_rank, wait_for, write_config
from runtime_maps import Feed

from materializer.testing import create_topic
from materializer.testing.process import ManagedProcess

GOAL_P99_MS = 1000
STEADY_P99_MS = 500
TAIL_SECONDS = 10


def windows(
    follower: Follower, feed: Feed, start: float, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Each window's freshness of the samples sent in it, from ``start``."""
    seen = [
        (feed.sent_at[seq], latency * 1000)
        for seq, latency in zip(follower.sequences, follower.latencies, strict=True)
    ]
    late = [sent for _, _, sent in follower.waiting]
    out = []
    count = int(args.seconds // args.window_seconds)
    for i in range(count):
        lo = start + i * args.window_seconds
        hi = lo + args.window_seconds
        ms = sorted(x for sent, x in seen if lo <= sent < hi)
        p99 = round(nearest_rank(ms, 99), 1) if ms else None
        out.append(
            {
                "from_s": round(i * args.window_seconds),
                "samples": len(ms),
                "unresolved": sum(lo <= sent < hi for sent in late),
                "p50_ms": round(nearest_rank(ms, 50), 1) if ms else None,
                "p99_ms": p99,
                "max_ms": round(ms[-1], 1) if ms else None,
            }
        )
    return out


def measure(
    mode: str,
    bootstrap: str,
    redis_url: str,
    client: redis.Redis,
    topic: str,
    work: Path,
    args: argparse.Namespace,
) -> None:
    config = write_config(work, bootstrap, redis_url, topic, mode, path=args.path)
    follower = Follower(redis_url, mode)
    feed = Feed(bootstrap, topic, args.rate, args.keys, args.sample_every, follower)
    follower.thread.start()
    feed.start()
    marks: dict[str, float] = {}
    try:
        for start in ("cold", "restart"):
            before = folded(client, mode)
            launched = time.perf_counter()
            run = ManagedProcess(
                [sys.executable, "-m", "materializer", "run", "-c", str(config)],
                work / f"{start}.log",
            )
            try:
                if start == "cold":
                    wait_for("the first entity", lambda: any_entity(client, mode), 600, run, 0.05)
                else:
                    wait_for("its first batch", lambda b=before: folded(client, mode) > b, 600, run)
                marks[start] = time.perf_counter()
                marks[f"{start}_launched"] = launched
                # A few seconds past the last window, so its last samples are folded too.
                wait_for(
                    "the windows",
                    lambda s=start: time.perf_counter() > marks[s] + args.seconds + TAIL_SECONDS,
                    args.seconds + 60,
                    run,
                    1.0,
                )
            finally:
                run.stop()
                if args.keep_logs:
                    Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                    shutil.copy(work / f"{start}.log", Path(args.keep_logs) / f"{mode}-{start}.log")
    finally:
        feed.stop()
        follower.finish(drain_seconds=120)
    for start in ("cold", "restart"):
        per_window = windows(follower, feed, marks[start], args)
        judged = [w for w in per_window if w["from_s"] >= 30]
        emit(
            name=f"first_minute_{mode}_{start}",
            path=args.path or "default",
            units="s, ms",
            rate=args.rate,
            achieved_events_per_s=feed.achieved(),
            first_entity_s=round(marks[start] - marks[f"{start}_launched"], 2),
            windows=per_window,
            met_from_30_s=all(
                w["p99_ms"] is not None and w["p99_ms"] <= GOAL_P99_MS and not w["unresolved"]
                for w in judged
            ),
            steady_windows_met=sum(
                w["p99_ms"] is not None and w["p99_ms"] <= STEADY_P99_MS for w in per_window
            ),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--modes", default="latest,merge,aggregate")
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--window-seconds", type=float, default=30)
    parser.add_argument("--sample-every", type=int, default=10)
    parser.add_argument(
        "--path", choices=("microbatch", "realtime"), help="spark.path (default: the run's)"
    )
    parser.add_argument("--keep-logs")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="materializer-first-minute-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        bootstrap, redis_url = stack.enter_context(services())
        setup_line("local[*]", args.keys, args.keys)
        client = redis.Redis.from_url(redis_url)
        stack.callback(client.close)
        for mode in args.modes.split(","):
            client.flushall()
            topic = create_topic(bootstrap, PARTITIONS)
            produce_bulk(bootstrap, topic, args.keys, args.keys)
            (work / mode).mkdir()
            measure(mode, bootstrap, redis_url, client, topic, work / mode, args)
        emit(name="done", loadavg_1m=round(os.getloadavg()[0], 2))


if __name__ == "__main__":
    main()
