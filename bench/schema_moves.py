"""A field added to a registry subject while ``materializer run`` folds it, as users meet it.

One ``latest`` map of Avro records through a real registry (Apicurio), every setting at its
default, in a ``materializer run`` of its own. Once it holds every key, a producer feeds
it ``--rate`` events/s of the subject's first version for ``--before`` seconds, then,
without a pause, registers a version with one more optional field (``note``) and feeds
records of it for ``--after`` seconds. One event in ``--sample-every`` is followed until
Redis shows it (produce to visible, as a Get reads it).

  added_visible_s   from the produce of the first record that carries the field to a
                    lookup of its key showing the field (the goal: within 10 s);
  before / across / after
                    produce-to-visible percentiles of the samples produced in the last
                    30 s before the new version, in the 30 s from it, and after those;
                    the goal is no gap: ``across`` no staler than ``before`` beyond
                    what one restart of the map's queries costs.

    .venv/bin/python bench/schema_moves.py [--rate 1000] [--before 90] [--after 90]
"""

from __future__ import annotations

import argparse
import datetime
import io
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import fastavro
import orjson
import redis
import yaml
from confluent_kafka import Producer
from freshness import Follower, latency_fields, produce_at_rate
from harness import PARTITIONS, emit, event, run_doc, services, setup_line
from live import wait_for

from materializer.contract.redis_layout import entity_key
from materializer.testing import create_topic
from materializer.testing.process import ManagedProcess
from materializer.testing.registry import ApicurioRegistry, register, wire_value

NAME = "users"
TYPES = {"age": "int", "score": "double", "updated_at": "long", "seq": "long"}
FIELDS = ["id", "name", "email", "city", "age", "score", "plan", "device", "country"]
V1 = {
    "type": "record",
    "name": "User",
    "namespace": "bench",
    "fields": [{"name": f, "type": TYPES.get(f, "string")} for f in [*FIELDS, "updated_at", "seq"]],
}
V2 = {
    **V1,
    "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}
WINDOW_S = 30.0


def encoder(schema: dict[str, Any], schema_id: int) -> Any:
    parsed = fastavro.parse_schema(schema)
    wider = any(f["name"] == "note" for f in schema["fields"])

    def encode(seq: int, index: int, rng: random.Random) -> tuple[bytes, bytes]:
        key, value = event(seq, index, rng)
        doc = orjson.loads(value)
        if wider:
            doc["note"] = f"note {seq}"
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, doc)
        return key, wire_value(schema_id, out.getvalue())

    return encode


def restart_phases(log: str, produced: float) -> dict[str, Any]:
    """From the run's log: the seconds from the first wide record's produce to the run's
    line that the subject moved (the batch that met it failed), and from that line to the
    map running again."""
    moved = running = None
    batches: list[int] = []
    for line in log.splitlines():
        stamp = line[:23]
        if f"map {NAME}: subject" in line and "moved" in line and moved is None:
            moved = _epoch(stamp)
        elif moved is not None and line.endswith(f"map {NAME} running"):
            running = _epoch(stamp)
        elif running is not None and f"query={NAME}.fold batch=" in line and len(batches) < 3:
            batches.append(int(line.split("duration_ms=")[1].split()[0]))
    return {
        "first_batches_after_ms": batches,
        "moved_after_s": None if moved is None else round(moved - produced, 2),
        "running_again_after_s": None
        if moved is None or running is None
        else round(running - moved, 2),
    }


