"""Reads by value as fresh as reads by key: produce-to-visible of a ``Get``, of a filtered
``Query`` and of an SQL statement on an indexed field, on a live map, through
``materializer run`` and the query service's HTTP front, as users run them.

One ``merge`` map over a topic of 4 partitions, ``--keys`` keys each with a ``city`` of
50, indexed on ``city`` (the run builds the index), folded on the real-time path (the
default). Once the map holds every key, an outside producer feeds it ``--rate``
events/s for ``--warmup-seconds`` and then the measured ``--seconds``. Every second one
key moves to a city no other key has; from the return of its produce call two readers
poll the query service's HTTP front every ``--poll-ms`` until they see it: ``GET
/v1/maps/{map}/entities/{key}`` (the baseline, a read by key), ``GET
/v1/maps/{map}/query?where=city = '<new>'`` and ``POST /v1/sql`` with ``SELECT _key, seq
FROM <map> WHERE city = $1`` (reads by value). The goal: each read by value's p99
within 1.5 times the read by key's.

    .venv/bin/python bench/index_freshness.py [--rate 1000] [--keys 20000] [--seconds 60]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import orjson
import redis
import yaml
from confluent_kafka import Producer
from harness import emit, services
from live import entity_count, wait_for
from query_services import start_query_service

from materializer.clients.redis import client_for
from materializer.config import RedisConfig
from materializer.redis.indexes import declared_states
from materializer.testing import create_topic, free_port
from materializer.testing.process import ManagedProcess
from query_service.event_loop import EventLoop

MAP = "fresh"
SCHEMA = "id STRING, city STRING, seq BIGINT"
CITIES = 50


class Reader:
    """Polls one HTTP path until ``seen`` says its answer shows the move."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.last = b""
        """The last answer read: what a read that never saw its move saw instead."""

    def until(
        self, check: tuple[str, Any, Any], started: float, poll: float, limit: float
    ) -> float:
        """Seconds from ``started`` to the first answer ``check``'s test accepts (inf:
        never); ``check``: the path, the test, and the JSON body to post (None: a GET)."""
        path, seen, sent = check
        payload = None if sent is None else orjson.dumps(sent)
        headers = {} if sent is None else {"Content-Type": "application/json"}
        while time.perf_counter() - started < limit:
            self.connection.request("GET" if sent is None else "POST", path, payload, headers)
            reply = self.connection.getresponse()
            body = self.last = reply.read()
            if reply.status == 200 and seen(json.loads(body)):
                return time.perf_counter() - started
            time.sleep(poll)
        return float("inf")


def config(work: Path, bootstrap: str, redis_url: str, topic: str, http_port: int) -> Path:
    doc: dict[str, Any] = {
        "kafka": {"bootstrap_servers": bootstrap},
        "redis": {"url": redis_url},
        "delta": {"root": str(work / "warehouse")},
        "spark": {"checkpoint_root": str(work / "checkpoints")},
        "metrics": {"port": 0},
        "query": {"http_port": http_port},
        "maps": {
            MAP: {
                "source": {"topics": [topic], "format": "json", "schema": SCHEMA},
                "key": "id",
                "fold": {"mode": "merge"},
                "indexes": ["city"],
            }
        },
    }
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def percentiles(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    seen = [s for s in ordered if s != float("inf")]

    def at(pct: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * pct))] * 1000, 1)

    return {
        "samples": len(ordered),
        "unseen": len(ordered) - len(seen),
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
    }


