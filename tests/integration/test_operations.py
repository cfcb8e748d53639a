"""Operating one real ``materializer run`` (each costs a JVM start, so one test walks through
it all): status, pause and resume from AdminService and the command line, metrics, rehydrate
under the hold, a rebuild that switches readers while they keep calling ``Get``, restart."""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import grpc
import orjson
import redis
import yaml
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner

from materializer.cli import app
from materializer.config import AppConfig, parse_config
from materializer.contract.control import MapControl
from materializer.contract.redis_layout import entity_key, generation_key, meta_key
from materializer.contract.watermark import Watermark
from materializer.ops.rebuild import rebuild
from materializer.testing import free_port, produce
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import fold_latest
from materializer.testing.waiting import wait_until
from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import map_service_pb2 as map_pb
from materializer.v1 import map_service_pb2_grpc as map_grpc
from query_service.server import create_server
from query_service.stores.redis import RedisMapStore
from tests.helpers.admin import call
from tests.helpers.slices import FIELDS, delta_map_rs, end_offsets, redis_map, slice_config

KEYS = 60


def _records(start: int, n: int) -> list[tuple[bytes | None, bytes | None]]:
    out: list[tuple[bytes | None, bytes | None]] = []
    for i in range(start, start + n):
        key = f"u{i % KEYS}"
        out.append((key.encode(), orjson.dumps({"id": key, "name": f"n{i}", "age": i})))
    return out


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def _status(config_file: Path, name: str) -> dict[str, Any]:
    result = _cli("status", name, "-c", str(config_file), "--json")
    assert result.exit_code == 0, result.output
    return orjson.loads(result.output.strip().splitlines()[-1])  # type: ignore[no-any-return]


class Readers:
    """A query service in its own thread, and a reader calling Get on known keys until stopped."""

    def __init__(self, config: AppConfig, name: str, keys: list[str]) -> None:
        self.config, self.name, self.keys = config, name, keys
        self.reads = 0
        self.errors: list[str] = []
        self.missing: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Readers:
        self._thread.start()
        wait_until("the reader's first lookups", lambda: self.reads > 20 or bool(self.errors))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    async def _main(self) -> None:
        store = RedisMapStore.from_url(self.config.redis.url)
        server, port = await create_server(self.config, store=store)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = map_grpc.MapServiceStub(channel)
                rng = random.Random(7)
                while not self._stop.is_set():
                    key = rng.choice(self.keys)
                    try:
                        got = await stub.Get(map_pb.GetRequest(map=self.name, key=key), timeout=10)
                    except grpc.aio.AioRpcError as exc:
                        self.errors.append(f"{exc.code()}: {exc.details()}")
                        continue
                    self.reads += 1
                    if not got.found:
                        self.missing.append(key)
                    await asyncio.sleep(0.005)
        finally:
            await server.stop(None)
            await store.close()