def _epoch(stamp: str) -> float:
    """A log line's time (``2026-12-01 06:52:37,838``, the run's zone: UTC) as epoch seconds."""
    when = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
    return when.replace(tzinfo=datetime.UTC).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--before", type=float, default=90.0)
    parser.add_argument("--after", type=float, default=90.0)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--sample-every", type=int, default=50)
    args = parser.parse_args()
    setup_line("materializer run", int(args.rate * (args.before + args.after)), args.keys)
    with (
        services() as (bootstrap, redis_url),
        ApicurioRegistry() as registry,
        tempfile.TemporaryDirectory() as tmp,
    ):
        work = Path(tmp)
        topic = create_topic(bootstrap, PARTITIONS)
        subject = f"{topic}-value"
        first = encoder(V1, register(registry.url, subject, orjson.dumps(V1).decode()))
        prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
        for i in range(args.keys):  # every key once, before the run starts
            key, value = first(i, i, random.Random(i))
            prod.produce(topic, key=key, value=value)
        prod.flush(60)
        config = work / "run.yaml"
        source = {"topics": [topic], "format": "avro", "schema_registry_url": registry.url}
        maps = {NAME: {"source": source, "key": "id"}}
        config.write_text(yaml.safe_dump(run_doc(work, bootstrap, redis_url, maps)))
        proc = ManagedProcess(
            [sys.executable, "-m", "materializer", "run", "-c", str(config)], work / "run.log"
        )
        client = redis.Redis.from_url(redis_url)
        try:
            wait_for(
                "every key, the map past its opening",
                lambda: (
                    f"map {NAME} running" in proc.log()
                    and client.exists(entity_key(NAME, f"user-{args.keys - 1:06d}")) > 0
                ),
                900,
                proc,
            )
            follower = Follower(redis_url, NAME)
            follower.thread.start()
            sent_at: dict[int, float] = {}

            def sampled(key: bytes, seq: int, at: float) -> None:
                if seq % args.sample_every == 0:
                    follower.samples.put((key, seq, at))
                    sent_at[seq] = at

            rng = random.Random(5)
            produce_at_rate(
                prod, topic, args.rate, args.before, args.keys, args.keys, sampled, rng, first
            )
            seq = args.keys + int(args.rate * args.before)
            second = encoder(V2, register(registry.url, subject, orjson.dumps(V2).decode()))
            first_wide: list[tuple[bytes, float]] = []
            visible: list[float] = []
            wall: list[float] = []

            def watch(key: bytes) -> None:
                """A lookup of the first wide record's key every 20 ms until it has the field."""
                reader = redis.Redis.from_url(redis_url)
                while proc.alive():
                    raw = reader.get(entity_key(NAME, key.decode()))
                    if raw is not None and "note" in orjson.loads(raw):
                        visible.append(time.perf_counter())
                        return
                    time.sleep(0.02)

            def sampled_wide(key: bytes, s: int, at: float) -> None:
                if not first_wide:
                    first_wide.append((key, at))
                    wall.append(time.time())
                    threading.Thread(target=watch, args=(key,), daemon=True).start()
                sampled(key, s, at)

            produce_at_rate(
                prod, topic, args.rate, args.after, args.keys, seq, sampled_wide, rng, second
            )
            unresolved = follower.finish(drain_seconds=120)
            wait_for("the new field", lambda: bool(visible), 300, proc)
            switch_at = first_wide[0][1]
        finally:
            proc.stop()
        log = proc.log()

    def window(lo: float, hi: float) -> list[float]:
        return [
            lat
            for s, lat in zip(follower.sequences, follower.latencies, strict=True)
            if lo <= sent_at[s] < hi
        ]

    emit(
        bench="schema_moves",
        units="s, ms",
        offered_events_per_s=args.rate,
        keys=args.keys,
        added_visible_s=round(visible[0] - switch_at, 2),
        target_added_visible_s=10,
        restarts=log.count(f"map {NAME}: subject {subject} moved"),
        **restart_phases(log, wall[0]),
        failed=f"map {NAME} failed" in log,
        unresolved=unresolved,
        before=latency_fields(window(switch_at - WINDOW_S, switch_at)),
        across=latency_fields(window(switch_at, switch_at + WINDOW_S)),
        after=latency_fields(window(switch_at + WINDOW_S, float("inf"))),
    )


if __name__ == "__main__":
    main()
