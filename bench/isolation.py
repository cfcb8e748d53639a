"""A live map's freshness while another map of the same run catches up a long backlog.

One ``materializer run`` with two maps, every setting at its default unless the
variant says: ``live`` (``--mode``, 100k keys, fed at ``--rate`` events/s) and
``backlog`` (``latest`` over a topic holding ``--backlog`` events over 100k keys),
paused before the run starts. Once the live map holds every key, a producer
feeds it to the end; one event in ten is followed until Redis shows it. After
``--warmup-seconds``, a quiet window of ``--window-seconds`` (the baseline), then
``backlog`` is resumed and the live map's samples are taken over
``--seconds`` of its catch-up, with the catch-up's rate (its watermark's
records per second) beside them.

Variants, one run each on the same topics: ``realtime`` (every setting at its default:
the live map on the real-time path, the backlog paced), ``paced`` (the default
``catch_up``, every map on micro-batches: ``spark.path: microbatch``), ``unpaced``
(``paced`` with ``catch_up.max_records_per_batch: null``).

    .venv/bin/python bench/isolation.py [--backlog 10000000] [--variants realtime,paced,unpaced]
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
import yaml
from freshness import Follower
from harness import PARTITIONS, emit, produce_bulk, services, setup_line
from live import catch_up, map_section, nearest_rank, write_config
from runtime_maps import Feed

from materializer.contract.control import MapControl
from materializer.contract.redis_layout import meta_key
from materializer.contract.watermark import Watermark
from materializer.testing import create_topic
from materializer.testing.process import ManagedProcess

GOAL_P99_MS = 1000
BACKLOG_MAP = "backlog"


def folded(client: redis.Redis, name: str) -> int:
    """Records the map's watermark says it folded (its offsets, summed)."""
    mark = Watermark.from_hash(client.hgetall(meta_key(name)))
    if mark is None:
        return 0
    return sum(sum(parts.values()) for parts in mark.offsets.values())


def window(follower: Follower, feed: Feed, start: float, end: float) -> dict[str, Any]:
    """The live map's freshness of the samples sent between ``start`` and ``end``."""
    ms = sorted(
        latency * 1000
        for seq, latency in zip(follower.sequences, follower.latencies, strict=True)
        if start <= feed.sent_at[seq] < end
    )
    late = sum(start <= sent < end for _, _, sent in follower.waiting)
    return {
        "samples": len(ms),
        "unresolved": late,
        "p50_ms": round(nearest_rank(ms, 50), 1) if ms else None,
        "p99_ms": round(nearest_rank(ms, 99), 1) if ms else None,
        "max_ms": round(ms[-1], 1) if ms else None,
    }


def run_variant(
    variant: str,
    bootstrap: str,
    redis_url: str,
    client: redis.Redis,
    live_topic: str,
    backlog_topic: str,
    work: Path,
    args: argparse.Namespace,
) -> None:
    client.flushall()
    work.mkdir()
    config = write_config(work, bootstrap, redis_url, live_topic, args.mode)
    doc = yaml.safe_load(config.read_text())
    backlog = map_section(backlog_topic, "latest")
    if variant == "unpaced":
        backlog["catch_up"] = {"max_records_per_batch": None}
    if variant != "realtime":  # realtime: the run's default, the live map on the path
        doc["spark"]["path"] = "microbatch"
    doc["maps"][BACKLOG_MAP] = backlog
    config.write_text(yaml.safe_dump(doc))
    # Paused before the run starts: it starts only when resumed.
    MapControl(client, BACKLOG_MAP).ask("paused")
    run = ManagedProcess(
        [sys.executable, "-m", "materializer", "run", "-c", str(config)], work / "run.log"
    )
    try:
        catch_up(client, run, args.mode, work, args.keys, time.perf_counter())
        follower = Follower(redis_url, args.mode)
        feed = Feed(bootstrap, live_topic, args.rate, args.keys, args.sample_every, follower)
        follower.thread.start()
        feed.start()
        try:
            time.sleep(args.warmup_seconds)
            quiet = time.perf_counter()
            time.sleep(args.window_seconds)
            resumed = time.perf_counter()
            MapControl(client, BACKLOG_MAP).ask("running")
            counts = [(resumed, folded(client, BACKLOG_MAP))]
            while time.perf_counter() < resumed + args.seconds:
                time.sleep(5)
                counts.append((time.perf_counter(), folded(client, BACKLOG_MAP)))
            end = time.perf_counter()
        finally:
            feed.stop()
            follower.finish(drain_seconds=120)
        (t0, n0), (t1, n1) = counts[0], counts[-1]
        first = next((t for t, n in counts if n > 0), None)
        log = run.log()
        emit(
            name=f"isolation_{variant}",
            units="ms, events/s",
            live_mode=args.mode,
            rate=args.rate,
            achieved_events_per_s=feed.achieved(),
            backlog=args.backlog,
            quiet=window(follower, feed, quiet, resumed),
            during_catch_up=window(follower, feed, resumed, end),
            seconds=round(end - resumed, 1),
            catch_up_events_per_s=round((n1 - n0) / (t1 - t0)),
            backlog_folded=n1,
            backlog_first_batch_s=None if first is None else round(first - resumed, 1),
            slowed_down=log.count("catching up slowed down"),
            goal_p99_ms=GOAL_P99_MS,
        )
    finally:
        run.stop()
        if args.keep_logs:
            Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
            shutil.copy(work / "run.log", Path(args.keep_logs) / f"isolation-{variant}.log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", default="latest", help="the live map's fold mode")
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--backlog", type=int, default=10_000_000)
    parser.add_argument("--warmup-seconds", type=float, default=60)
    parser.add_argument("--window-seconds", type=float, default=30)
    parser.add_argument("--seconds", type=float, default=120, help="measured of the catch-up")
    parser.add_argument("--sample-every", type=int, default=10)
    parser.add_argument("--variants", default="realtime,paced,unpaced")
    parser.add_argument("--keep-logs")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="materializer-isolation-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        bootstrap, redis_url = stack.enter_context(services())
        setup_line("local[*]", args.backlog, args.keys)
        client = redis.Redis.from_url(redis_url)
        stack.callback(client.close)
        live_topic = create_topic(bootstrap, PARTITIONS)
        produce_bulk(bootstrap, live_topic, args.keys, args.keys)
        backlog_topic = create_topic(bootstrap, PARTITIONS)
        emit(
            name="produce_backlog", **produce_bulk(bootstrap, backlog_topic, args.backlog, 100_000)
        )
        for variant in args.variants.split(","):
            run_variant(
                variant,
                bootstrap,
                redis_url,
                client,
                live_topic,
                backlog_topic,
                work / variant,
                args,
            )
        emit(name="done", loadavg_1m=round(os.getloadavg()[0], 2))


if __name__ == "__main__":
    main()