def measure_move(
    readers: dict[str, Reader],
    checks: dict[str, tuple[str, Any, Any]],
    started: float,
    poll: float,
) -> dict[str, float]:
    """Each reader polling its path at once: the seconds until each saw the move."""
    waits: dict[str, float] = {}

    def read(name: str) -> None:
        waits[name] = readers[name].until(checks[name], started, poll, 30.0)

    threads = [threading.Thread(target=read, args=(n,)) for n in checks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--warmup-seconds", type=int, default=30)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--poll-ms", type=float, default=10)
    args = parser.parse_args()
    with services() as (bootstrap, redis_url), tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        topic = create_topic(bootstrap, 4)
        http_port, port = free_port(), free_port()
        path = config(work, bootstrap, redis_url, topic, http_port)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        rng = random.Random(5)
        seq = 0

        def send(key: str, city: str) -> None:
            nonlocal seq
            seq += 1
            doc = {"id": key, "city": city, "seq": seq}
            producer.produce(topic, key=key.encode(), value=orjson.dumps(doc))

        for i in range(args.keys):
            send(f"user-{i:06d}", f"c{i % CITIES}")
        producer.flush()
        client = redis.Redis.from_url(redis_url)
        run = ManagedProcess(
            [sys.executable, "-m", "materializer", "run", "-c", str(path)], work / "run.log"
        )
        service = None
        try:
            wait_for("the backlog", lambda: entity_count(client, MAP) >= args.keys, 900, run)

            def built() -> bool:
                states = declared_states(client_for(RedisConfig(url=redis_url)), MAP)
                return all(s.get("city") is not None and s["city"].ready for s in states.values())

            wait_for("the index", built, 300, run)
            service = start_query_service(work, path, port, http_port, EventLoop.UVLOOP)
            results: dict[str, list[float]] = {"get": [], "query": [], "sql": []}
            stop = threading.Event()

            def feed() -> None:
                interval = 1.0 / args.rate
                next_at = time.perf_counter()
                while not stop.is_set():
                    send(f"user-{rng.randrange(args.keys):06d}", f"c{rng.randrange(CITIES)}")
                    producer.poll(0)
                    next_at += interval
                    time.sleep(max(0.0, next_at - time.perf_counter()))

            feeder = threading.Thread(target=feed, daemon=True)
            feeder.start()
            time.sleep(args.warmup_seconds)
            poll = args.poll_ms / 1000
            readers = {name: Reader(http_port) for name in results}
            moves = 0
            ends = time.perf_counter() + args.seconds
            while time.perf_counter() < ends:
                moves += 1
                key, city = f"user-{rng.randrange(args.keys):06d}", f"moved-{moves}"
                send(key, city)
                started = time.perf_counter()
                where = urllib.parse.quote(f"city = '{city}'")
                checks = {
                    "get": (
                        f"/v1/maps/{MAP}/entities/{key}",
                        lambda b, c=city: b["entity"].get("city") == c,
                        None,
                    ),
                    "query": (
                        f"/v1/maps/{MAP}/query?where={where}",
                        lambda b, k=key: (
                            any(r["key"] == k for r in b["rows"])
                            and b.get("source") == "REDIS_INDEX"
                        ),
                        None,
                    ),
                    "sql": (
                        "/v1/sql",
                        lambda b, k=key: (
                            any(r["_key"] == k for r in b["rows"])
                            and b["tables"][0]["index"] == "city"
                        ),
                        {"sql": f"SELECT _key, seq FROM {MAP} WHERE city = $1", "params": [city]},
                    ),
                }
                waits = measure_move(readers, checks, started, poll)
                for name, wait in waits.items():
                    results[name].append(wait)
                    if wait == float("inf"):
                        print(
                            f"{name} never saw {key} move: {readers[name].last[:500]!r}",
                            file=sys.stderr,
                        )
                time.sleep(max(0.0, 1.0 - (time.perf_counter() - started)))
            stop.set()
            feeder.join()
            get = percentiles(results["get"])
            emit(name="visible_get", rate=args.rate, keys=args.keys, **get)
            for name, label in (("query", "visible_indexed_query"), ("sql", "visible_indexed_sql")):
                read = percentiles(results[name])
                ratio = round(read["p99_ms"] / get["p99_ms"], 2) if get["p99_ms"] else None
                emit(
                    name=label,
                    rate=args.rate,
                    keys=args.keys,
                    **read,
                    over_get_p99=ratio,
                    goal_over_get_p99=1.5,
                    goal_met=ratio is not None and read["unseen"] == 0 and ratio <= 1.5,
                )
        finally:
            if service is not None:
                service.stop()
            run.stop()


if __name__ == "__main__":
    main()