def test_operate_a_running_map_and_rebuild_it_under_reads(
    spark, kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    name = f"ops{uuid.uuid4().hex[:6]}"
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name)
    doc.setdefault("metrics", {})["state_interval"] = "1 second"
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    cfg = parse_config(doc)
    c = str(config_file)
    records = _records(0, 300)
    positions = produce(kafka_bootstrap, topic, records)

    def folded(physical: str) -> bool:
        mark = Watermark.from_hash(redis_client.hgetall(meta_key(physical)))
        return mark is not None and mark.offsets.get(topic) == end_offsets(positions)

    def expected() -> dict[str, Any]:
        events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
        return fold_latest(events, "id", FIELDS)

    metrics_port = free_port()
    proc = ManagedProcess(
        [sys.executable, "-m", "materializer", "run", "-c", c]
        + ["--metrics-port", str(metrics_port)],  # over the config's metrics.port
        tmp_path / "r.log",
    )
    try:
        wait_until("the first events folded", lambda: folded(name))
        wait_until("running reported", lambda: _status(config_file, name)["state"] == "running")
        status = _status(config_file, name)
        assert status["total_lag"] == 0
        assert status["generation"] == 0
        assert {(p["partition"], p["lag"]) for p in status["partitions"]} == {(0, 0), (1, 0)}
        # The run serves its metrics: the fold read every record there was.
        rows_in = f'materializer_rows_in_total{{map="{name}",query="fold"}} 300.0'
        wait_until("the fold's rows on /metrics", lambda: rows_in in _scrape(metrics_port))
        # The fold's state: one key per entity, counted by the run for status and metrics.
        wait_until("the state measured", lambda: _status(config_file, name)["state_keys"] == KEYS)
        assert _status(config_file, name)["state_bytes"] > 0
        state_keys = f'materializer_state_keys{{map="{name}"}} {float(KEYS)}'
        wait_until("the state on /metrics", lambda: state_keys in _scrape(metrics_port))
        statuses = call(cfg, "GetStatus", admin_pb.GetStatusRequest(map=name)).maps
        assert statuses[0].state_keys == KEYS and statuses[0].state_bytes > 0

        # Paused through AdminService, seen and resumed from the command line.
        call(cfg, "Pause", admin_pb.ControlRequest(map=name))
        paused = _cli("pause", name, "-c", c)
        assert paused.exit_code == 0, paused.output
        assert f"{name}: paused" in paused.output
        held = redis_client.hget(meta_key(name), "offsets")
        more = _records(300, 40)
        positions += produce(kafka_bootstrap, topic, more)
        records += more
        wait_until("lag seen while paused", lambda: _status(config_file, name)["total_lag"] == 40)
        assert redis_client.hget(meta_key(name), "offsets") == held
        resumed = _cli("resume", name, "-c", c)
        assert resumed.exit_code == 0, resumed.output
        wait_until("the paused events folded", lambda: folded(name))
        assert redis_map(redis_client, name) == expected()

        # Rehydrate under a live run: the map is held still for the load, then resumed.
        redis_client.delete(entity_key(name, "u1"))
        redis_client.set(entity_key(name, "zzz"), b"{}")
        rehydrated = _cli("rehydrate", name, "-c", c)
        assert rehydrated.exit_code == 0, rehydrated.output
        assert "paused meanwhile" in rehydrated.output
        assert MapControl(redis_client, name).request().desired == "running"
        assert redis_map(redis_client, name) == expected()

        # Rebuild while a reader keeps calling Get and a producer keeps updating.
        keys = [f"u{i}" for i in range(KEYS)]
        phases: list[str] = []
        stop_producing = threading.Event()
        produced: list[tuple[list[tuple[int, int]], list[Any]]] = []

        def keep_producing() -> None:
            i = 340
            while not stop_producing.wait(0.2):
                batch = _records(i, 5)
                produced.append((produce(kafka_bootstrap, topic, batch), batch))
                i += 5

        producer = threading.Thread(target=keep_producing, daemon=True)
        with Readers(cfg, name, keys) as readers:
            producer.start()
            try:
                generation = rebuild(
                    spark,
                    cfg,
                    name,
                    grace_seconds=3.0,
                    report=lambda p: phases.append(p.phase) if p.phase not in phases else None,
                )
            finally:
                stop_producing.set()
                producer.join(30)
            reads_at_switch = readers.reads
            wait_until("reads after the switch", lambda: readers.reads > reads_at_switch + 50)
        for pos, batch in produced:
            positions += pos
            records += batch
        assert generation == 1
        assert phases == ["cleaning", "replaying", "switching", "grace", "dropping", "done"]
        assert readers.errors == []
        assert readers.missing == []
        assert redis_client.get(generation_key(name)) == b"1"

        new = f"{name}~1"
        wait_until("the resumed map folding into the new copy", lambda: folded(new))
        assert redis_map(redis_client, new) == expected()
        assert redis_map(redis_client, name) == {}  # the old copy's entities are gone
        assert not (tmp_path / "warehouse" / name).exists()
        wait_until(
            "the new table caught up",
            lambda: (
                (tmp_path / "warehouse" / new).exists()
                and delta_map_rs(tmp_path / "warehouse" / new) == expected()
            ),
        )
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        topics = admin.list_topics(timeout=10).topics
        assert doc["maps"][name]["changelog"]["topic"] not in topics
        assert doc["maps"][name]["changelog"]["topic"] + ".g1" in topics
        status = _status(config_file, name)
        assert (status["generation"], status["state"]) == (1, "running")

        restarted = _cli("restart", name, "-c", c)
        assert restarted.exit_code == 0, restarted.output
        later = _records(10_000, 20)
        positions += produce(kafka_bootstrap, topic, later)
        records += later
        wait_until("events after the restart folded", lambda: folded(new))
        assert redis_map(redis_client, new) == expected()
        assert "restart requested" in proc.log()
    finally:
        proc.stop()

    assert _status(config_file, name)["state"] == "stopped"
    stopped = call(cfg, "GetStatus", admin_pb.GetStatusRequest(map=name)).maps[0]
    assert stopped.state == admin_pb.MapStatus.State.STOPPED
    failed = _cli("status", "nosuchmap", "-c", c)
    assert failed.exit_code == 2
    assert "maps.nosuchmap: no such map" in failed.output
