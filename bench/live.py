"""Live freshness through ``materializer run``, as users run it.

For each fold mode: one map (JSON with a schema, K keys, 4 partitions, dead
letters on, so its Delta and dead-letter work runs beside the fold) in a
``materializer run`` process of its own. Once the map holds every key, an
outside producer feeds it at each ``--rates`` value for ``--warmup-seconds``
(150 by default: the minutes after the start, while the driver's JVM still
compiles Spark's code on the cores the batches need; their percentiles get a
line of their own, ``live_<mode>_warmup``) and then, without a pause, for the
measured ``--seconds``. Both lines carry the JIT compilers' share of the
machine over their seconds (``jit_compile_cores``, from ``jstat``). One
event in ``--sample-every`` is followed until Redis shows it (produce to
visible), and one in ``--delta-sample-every`` until the Delta table shows it
too (how far the table trails Redis). A rate is held when the last third of
its samples is no slower than the first third by more than a second and
every sample was seen; each mode's ``highest_held`` line names the highest
rate held of those tried.

    .venv/bin/python bench/live.py [--modes latest,merge,aggregate] [--rates 5000,10000]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis
import yaml
from confluent_kafka import Producer
from cpu_window import CpuWindow, process_tree, rss_bytes
from deltalake import DeltaTable
from freshness import Follower, produce_at_rate
from harness import PARTITIONS, SCHEMA, emit, produce_bulk, services, setup_line
from pipeline import FOLDS

from materializer.contract.redis_layout import meta_key
from materializer.testing import create_topic
from materializer.testing.process import ManagedProcess


class JitMeter:
    """How busy the JVM's JIT compilers of a ``materializer run`` are: its driver JVM's
    cumulative compile time (``jstat -compiler``) sampled at two moments.

    A cold JVM compiles Spark's code for minutes under this load, on the cores
    the batches need; the lines report the compilers' share of the machine in
    the warm-up and in the measured seconds, so a reader sees whether a window
    caught the JVM still warming. None where ``jstat`` or the JVM is not found.
    """

    def __init__(self, run: ManagedProcess) -> None:
        self._parent = run.proc.pid
        self._jstat = shutil.which("jstat")

    def _jvm(self) -> int | None:
        for children in Path(f"/proc/{self._parent}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                for pid in children.read_text().split():
                    command = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if b"java" in command.split(b"\0")[0]:
                        return int(pid)
        return None

    def sample(self) -> tuple[float, float] | None:
        """(monotonic seconds, the JVM's compile seconds so far), or None."""
        pid = self._jvm()
        if self._jstat is None or pid is None:
            return None
        out = subprocess.run(
            [self._jstat, "-compiler", str(pid)], capture_output=True, text=True, check=False
        ).stdout.split("\n")
        if len(out) < 2 or len(out[1].split()) < 4:
            return None
        return time.monotonic(), float(out[1].split()[3])

    @staticmethod
    def cores(start: tuple[float, float] | None, end: tuple[float, float] | None) -> float | None:
        """The compilers' cores between two samples."""
        if start is None or end is None or end[0] <= start[0]:
            return None
        return round((end[1] - start[1]) / (end[0] - start[0]), 2)


def nearest_rank(ordered: list[float], pct: int) -> float:
    """The pct-th percentile of sorted values by nearest rank: never beyond the largest."""
    return ordered[max(0, -(-pct * len(ordered) // 100) - 1)]


class DeltaFollower:
    """Polls the map's Delta table for sampled events: when each first shows up there."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.waiting: dict[bytes, tuple[int, float]] = {}
        self.lock = threading.Lock()
        self.seen: list[tuple[bytes, int, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def pending(self) -> int:
        with self.lock:
            return len(self.waiting)

    def add(self, key: bytes, seq: int) -> None:
        with self.lock:
            self.waiting[key] = (seq, time.perf_counter())

    def _run(self) -> None:
        while not self.stop.is_set():
            time.sleep(1.0)
            with self.lock:
                wanted = dict(self.waiting)
            if not wanted:
                continue
            try:
                table = DeltaTable(self.path).to_pyarrow_table(columns=["_key", "seq"])
            except Exception:  # noqa: BLE001 - not created yet, or a commit in flight
                continue
            keys = [k.encode() for k in table["_key"].to_pylist()]
            rows = dict(zip(keys, table["seq"].to_pylist(), strict=True))
            now = time.perf_counter()
            with self.lock:
                for key, (seq, _) in wanted.items():
                    if (rows.get(key) or -1) >= seq and key in self.waiting:
                        self.seen.append((key, seq, now))
                        del self.waiting[key]


def entity_count(client: redis.Redis, map_name: str) -> int:
    return sum(1 for _ in client.scan_iter(match=f"{map_name}:user-*", count=10_000))


def delta_rows(path: Path) -> int:
    try:
        return int(DeltaTable(str(path)).to_pyarrow_table(columns=["_key"]).num_rows)
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def map_section(topic: str, mode: str) -> dict[str, Any]:
    """A map's section of the config: JSON with the events' schema from ``topic``, keyed by
    ``id``, folded by ``mode``, dead letters on."""
    return {
        "source": {"topics": [topic], "format": "json", "schema": SCHEMA},
        "key": "id",
        "fold": FOLDS[mode],
        "on_error": "dead_letter",
    }


def write_config(
    work: Path,
    bootstrap: str,
    redis_url: str,
    topic: str,
    mode: str,
    delta_trigger: str | None = None,
    delta_engine: str | None = None,
    spark_conf: dict[str, str] | None = None,
    *,
    catalog: dict[str, Any] | None = None,
    path: str | None = None,
) -> Path:
    """The run's YAML: one map named ``mode`` over ``topic``, folded on ``path`` (None: the
    run's default), and the ``catalog`` section if given (maps created at runtime)."""
    delta: dict[str, Any] = {"root": str(work / "warehouse")}
    if delta_trigger is not None:
        delta["trigger_interval"] = delta_trigger
    if delta_engine is not None:
        delta["merge_engine"] = delta_engine
    doc: dict[str, Any] = {
        "kafka": {"bootstrap_servers": bootstrap},
        "redis": {"url": redis_url},
        # Every cadence at its default, as users run it, unless --delta-* says.
        "delta": delta,
        "spark": {
            "checkpoint_root": str(work / "checkpoints"),
            "conf": spark_conf or {},
            **({"path": path} if path is not None else {}),
        },
        "metrics": {"port": 0},
        "maps": {mode: map_section(topic, mode)},
    }
    if catalog is not None:
        doc["catalog"] = catalog
    file = work / f"{mode}.yaml"
    file.write_text(yaml.safe_dump(doc))
    return file


def add_spark_conf(parser: argparse.ArgumentParser) -> None:
    """``--spark-conf KEY=VALUE``, repeatable: Spark settings in the runs' config."""
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the runs (spark.conf of the config); may repeat",
    )


def spark_settings(args: argparse.Namespace) -> dict[str, str]:
    """The ``--spark-conf`` settings as a dict."""
    return dict(item.split("=", 1) for item in args.spark_conf)


def wait_for(
    what: str, check: Any, timeout: float, proc: ManagedProcess, interval: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not proc.alive():
            raise RuntimeError(f"materializer run exited while waiting for {what}:\n{proc.tail()}")
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}:\n{proc.tail()}")


def catch_up(
    client: redis.Redis,
    proc: ManagedProcess,
    mode: str,
    run_dir: Path,
    keys: int,
    started: float,
) -> dict[str, float]:
    """Wait until the run's map holds every key in Redis, then in its Delta table too (the
    steady state); the seconds from ``started`` (``perf_counter``) to each, and to the
    first batch."""
    wait_for("the first batch", lambda: client.exists(meta_key(mode)) > 0, 600, proc)
    first_batch_s = time.perf_counter() - started
    wait_for("the backlog", lambda: entity_count(client, mode) >= keys, 900, proc)
    caught_up_s = time.perf_counter() - started
    wait_for("the Delta table", lambda: delta_rows(run_dir / "warehouse" / mode) >= keys, 900, proc)
    return {
        "first_batch_s": round(first_batch_s, 1),
        "backlog_of_keys_s": round(caught_up_s, 1),
        "delta_backlog_s": round(time.perf_counter() - started, 1),
    }


def feed(
    bootstrap: str,
    topic: str,
    rate: int,
    seconds: float,
    keys: int,
    follower: Follower,
    delta: DeltaFollower,
    sample_every: int,
    delta_every: int,
    seq0: int,
) -> int:
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})

    def sampled(key: bytes, seq: int, sent_at: float) -> None:
        if seq % sample_every == 0:
            follower.samples.put((key, seq, sent_at))
        if seq % delta_every == 0:
            delta.add(key, seq)

    return produce_at_rate(prod, topic, rate, seconds, keys, seq0, sampled, random.Random(rate))


def follow(
    bootstrap: str,
    redis_url: str,
    topic: str,
    mode: str,
    run_dir: Path,
    rate: int,
    seq0: int,
    args: argparse.Namespace,
    jit: JitMeter,
    run_pid: int,
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Feed ``rate`` events/s for ``--warmup-seconds`` then ``--seconds`` without a pause,
    and follow the samples into Redis and Delta. The warm-up's percentiles on their own
    (the fold's live path still cold after the backlog, or after the last rate); for the
    measured part: percentiles, whether the rate was held, how far Delta trails."""
    follower = Follower(redis_url, mode)
    follower.thread.start()
    delta = DeltaFollower(str(run_dir / "warehouse" / mode))
    delta.thread.start()
    jit_samples = [jit.sample()]
    cpu = CpuWindow({"run": process_tree(run_pid)})

    def at_warm_end() -> None:
        jit_samples.append(jit.sample())
        cpu.groups = {"run": process_tree(run_pid)}  # the Python workers of the moment
        cpu.begin()

    # The end of the warm-up, sampled while the feed goes on.
    at_warm = threading.Timer(args.warmup_seconds, at_warm_end)
    at_warm.start()
    achieved = feed(
        bootstrap,
        topic,
        rate,
        args.warmup_seconds + args.seconds,
        args.keys,
        follower,
        delta,
        args.sample_every,
        args.delta_sample_every,
        seq0,
    )
    at_warm.join()
    jit_samples.append(jit.sample())
    cores = cpu.end()
    rss = rss_bytes(process_tree(run_pid))
    unresolved = follower.finish(drain_seconds=120)
    measured_from = seq0 + int(rate * args.warmup_seconds)
    timed = sorted(zip(follower.sequences, follower.latencies, strict=True))
    warm = sorted(x * 1000 for seq, x in timed if seq <= measured_from)
    ms = [x * 1000 for seq, x in timed if seq > measured_from]
    third = max(1, len(ms) // 3)
    first, last_third = ms[:third], ms[-third:]
    deadline = time.monotonic() + 120
    while delta.pending() and time.monotonic() < deadline:
        time.sleep(1)
    delta.stop.set()
    trail = sorted(
        (seen - follower.visible_at[(key, seq)]) * 1000
        for key, seq, seen in delta.seen
        if (key, seq) in follower.visible_at and seq > measured_from
    )
    ordered = sorted(ms)
    held = unresolved == 0 and (statistics.median(last_third) <= statistics.median(first) + 1000)
    warmup = None
    if warm:
        warmup = {
            "units": "ms",
            "offered_events_per_s": rate,
            "seconds": args.warmup_seconds,
            "samples": len(warm),
            "p50_ms": round(nearest_rank(warm, 50), 1),
            "p99_ms": round(nearest_rank(warm, 99), 1),
            "max_ms": round(warm[-1], 1),
            "jit_compile_cores": JitMeter.cores(jit_samples[0], jit_samples[1]),
        }
    return warmup, {
        "units": "events/s, ms",
        "offered_events_per_s": rate,
        "achieved_events_per_s": achieved,
        "seconds": args.seconds,
        "keys": args.keys,
        "samples": len(ms),
        "unresolved": unresolved,
        "p50_ms": round(nearest_rank(ordered, 50), 1),
        "p99_ms": round(nearest_rank(ordered, 99), 1),
        "max_ms": round(ordered[-1], 1),
        "first_third_p50_ms": round(statistics.median(first), 1),
        "last_third_p50_ms": round(statistics.median(last_third), 1),
        "last_third_p99_ms": round(nearest_rank(sorted(last_third), 99), 1),
        "held": held,
        "delta_samples": len(trail),
        "delta_unresolved": delta.pending(),
        "delta_trails_redis_p50_ms": round(nearest_rank(trail, 50)) if trail else None,
        "delta_trails_redis_p99_ms": round(nearest_rank(trail, 99)) if trail else None,
        "jit_compile_cores": JitMeter.cores(jit_samples[1], jit_samples[2]),
        **cores,
        "run_cpu_s_per_1000_events": round((cores["run_cpu_cores"] or 0) / achieved * 1000, 3),
        "run_rss_gib": round(rss / 2**30, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--modes", default="latest,merge,aggregate")
    parser.add_argument("--rates", default="5000")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=150,
        help="feed at the first rate this long before measuring, reported on its own line",
    )
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--sample-every", type=int, default=10)
    parser.add_argument("--delta-sample-every", type=int, default=500)
    parser.add_argument("--keep-logs", help="copy each run's log into this folder")
    parser.add_argument(
        "--delta-trigger",
        help="the Delta query's trigger interval (default: the config's), e.g. '30 seconds'",
    )
    parser.add_argument(
        "--delta-engines",
        help="run each mode once per Delta MERGE engine, e.g. 'delta_rs,spark' "
        "(default: the config's, once)",
    )
    parser.add_argument(
        "--paths",
        default="microbatch,realtime",
        help="run each mode once per fold path (spark.path), in turn",
    )
    add_spark_conf(parser)
    args = parser.parse_args()
    spark_conf = spark_settings(args)
    rates = [int(r) for r in args.rates.split(",")]
    engines: list[str | None] = (
        list(args.delta_engines.split(",")) if args.delta_engines else [None]
    )

    work = Path(tempfile.mkdtemp(prefix="materializer-live-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        bootstrap, redis_url = stack.enter_context(services())
        setup_line("local[*]", 0, args.keys)
        client = redis.Redis.from_url(redis_url)
        runs = [
            (m, e, p) for m in args.modes.split(",") for e in engines for p in args.paths.split(",")
        ]
        for mode, engine, path in runs:
            run_dir = work / f"{mode}-{engine or 'default'}-{path}"
            run_dir.mkdir()
            client.flushall()  # each run starts from an empty map
            topic = create_topic(bootstrap, PARTITIONS)
            # Every key once, so the map starts with all its entities.
            produce_bulk(bootstrap, topic, args.keys, args.keys)
            config = write_config(
                run_dir,
                bootstrap,
                redis_url,
                topic,
                mode,
                args.delta_trigger,
                engine,
                spark_conf,
                path=path,
            )
            line = f"live_{mode}" if path == "microbatch" else f"live_{mode}_{path}"
            started = time.perf_counter()
            proc = ManagedProcess(
                [sys.executable, "-m", "materializer", "run", "-c", str(config)],
                run_dir / f"{mode}.log",
            )
            try:
                start = catch_up(client, proc, mode, run_dir, args.keys, started)
                jit = JitMeter(proc)
                seq0 = 10_000_000
                held_rates: list[int] = []
                for rate in rates:
                    warmup, result = follow(
                        bootstrap,
                        redis_url,
                        topic,
                        mode,
                        run_dir,
                        rate,
                        seq0,
                        args,
                        jit,
                        proc.proc.pid,
                    )
                    seq0 += int(rate * (args.warmup_seconds + args.seconds)) + 1
                    if warmup is not None:
                        emit(name=f"{line}_warmup", **warmup)
                    if result["held"]:
                        held_rates.append(rate)
                    emit(
                        name=line,
                        **result,
                        path=path,
                        warmup_seconds=args.warmup_seconds,
                        delta_trigger=args.delta_trigger or "default",
                        delta_engine=engine or "default",
                        spark_conf=spark_conf or "default",
                        target_p99_ms=1000,
                    )
                emit(
                    name=f"{line}_highest_held",
                    units="events/s",
                    rates_tried=rates,
                    highest_held_events_per_s=max(held_rates, default=None),
                )
                emit(name=f"{line}_start", units="s", **start)
            finally:
                proc.stop()
                if args.keep_logs:
                    Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                    shutil.copy(
                        run_dir / f"{mode}.log", Path(args.keep_logs) / f"{run_dir.name}.log"
                    )
        client.close()


if __name__ == "__main__":
    main()
