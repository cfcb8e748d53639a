"""The real-time path beside the micro-batch path, measured in one run.

Two loads: one map at ``--rate-one`` events/s (5,000 by default), and ``--maps`` maps
(16) sharing ``--rate-many`` events/s (2,000), each map reading a topic of its own. Each
map folds as ``--mode`` says (`latest` by default) over JSON with a schema, 4 partitions a
topic, with dead letters on and a Delta table fed from its changelog (``delta.query``), over
``--keys`` keys in all.

For each load, each path folds maps of its own, one path after the other, each in a Spark
session of its own in this process (the broker, Redis and the producer share the machine;
the JVM stays, so the second path starts warmer than the first):

- ``microbatch``: each map's fold and Delta queries (``job.start_map``), as
  ``materializer run`` starts them today;
- ``realtime``: the maps in Real-time Mode queries of up to ``--maps-per-query`` maps
  each (``spark.live_maps_per_query``'s default), written by the JVM writer
  (``live.start_live``), their Delta tables merged by one shared query (``live.delta``),
  as ``materializer run`` runs maps on the real-time path.

With ``--index-sets`` (``none,city+score`` for instance), each path runs once per set of
indexed fields, declared on every map before it folds (``city`` a hash index, any other
a sorted one): the fold's cost of keeping them, in freshness and in cores (Redis's among
them).

After a prefill (every key's first event), a warm-up of
``--warmup-seconds`` and then ``--seconds`` measured; one event in ``--sample-every`` is
followed until Redis shows it. Each line has the percentiles of produce to visible and
the cores used by Spark's JVM, by this process (the driver's Python and the producer) and
by the whole machine.

    .venv/bin/python bench/live_path.py [--loads one,many] [--seconds 60]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import redis
from confluent_kafka import Producer
from cpu_window import CpuWindow
from freshness import Follower, latency_fields, produce_at_rate, topic_of
from harness import PARTITIONS, broker_pids, emit, event, machine, map_config, services
from pipeline import FOLDS

from materializer import job
from materializer.clients.redis import client_for
from materializer.config import AppConfig, IndexConfig
from materializer.live.delta import DeltaMember, SharedDelta
from materializer.live.query import LiveMap, query_name, start_live
from materializer.redis.indexes import build, declare
from materializer.spark.session import build_spark_session
from materializer.testing import create_topic


def config(
    bootstrap: str,
    redis_url: str,
    work: Path,
    names: list[str],
    topics: list[str],
    master: str,
    mode: str = "latest",
) -> AppConfig:
    """The maps, each over its topic and folded as ``mode``, in a session on ``master``
    (``harness.map_config``'s)."""
    each = [
        map_config(bootstrap, redis_url, work, master, topic, name, FOLDS[mode])
        for name, topic in zip(names, topics, strict=True)
    ]
    return each[0].model_copy(update={"maps": {n: c.maps[n] for c in each for n in c.maps}})


@contextlib.contextmanager
def folding(spark: Any, cfg: AppConfig, path: str, work: Path) -> Iterator[None]:
    """The maps of ``cfg`` folded on ``path`` for the body; their queries stopped after."""
    names = list(cfg.maps)
    stops: list[Any] = []
    if path == "microbatch":
        stops = [job.start_map(spark, cfg, name) for name in names]
    else:
        per_query = cfg.spark.live_maps_per_query
        for index in range(0, len(names), per_query):
            group = [LiveMap(name) for name in names[index : index + per_query]]
            name = query_name(index // per_query, 1)
            checkpoint = str(work / f"live-checkpoint-{name}")
            stops.append(start_live(spark, cfg, group, checkpoint, name=name))
        members = [
            DeltaMember(
                name, 0, cfg, job.map_fold(cfg, name).entity_type(job.records(spark, cfg, name))
            )
            for name in names
        ]
        shared = SharedDelta(spark, cfg, members, str(work / "live-delta"), _failed)
        shared.start()
        stops.append(SimpleNamespace(stop=lambda: shared.stop(time.monotonic() + 60)))
    try:
        yield
    finally:
        for query in stops:
            with contextlib.suppress(Exception):
                query.stop()


def measure(
    bootstrap: str,
    redis_url: str,
    path: str,
    maps: int,
    rate: int,
    commit_every_ms: int,
    args: Any,
    indexes: list[IndexConfig] | None = None,
) -> Any:
    """One path at one load: produce-to-visible percentiles and cores. The micro-batch path
    runs on ``local[*]`` as ``materializer run`` does by default; a real-time query needs a
    task slot for each partition it reads."""
    work = Path(tempfile.mkdtemp(prefix=f"live-path-{path}-"))
    suffix = f"{path}_{maps}_{random.randrange(10**6):06d}"
    names = [f"m{i}_{suffix}" for i in range(maps)]
    topics = [create_topic(bootstrap, PARTITIONS) for _ in names]
    master = "local[*]" if path == "microbatch" else f"local[{maps * PARTITIONS + 2}]"
    cfg = config(bootstrap, redis_url, work, names, topics, master, args.mode)
    if args.delta_trigger_s is not None:
        every = timedelta(seconds=args.delta_trigger_s)
        cfg = cfg.model_copy(
            update={"delta": cfg.delta.model_copy(update={"trigger_interval": every})}
        )
    if commit_every_ms:
        every = timedelta(milliseconds=commit_every_ms)
        cfg = cfg.model_copy(
            update={"spark": cfg.spark.model_copy(update={"live_commit_interval": every})}
        )
    if args.maps_per_query is not None:
        per_query = {"live_maps_per_query": args.maps_per_query}
        cfg = cfg.model_copy(update={"spark": cfg.spark.model_copy(update=per_query)})
    if indexes:
        cfg = cfg.model_copy(
            update={
                "maps": {n: m.model_copy(update={"indexes": indexes}) for n, m in cfg.maps.items()}
            }
        )
        client = client_for(cfg.redis)
        for name in names:
            for field in declare(client, name, indexes):
                build(client, name, field, expiring=False)  # nothing yet: ready at once
    spark = build_spark_session(cfg.spark)
    try:
        line = _measure(spark, cfg, bootstrap, redis_url, path, rate, args)
        return {**line, "indexes": [i.field for i in indexes or []]}
    finally:
        spark.stop()


def _measure(
    spark: Any,
    cfg: AppConfig,
    bootstrap: str,
    redis_url: str,
    path: str,
    rate: int,
    args: Any,
) -> dict[str, Any]:
    names = list(cfg.maps)
    maps = len(names)
    topics = [cfg.map(name).source.topics[0] for name in names]
    work = Path(cfg.spark.checkpoint_root).parent
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    rng = random.Random(rate)
    with folding(spark, cfg, path, work):
        for index in range(args.keys):  # every key once: the prefill
            k, v = event(0, index, rng)
            prod.produce(topics[topic_of(index, maps)], key=k, value=v)
        prod.flush(60)
        produce_at_rate(prod, topics, rate, args.warmup_seconds, args.keys, 0, _none, rng)

        def map_of(key: bytes) -> str:
            return names[topic_of(int(key.decode().rsplit("-", 1)[1]), maps)]

        follower = Follower(redis_url, names[0], map_of)
        follower.thread.start()

        def sampled(key: bytes, seq: int, sent_at: float) -> None:
            if seq % args.sample_every == 0:
                follower.samples.put((key, seq, sent_at))

        redis_pid = int(redis.Redis.from_url(redis_url).info("server")["process_id"])
        window = CpuWindow(
            {
                "driver": [os.getpid()],
                "spark_jvm": _spark_jvm(),
                "broker": broker_pids(),
                "redis": [redis_pid],
            }
        )
        window.begin()
        achieved = produce_at_rate(prod, topics, rate, args.seconds, args.keys, 10**9, sampled, rng)
        cores = window.end()
        unresolved = follower.finish(drain_seconds=60)
    return {
        "name": f"live_path_{path}",
        "path": path,
        "mode": args.mode,
        "maps": maps,
        "offered_events_per_s": rate,
        "achieved_events_per_s": achieved,
        "seconds": args.seconds,
        **latency_fields(follower.latencies),
        "unresolved": unresolved,
        **cores,
        "master": cfg.spark.master,
        "delta_trigger_s": cfg.delta.trigger_interval.total_seconds(),
        **(
            {
                "commit_every_ms": round(cfg.spark.live_commit_interval.total_seconds() * 1000),
                "maps_per_query": cfg.spark.live_maps_per_query,
            }
            if path == "realtime"
            else {}
        ),
        "target_p99_ms": 100 if maps == 1 else 150,
    }


def _failed(name: str, error: str) -> None:
    print(f"map {name}: its Delta MERGE failed: {error}", file=sys.stderr, flush=True)


def _none(*_: Any) -> None:
    return None


def _spark_jvm() -> list[int]:
    """Spark's JVM, this process's child (not the broker and Redis, which it started too).
    Its Python workers come and go; the machine's busy cores count them."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text().rpartition(")")[2].split()
                command = (entry / "cmdline").read_text()
                if int(stat[1]) == os.getpid() and "SparkSubmit" in command:
                    found.append(int(entry.name))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--loads", default="one,many")
    ap.add_argument("--paths", default="microbatch,realtime")
    ap.add_argument("--rate-one", type=int, default=5000)
    ap.add_argument("--rate-many", type=int, default=2000)
    ap.add_argument("--maps", type=int, default=16)
    ap.add_argument("--mode", default="latest", choices=sorted(FOLDS), help="the maps' fold")
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--warmup-seconds", type=float, default=60)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--sample-every", type=int, default=10)
    ap.add_argument(
        "--index-sets",
        default="none",
        help="sets of indexed fields joined by +, a run of each path per set (none: no index)",
    )
    ap.add_argument(
        "--maps-per-query",
        type=int,
        default=None,
        help="spark.live_maps_per_query (default: the setting's default)",
    )
    ap.add_argument(
        "--commit-every-ms",
        default="1000",
        help="spark.live_commit_interval in ms; several (100,1000): a real-time run each",
    )
    ap.add_argument(
        "--delta-trigger-s",
        type=float,
        default=None,
        help="the Delta queries' trigger interval (default: delta.trigger_interval's)",
    )
    args = ap.parse_args()
    loads = {"one": (1, args.rate_one), "many": (args.maps, args.rate_many)}
    wanted = [loads[name] for name in args.loads.split(",")]
    with services() as (bootstrap, redis_url):
        emit(name="setup", **machine(), partitions=PARTITIONS, keys=args.keys)
        for maps, rate in wanted:
            for path in args.paths.split(","):
                intervals = args.commit_every_ms.split(",") if path == "realtime" else ["0"]
                for every in intervals:
                    for fields in args.index_sets.split(","):
                        indexes = [
                            IndexConfig(field=f, kind="hash" if f == "city" else "sorted")
                            for f in fields.split("+")
                            if fields != "none"
                        ]
                        started = time.monotonic()
                        line = measure(
                            bootstrap, redis_url, path, maps, rate, int(every), args, indexes
                        )
                        emit(**line, wall_s=round(time.monotonic() - started, 1))


if __name__ == "__main__":
    main()
