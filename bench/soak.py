"""Soak: ``materializer run`` under steady load and repeated faults, then checked against a
plain-Python fold of everything produced.

Two maps (``latest`` and ``aggregate``, JSON with a schema, 4 partitions
each) in one ``materializer run``, fed together at ``--rate`` events/s for
``--seconds``. Meanwhile: a kill -9 of the run every ``--kill-every``
seconds (started again at once, as an orchestrator would), one restart of
``redis-server`` without its data, and one SIGSTOP of the broker for
``--stall-seconds``. No person steps in. Every ``--window`` seconds a line
reports each map's lag (records produced and not in its watermark) and the
freshness of probes (an event followed until Redis shows it). At the end the
producer stops, the run catches up and is stopped with SIGTERM (the Delta
tables take in the changelog), and Redis and Delta are compared with the
reference fold, entity by entity.

Not a test: it takes ``--seconds`` plus the catch-up (about 15 minutes at
the defaults). Figures compare only within one run.

    .venv/bin/python bench/soak.py [--seconds 600] [--rate 2000] [--keys 10000]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import redis
import yaml
from confluent_kafka import Producer
from deltalake import DeltaTable
from harness import PARTITIONS, SCHEMA, emit, event, machine, run_doc
from pipeline import AGGREGATES

from materializer.contract.redis_layout import entity_key, meta_key
from materializer.contract.watermark import Watermark
from materializer.testing import KafkaBroker, RedisServer, create_topic
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import fold_aggregate, fold_latest

MAPS: dict[str, dict[str, Any]] = {
    "soak_latest": {"mode": "latest"},
    "soak_aggregate": {"mode": "aggregate", "aggregates": AGGREGATES},
}
FIELDS = [part.split()[0] for part in SCHEMA.split(", ")]


class Produced:
    """Every event produced to one topic with its position, for the reference fold, and the
    newest offset per partition, for the lag."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.events: list[tuple[int, int, bytes, bytes]] = []
        self.ends: dict[int, int] = {}
        self.latest: tuple[bytes, int, float] | None = None
        """The newest event sent: key, seq, when."""
        self.lock = threading.Lock()

    def delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            raise RuntimeError(f"{self.topic}: {err}")
        with self.lock:
            self.events.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
            self.ends[msg.partition()] = max(self.ends.get(msg.partition(), 0), msg.offset() + 1)


def produce(
    bootstrap: str, topics: dict[str, Produced], rate: int, seconds: float, keys: int
) -> None:
    """``rate`` events/s spread over the topics for ``seconds``; a stalled broker only delays."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            "message.timeout.ms": 600_000,
        }
    )
    rng = random.Random(3)
    started = time.perf_counter()
    total = int(rate * seconds)
    sent = 0
    outs = list(topics.values())
    while sent < total:
        due = min(total, int(rate * (time.perf_counter() - started)))
        while sent < due:
            sent += 1
            out = outs[sent % len(outs)]
            key, value = event(sent, rng.randrange(keys), rng)
            while True:
                try:
                    producer.produce(out.topic, value, key, on_delivery=out.delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
            out.latest = (key, sent, time.perf_counter())
        producer.poll(0)
        time.sleep(0.002)
    if producer.flush(600):
        raise RuntimeError("the producer could not deliver every event")


def watermark(client: redis.Redis, name: str) -> Watermark | None:
    try:
        return Watermark.from_hash(client.hgetall(meta_key(name)))
    except redis.RedisError:
        return None


def lag(client: redis.Redis, name: str, out: Produced) -> int | None:
    """Records produced and not yet in the map's watermark; None while Redis does not answer."""
    mark = watermark(client, name)
    if mark is None:
        return None
    with out.lock:
        ends = dict(out.ends)
    done = mark.offsets.get(out.topic, {})
    return sum(max(0, end - done.get(p, 0)) for p, end in ends.items())


