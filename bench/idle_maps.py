"""What maps without traffic cost a ``materializer run``, as users run it.

For each ``--paths`` value, a ``materializer run`` of one map, then one of ``--maps`` maps
(100), each over a topic of its own (one partition) holding one event; `latest` over JSON
with a schema, every setting at its default. From launch until every map shows its
entity in Redis (and, on ``realtime``, folds on the real-time path) is ``ready_s``; then,
after ``--settle-seconds``, the run's processes (the driver, its JVM, its Python workers)
are measured over ``--seconds``: the cores they keep busy and their resident memory, and
the cores the Kafka broker spends on them (each reader's fetches, each writer's). The
``idle_maps_extra`` line per path is the many-map run less the one-map run, against the
goal: a hundred maps with no traffic cost under 0.1 core and under 300 MiB more than one.

    .venv/bin/python bench/idle_maps.py [--maps 100] [--paths microbatch,realtime]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import redis
import yaml
from cpu_window import CpuWindow, process_tree, rss_bytes
from harness import SCHEMA, broker_pids, emit, machine, services

from materializer.contract.redis_layout import entity_key, status_key
from materializer.contract.status import MapReport
from materializer.testing import create_topic, produce
from materializer.testing.process import ManagedProcess

GOAL_CORES = 0.1
GOAL_MIB = 300


def write_config(
    work: Path,
    bootstrap: str,
    redis_url: str,
    path: str,
    topics: dict[str, str],
    per_query: int | None = None,
) -> Path:
    """The run's file: the maps over their topics, on ``path`` (``per_query`` maps to a
    real-time query when given), everything else default."""
    spark: dict[str, Any] = {"checkpoint_root": str(work / "checkpoints"), "path": path}
    if per_query is not None:
        spark["live_maps_per_query"] = per_query
    doc = {
        "kafka": {"bootstrap_servers": bootstrap},
        "redis": {"url": redis_url},
        "delta": {"root": str(work / "warehouse")},
        "spark": spark,
        "metrics": {"port": 0},
        "maps": {
            name: {"source": {"topics": [topic], "format": "json", "schema": SCHEMA}, "key": "id"}
            for name, topic in topics.items()
        },
    }
    config = work / "maps.yaml"
    config.write_text(yaml.safe_dump(doc))
    return config


def ready(client: redis.Redis, names: list[str], path: str) -> bool:
    """Every map shows its entity, and folds on ``path``."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.exists(entity_key(name, "k"))
        pipe.hgetall(status_key(name))
    replies = pipe.execute()
    for shown, status in zip(replies[::2], replies[1::2], strict=True):
        report = MapReport.from_hash(status)
        if not shown or report is None or report.state != "running":
            return False
        if path == "realtime" and report.fold_path != "realtime":
            return False
    return True


def measure(
    bootstrap: str, redis_url: str, path: str, maps: int, per_query: int | None, args: Any
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"idle-{path}-{maps}-"))
    tag = f"{random.randrange(10**6):06d}"
    topics = {f"idle_{path}_{maps}_{i}_{tag}": create_topic(bootstrap, 1) for i in range(maps)}
    event = orjson.dumps({"id": "k", "name": "one", "age": 1})
    for topic in topics.values():
        produce(bootstrap, topic, [(b"k", event)])
    config = write_config(work, bootstrap, redis_url, path, topics, per_query)
    client = redis.Redis.from_url(redis_url)
    launched = time.monotonic()
    run = ManagedProcess(
        [sys.executable, "-m", "materializer", "run", "-c", str(config)], work / "run.log"
    )
    try:
        while not ready(client, list(topics), path):
            if not run.alive():
                raise RuntimeError(f"the run ended: {run.tail(40)}")
            if time.monotonic() - launched > args.ready_timeout:
                raise RuntimeError(f"not ready in {args.ready_timeout} s: {run.tail(40)}")
            time.sleep(0.5)
        ready_s = time.monotonic() - launched
        time.sleep(args.settle_seconds)
        pids = process_tree(run.proc.pid)
        window = CpuWindow({"run": pids, "broker": broker_pids()})
        window.begin()
        time.sleep(args.seconds)
        cores = window.end()
        rss = rss_bytes(process_tree(run.proc.pid))
    finally:
        run.stop()
        client.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "name": f"idle_maps_{path}",
        "path": path,
        "maps": maps,
        **({"maps_per_query": per_query} if per_query else {}),
        "ready_s": round(ready_s, 1),
        "seconds": args.seconds,
        **cores,
        "rss_mib": round(rss / 2**20),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--maps", type=int, default=100)
    ap.add_argument("--paths", default="microbatch,realtime")
    ap.add_argument(
        "--maps-per-query",
        default="",
        help="spark.live_maps_per_query; several (100,8,1): a many-map run each "
        "(default: the setting's default)",
    )
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--settle-seconds", type=float, default=20)
    ap.add_argument("--ready-timeout", type=float, default=900)
    ap.add_argument("--keep", action="store_true", help="keep each run's folder and log")
    args = ap.parse_args()
    with services() as (bootstrap, redis_url):
        emit(name="setup", **machine())
        for path in args.paths.split(","):
            one = measure(bootstrap, redis_url, path, 1, None, args)
            emit(**one)
            sizes: list[int | None] = [int(n) for n in args.maps_per_query.split(",") if n]
            for per_query in sizes if sizes and path == "realtime" else [None]:
                many = measure(bootstrap, redis_url, path, args.maps, per_query, args)
                emit(**many)
                extra_cores = (many["run_cpu_cores"] or 0) - (one["run_cpu_cores"] or 0)
                extra_mib = many["rss_mib"] - one["rss_mib"]
                extra_broker = (many["broker_cpu_cores"] or 0) - (one["broker_cpu_cores"] or 0)
                emit(
                    name="idle_maps_extra",
                    path=path,
                    maps=args.maps,
                    **({"maps_per_query": per_query} if per_query else {}),
                    extra_cores=round(extra_cores, 2),
                    extra_mib=extra_mib,
                    extra_broker_cores=round(extra_broker, 2),
                    goal_cores=GOAL_CORES,
                    goal_mib=GOAL_MIB,
                    met=extra_cores < GOAL_CORES and extra_mib < GOAL_MIB,
                )


if __name__ == "__main__":
    main()
