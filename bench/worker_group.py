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
import contextlib
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import redis
import yaml
from harness import PARTITIONS, emit, produce_bulk, services, setup_line
from live import catch_up, map_section, wait_for, write_config
from worker_group_handovers import Stream, failover, hand_over
from worker_group_lines import Lines
from worker_group_processes import Group, keep_logs, memory_line

from materializer.testing import create_topic

MODE = "latest"
MAPS = 4


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
        lines = Lines(streams, args.window_seconds, common)
        lines.failover(rounds)
        lines.graceful(graceful)
        lines.others([*rounds, graceful])


if __name__ == "__main__":
    main()