class Probe:
    """Follows the newest event of a topic every second until Redis shows it (its ``seq``)."""

    def __init__(self, redis_url: str, name: str, out: Produced, started: float) -> None:
        self.client = redis.Redis.from_url(redis_url, socket_timeout=5)
        self.name, self.out, self.started = name, out, started
        self.samples: list[tuple[float, float]] = []
        """(seconds since the start when sent, seconds until visible)."""
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _visible(self, key: bytes, seq: int) -> bool:
        try:
            raw = self.client.get(entity_key(self.name, key.decode()))
        except redis.RedisError:
            return False
        return raw is not None and int(orjson.loads(raw).get("seq", -1)) >= seq

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            latest = self.out.latest
            if latest is None:
                continue
            key, seq, sent = latest
            while not self.stop.is_set() and not self._visible(key, seq):
                time.sleep(0.02)
            if not self.stop.is_set():
                self.samples.append((sent - self.started, time.perf_counter() - sent))


def write_config(work: Path, bootstrap: str, redis_url: str, topics: dict[str, str]) -> Path:
    maps = {
        name: {
            "source": {"topics": [topics[name]], "format": "json", "schema": SCHEMA},
            "key": "id",
            "fold": fold,
            "on_error": "dead_letter",
        }
        for name, fold in MAPS.items()
    }
    doc = run_doc(work, bootstrap, redis_url, maps)
    path = work / "soak.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def reference(name: str, out: Produced) -> dict[str, dict[str, Any]]:
    events = list(out.events)
    if MAPS[name]["mode"] == "latest":
        return fold_latest(events, "id", FIELDS)
    specs = {k: (v["fn"], v.get("field")) for k, v in AGGREGATES.items()}
    return fold_aggregate(events, "id", specs)


def redis_entities(client: redis.Redis, name: str) -> dict[str, dict[str, Any]]:
    out = {}
    for key in client.scan_iter(match=f"{name}:user-*", count=10_000):
        raw = client.get(key)
        if raw is not None:
            out[key.decode().split(":", 1)[1]] = orjson.loads(raw)
    return out


def delta_entities(path: Path) -> dict[str, dict[str, Any]]:
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {
        row["_key"]: {k: v for k, v in row.items() if v is not None and not k.startswith("_")}
        for row in rows
    }


def differences(expected: dict[str, Any], actual: dict[str, Any]) -> int:
    return sum(1 for k in expected.keys() | actual.keys() if expected.get(k) != actual.get(k))


