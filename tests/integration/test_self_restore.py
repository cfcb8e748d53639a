"""A Redis server restarted empty under a live ``materializer run``: the map restores itself.

The map keeps its fold state in Redis (an aggregate counts and sums per
key), so a copy folded on after a loss would count from nothing. The run
must notice the loss, restore the copy from Delta and the changelog, and
fold on exactly once; meanwhile a client calling ``Get`` must never be told
that a key it saw is not there.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time
from pathlib import Path

import grpc
import orjson
import pytest
import redis
import yaml
from redis.cluster import RedisCluster as ClusterClient

from materializer.config import parse_config
from materializer.contract.redis_layout import status_key
from materializer.contract.status import MapReport
from materializer.testing import produce
from materializer.testing.process import ManagedProcess
from materializer.testing.redis import RedisCluster, RedisServer
from materializer.testing.reference import fold_aggregate
from materializer.testing.waiting import wait_until
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from tests.helpers.query_redis import serving
from tests.helpers.slices import delta_map_rs, redis_map, slice_config

KEYS = [f"k{i}" for i in range(100)]
AGGREGATES = {"events": {"fn": "count"}, "age_total": {"fn": "sum", "field": "age"}}
REFERENCE = {name: (a["fn"], a.get("field")) for name, a in AGGREGATES.items()}


def _records(start: int, keys: list[str]) -> list[tuple[bytes, bytes]]:
    return [
        (k.encode(), orjson.dumps({"id": k, "name": f"v{start + i}", "age": (start + i) % 90}))
        for i, k in enumerate(keys)
    ]


class _Lookups:
    """A client calling ``Get`` on seen keys until stopped, counting each kind of answer
    (``table``: while a key was lost, the map's Delta table answered it)."""

    def __init__(self, config: object) -> None:
        self.config = config
        self.stop = threading.Event()
        self.answers: dict[str, int] = {}
        self.missing: list[str] = []
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        rng = random.Random(7)
        async with serving(self.config) as channel:  # type: ignore[arg-type]
            stub = pb_grpc.MapServiceStub(channel)
            while not self.stop.is_set():
                key = rng.choice(KEYS)
                try:
                    reply = await stub.Get(pb.GetRequest(map="restored", key=key), timeout=5)
                    kind = "found" if reply.found else "not_found"
                    if reply.from_table:  # Redis lost the key: the table's copy answered
                        kind = "table"
                    elif not reply.found:
                        self.missing.append(key)
                except grpc.aio.AioRpcError as exc:
                    kind = exc.code().name
                self.answers[kind] = self.answers.get(kind, 0) + 1
                await asyncio.sleep(0.005)


class _Stack:
    """One server, or a cluster of three masters; ``lose`` restarts one empty."""

    def __init__(self, cluster: bool) -> None:
        self.cluster = cluster
        self.servers = RedisCluster(3) if cluster else RedisServer()

    def __enter__(self) -> _Stack:
        self.servers.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.servers.stop()

    @property
    def url(self) -> str:
        return self.servers.url

    def client(self) -> redis.Redis | ClusterClient:
        if self.cluster:
            return ClusterClient.from_url(self.url)
        return redis.Redis.from_url(self.url)

    def lose(self) -> None:
        """Restart a server (on a cluster: the second master) without its data; a master
        keeps its cluster config, so it rejoins owning its slots, empty."""
        if isinstance(self.servers, RedisCluster):
            self.servers.nodes[1].restart_empty()
        else:
            self.servers.restart_empty()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("cluster", [False, True], ids=["server", "cluster"])
def test_redis_restarted_empty_under_a_live_run_restores_itself_exactly_once(
    kafka_bootstrap, new_topic, tmp_path: Path, cluster: bool
):
    topic = new_topic(2)
    with _Stack(cluster) as stack:
        client = stack.client()
        doc = slice_config(
            tmp_path,
            kafka_bootstrap,
            stack.url,
            topic,
            map_name="restored",
            fold={"mode": "aggregate", "aggregates": AGGREGATES},
        )
        doc["redis"]["cluster"] = cluster
        config_file = tmp_path / "maps.yaml"
        config_file.write_text(yaml.safe_dump(doc))
        produced: list[tuple[int, int, bytes, bytes]] = []

        def send(records: list[tuple[bytes, bytes]]) -> None:
            positions = produce(kafka_bootstrap, topic, records)
            produced.extend((p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True))

        send(_records(0, KEYS))
        args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
        proc = ManagedProcess(args, tmp_path / "run.log")
        lookups = _Lookups(parse_config(doc))
        try:
            wait_until(
                "every key in Redis",
                lambda: len(redis_map(client, "restored")) == len(KEYS),
                alive=proc.alive,
            )
            lookups.thread.start()
            rng = random.Random(11)
            for round_ in range(40):
                send(_records(1000 * (round_ + 1), rng.sample(KEYS, 20)))
                if round_ == 10:
                    stack.lose()
                time.sleep(0.1)
            reference = fold_aggregate(produced, "id", REFERENCE)

            held: dict[str, object] = {}

            def restored_and_caught_up() -> bool:
                held.clear()
                held.update(redis_map(client, "restored"))
                return held == reference

            try:
                wait_until(
                    "Redis to hold the reference fold again",
                    restored_and_caught_up,
                    alive=proc.alive,
                )
            except (TimeoutError, RuntimeError):
                wrong = {k: (held.get(k), v) for k, v in reference.items() if held.get(k) != v}
                state = "still running" if proc.alive() else "exited"
                pytest.fail(
                    f"{len(wrong)} keys differ (Redis, reference): {dict(list(wrong.items())[:5])};"
                    f" the run {state}:\n{proc.log()[-6000:]}"
                )
            lookups.stop.set()
            lookups.thread.join(30)
            table = tmp_path / "warehouse" / "restored"
            wait_until("the Delta table to hold it", lambda: _delta(table) == reference)
            report = MapReport.from_hash(client.hgetall(status_key("restored")))
            assert report is not None and report.state == "running"
        finally:
            lookups.stop.set()
            proc.stop()
        log = proc.log()
        assert "Redis lost its copy" in log and "copy restored" in log, log[-3000:]
        # A key once seen was never answered as missing; some lookups met the loss.
        assert lookups.missing == [], lookups.answers
        assert lookups.answers.get("found", 0) > 0, lookups.answers
        assert set(lookups.answers) <= {"found", "table", "UNAVAILABLE"}, lookups.answers


def _delta(table: Path) -> dict[str, object] | None:
    if not (table / "_delta_log").is_dir():
        return None
    return delta_map_rs(table)
