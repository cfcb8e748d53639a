"""Lookups through a restore: ``Get`` latency while a map of 1M entities that Redis lost is
written back, through a real ``query-service`` process, as clients see it.

One ``redis-server`` and one Kafka broker (no Spark). A map's table of ``--entities``
rows is written with delta-rs and rehydrated into Redis (``materializer rehydrate``'s
code); ``query-service serve`` runs over it, and two client threads call ``Get`` over
gRPC on random keys, one call at a time each, for the whole run:

  before     ``--warm-seconds`` of lookups Redis answers: the baseline;
  cold       Redis loses the map (``FLUSHALL``) and ``materializer rehydrate``, a
             process of its own, writes it back; every lookup that starts between
             the loss and the end of that process is counted: those Redis cannot
             answer are answered from the table, whose keys and entities the query
             service reads into memory at the first;
  warm       the same again 2 s later, the table's copy still in memory.

The goal: ``Get`` p99 within 10 ms during the restore, every lookup answered.

    .venv/bin/python bench/restore_lookups.py [--entities 1000000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import redis
import yaml
from query_services import start_query_service
from rehydrate import MAP, config, emit, kafka, loadavg, make_table

from materializer.contract.table_layout import table_path
from materializer.restore.rehydrate import rehydrate
from materializer.testing import RedisServer, create_topic, free_port
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.event_loop import EventLoop

Call = tuple[float, float, str]
"""A lookup: when it started (perf_counter), its seconds, and what answered (redis,
table, or the status code's name)."""


class Lookups:
    """Client threads calling ``Get`` on random keys until stopped."""

    def __init__(self, port: int, keys: int, threads: int = 2) -> None:
        self.calls: list[Call] = []
        self.errors: dict[str, str] = {}
        """The first message of each status code met."""
        self.stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(port, keys, i), daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, port: int, keys: int, seed: int) -> None:
        import random

        rng = random.Random(seed)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.MapServiceStub(channel)  # type: ignore[no-untyped-call]
            while not self.stop.is_set():
                key = f"user-{rng.randrange(keys):07d}"
                started = time.perf_counter()
                try:
                    reply = stub.Get(pb.GetRequest(map=MAP, key=key), timeout=10)
                    kind = "table" if reply.from_table else "redis"
                    if not reply.found:
                        kind += "-missing"
                except grpc.RpcError as exc:
                    kind = exc.code().name
                    self.errors.setdefault(kind, exc.details() or "")
                self.calls.append((started, time.perf_counter() - started, kind))

    def close(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(30)


def summary(calls: list[Call]) -> dict[str, Any]:
    seconds = sorted(c[1] for c in calls)

    def at(pct: float) -> float | None:
        if not seconds:
            return None
        return round(seconds[min(len(seconds) - 1, int(pct * len(seconds)))] * 1000, 2)

    kinds: dict[str, int] = {}
    for _, _, kind in calls:
        kinds[kind] = kinds.get(kind, 0) + 1
    table = sorted(c[1] for c in calls if c[2].startswith("table"))
    table_p99 = (
        round(table[min(len(table) - 1, int(0.99 * len(table)))] * 1000, 2) if table else None
    )
    return {
        "calls": len(calls),
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "max_ms": at(1.0),
        "table_answers_p99_ms": table_p99,
        **kinds,
    }


def restore(lookups: Lookups, client: redis.Redis, config_file: Path) -> tuple[list[Call], float]:
    """Redis loses the map and ``materializer rehydrate`` writes it back, in a process of
    its own as an operator (or the run's self-repair) does: the lookups started
    meanwhile, and the seconds from the loss to the end of the restore."""
    lost = time.perf_counter()
    client.flushall()
    command = [sys.executable, "-m", "materializer", "rehydrate", MAP, "-c", str(config_file)]
    subprocess.run(command, check=True, capture_output=True)
    done = time.perf_counter()
    time.sleep(1.0)  # the calls started before the end finish
    return [c for c in list(lookups.calls) if lost <= c[0] <= done], done - lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--warm-seconds", type=float, default=5.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-restore-lookups-"))
    with kafka() as bootstrap, RedisServer() as server:
        cfg = config(bootstrap, server.url, work)
        create_topic(bootstrap, 1, name="bench-events")
        emit(name="table", **make_table(table_path(cfg, MAP), args.entities))
        client = redis.Redis.from_url(server.url, socket_timeout=300)
        rehydrate(cfg, MAP, client)
        path = work / "maps.yaml"
        source = {"topics": ["bench-events"], "schema": "id STRING"}
        doc = {
            "kafka": {"bootstrap_servers": bootstrap},
            "redis": {"url": server.url},
            "delta": {"root": str(work / "warehouse")},
            "catalog": {"enabled": False},
            "maps": {MAP: {"source": source, "key": "id"}},
        }
        path.write_text(yaml.safe_dump(doc))
        port = free_port()
        service = start_query_service(work, path, port, free_port(), EventLoop.UVLOOP)
        lookups = Lookups(port, args.entities)
        try:
            started = time.perf_counter()
            time.sleep(args.warm_seconds)
            before = [c for c in list(lookups.calls) if c[0] >= started]
            emit(name="get_before_loss", entities=args.entities, **summary(before))
            for phase in ("cold", "warm"):
                during, seconds = restore(lookups, client, path)
                result = summary(during)
                answered = result["calls"] == sum(
                    n for k, n in result.items() if k.startswith(("redis", "table"))
                )
                emit(
                    name=f"get_during_restore_{phase}",
                    entities=args.entities,
                    restore_s=round(seconds, 2),
                    **result,
                    goal_p99_ms=10,
                    goal_met=answered and (result["p99_ms"] or 0) <= 10,
                    loadavg_1m=loadavg(),
                    errors=lookups.errors,
                )
                time.sleep(2.0)
        finally:
            lookups.close()
            service.stop()


if __name__ == "__main__":
    main()