def nearest_rank(ordered: list[float], pct: int) -> float:
    return ordered[max(0, -(-pct * len(ordered) // 100) - 1)]


def run_process(config: Path, log: Path) -> ManagedProcess:
    return ManagedProcess([sys.executable, "-m", "materializer", "run", "-c", str(config)], log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--rate", type=int, default=2000, help="events/s over both maps")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--kill-every", type=float, default=120)
    parser.add_argument("--redis-restart-at", type=float, default=300)
    parser.add_argument("--stall-at", type=float, default=420)
    parser.add_argument("--stall-seconds", type=float, default=15)
    parser.add_argument("--window", type=float, default=30)
    parser.add_argument("--catch-up-timeout", type=float, default=900)
    parser.add_argument("--keep-log", help="copy the run's log to this file")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="materializer-soak-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        broker = stack.enter_context(KafkaBroker(heap="1g"))
        server = stack.enter_context(RedisServer())
        bootstrap, redis_url = broker.bootstrap_servers, server.url
        emit(name="soak_setup", **machine(), rate=args.rate, seconds=args.seconds, keys=args.keys)
        outs = {name: Produced(create_topic(bootstrap, PARTITIONS)) for name in MAPS}
        config = write_config(work, bootstrap, redis_url, {n: o.topic for n, o in outs.items()})
        log = work / "run.log"
        proc = run_process(config, log)
        stack.callback(lambda: proc.stop())
        client = redis.Redis.from_url(redis_url, socket_timeout=5)
        started = time.perf_counter()
        producer = threading.Thread(
            target=produce,
            args=(bootstrap, outs, args.rate, args.seconds, args.keys),
            daemon=True,
        )
        producer.start()
        probes = {name: Probe(redis_url, name, out, started) for name, out in outs.items()}

        faults: list[dict[str, Any]] = []
        next_kill = args.kill_every
        redis_done = stall_done = False
        next_window = args.window
        lags: dict[str, list[int]] = {name: [] for name in MAPS}
        while producer.is_alive():
            now = time.perf_counter() - started
            if now >= next_kill:
                proc.kill()
                proc = run_process(config, log)
                faults.append({"at_s": round(now), "fault": "kill -9 of materializer run"})
                next_kill += args.kill_every
            if not redis_done and now >= args.redis_restart_at:
                server.restart_empty()
                faults.append({"at_s": round(now), "fault": "redis-server restarted empty"})
                redis_done = True
            if not stall_done and now >= args.stall_at:
                broker.pause()
                time.sleep(args.stall_seconds)
                broker.resume()
                faults.append(
                    {"at_s": round(now), "fault": f"broker stopped {args.stall_seconds:.0f} s"}
                )
                stall_done = True
            if not proc.alive():
                # A run that exits by itself is reported and started again, as a pod would be.
                faults.append(
                    {"at_s": round(now), "fault": f"run exited by itself ({proc.proc.returncode})"}
                )
                proc = run_process(config, log)
            for name, out in outs.items():
                value = lag(client, name, out)
                if value is not None:
                    lags[name].append(value)
            if now >= next_window:
                line: dict[str, Any] = {"name": "soak_window", "at_s": round(now)}
                for name, probe in probes.items():
                    recent = sorted(
                        f for sent, f in probe.samples if now - args.window <= sent < now
                    )
                    line[f"{name}_lag_records"] = lags[name][-1] if lags[name] else None
                    line[f"{name}_probes"] = len(recent)
                    line[f"{name}_freshness_p50_s"] = (
                        round(statistics.median(recent), 2) if recent else None
                    )
                    line[f"{name}_freshness_max_s"] = round(recent[-1], 2) if recent else None
                emit(**line)
                next_window += args.window
            time.sleep(1.0)

        ended = time.perf_counter()
        caught_up = None
        deadline = time.monotonic() + args.catch_up_timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                faults.append({"at_s": round(time.perf_counter() - started), "fault": "run exited"})
                proc = run_process(config, log)
            if all(lag(client, name, out) == 0 for name, out in outs.items()):
                caught_up = time.perf_counter() - ended
                break
            time.sleep(1.0)
        for probe in probes.values():
            probe.stop.set()
        proc.stop()
        if args.keep_log:
            shutil.copy(log, args.keep_log)
        for fault in faults:
            emit(name="soak_fault", **fault)
        for name, out in outs.items():
            expected = reference(name, out)
            in_redis = redis_entities(client, name)
            in_delta = delta_entities(work / "warehouse" / name)
            fresh = sorted(f for _, f in probes[name].samples)
            emit(
                name="soak_result",
                map=name,
                events=len(out.events),
                keys=len(expected),
                caught_up_after_producer_s=None if caught_up is None else round(caught_up, 1),
                redis_differences=differences(expected, in_redis),
                delta_differences=differences(expected, in_delta),
                redis_equals_reference=in_redis == expected,
                delta_equals_reference=in_delta == expected,
                lag_max_records=max(lags[name], default=None),
                freshness_probes=len(fresh),
                freshness_p50_s=round(nearest_rank(fresh, 50), 2) if fresh else None,
                freshness_p99_s=round(nearest_rank(fresh, 99), 2) if fresh else None,
                freshness_max_s=round(fresh[-1], 2) if fresh else None,
                kills=sum(1 for f in faults if f["fault"].startswith("kill")),
            )
        client.close()


if __name__ == "__main__":
    main()
