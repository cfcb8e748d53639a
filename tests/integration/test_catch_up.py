"""A map that starts on a backlog says so: a real ``materializer run`` folds a topic that holds
many small events, a few batches at a time, while every viewer watches it catch up.

While it catches up, ``materializer status``, ``GetStatus``, the HTTP status and the
run's metrics say ``catching_up``, with records left, a rate and an ETA; its map
health is NOT_SERVING and ``/readyz?map=`` answers 503 saying why, while the overall
health serves and a ``Get`` answers with a watermark short of the log end. Once it
has caught up: ``running``, nothing left, serving. Nothing here asserts how long any
of it took.
"""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from materializer.cli import app
from materializer.config import parse_config
from materializer.contract.redis_layout import status_key
from materializer.contract.status import MapReport, PartitionCatchUp
from materializer.testing import free_port, produce
from materializer.testing.process import ManagedProcess
from materializer.testing.waiting import eventually
from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import admin_service_pb2_grpc as admin_grpc
from materializer.v1 import map_service_pb2 as map_pb
from materializer.v1 import map_service_pb2_grpc as map_grpc
from tests.helpers.query_redis import Front, front, serve_http, write_batch
from tests.helpers.slices import end_offsets, slice_config

EVENTS = 30_000
"""Sixty batches of ``PER_BATCH``: every viewer has seen the map catch up after its first
few batches, well before the last."""
KEYS = 50
"""Few keys: each batch sends at most this many changelog records, so the Delta table
keeps up and the run's stop drains little."""
PER_BATCH = 500
"""``spark.max_offsets_per_trigger``: the backlog takes many batches."""
READY_LAG = 2_000

State = admin_pb.MapStatus.State
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _events() -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(EVENTS):
        key = f"k{i % KEYS}"
        out.append((key.encode(), orjson.dumps({"id": key, "name": f"v{i}", "age": i % 90})))
    return out


class _Viewers:
    """Every viewer of one map: the CLI, GetStatus, HTTP status and readiness, the gRPC
    health, lookups and the run's metrics."""

    def __init__(self, f: Front, name: str, config_file: Path, metrics_port: int) -> None:
        self.f, self.name = f, name
        self.config_file, self.metrics_port = config_file, metrics_port
        self.admin = admin_grpc.AdminServiceStub(f.channel)
        self.health = health_pb2_grpc.HealthStub(f.channel)
        self.maps = map_grpc.MapServiceStub(f.channel)

    async def status(self) -> admin_pb.MapStatus:
        reply = await self.admin.GetStatus(admin_pb.GetStatusRequest(map=self.name), timeout=30)
        return reply.maps[0]

    async def cli(self) -> dict[str, Any]:
        def invoke() -> dict[str, Any]:
            result = CliRunner().invoke(
                app, ["status", self.name, "--json", "-c", str(self.config_file)]
            )
            assert result.exit_code == 0, result.output
            line = next(x for x in result.output.splitlines() if x.startswith("{"))
            return orjson.loads(line)  # type: ignore[no-any-return]

        return await asyncio.to_thread(invoke)

    async def map_health(self, service: str) -> int:
        request = health_pb2.HealthCheckRequest(service=service)
        return (await self.health.Check(request, timeout=10)).status  # type: ignore[no-any-return]

    async def ready(self, query: str = "") -> tuple[int, dict[str, Any]]:
        async with self.f.http.get(f"{self.f.base}/readyz{query}") as r:
            return r.status, orjson.loads(await r.read())

    async def metrics(self) -> dict[str, float]:
        """The run's samples of this map, by name (and ``partition`` for records left)."""

        def scrape() -> str:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - loopback
                return str(answer.read().decode())

        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(await asyncio.to_thread(scrape)):
            for s in family.samples:
                if s.labels.get("map") == self.name:
                    suffix = f":{s.labels['partition']}" if "partition" in s.labels else ""
                    samples[s.name + suffix] = s.value
        return samples


@pytest.mark.timeout(900)
def test_a_map_catching_up_on_a_backlog_says_so_everywhere_until_it_is_ready(
    kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    ends = end_offsets(produce(kafka_bootstrap, topic, _events()))
    name = f"cu{uuid.uuid4().hex[:8]}"
    metrics_port = free_port()
    doc = slice_config(
        tmp_path,
        kafka_bootstrap,
        redis_url,
        topic,
        map_name=name,
        spark={"max_offsets_per_trigger": PER_BATCH},
        catch_up={"ready_lag": READY_LAG},
    )
    doc["metrics"] = {"host": "127.0.0.1", "port": metrics_port}
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    proc = ManagedProcess(args, tmp_path / "run.log")

    async def main() -> None:
        async with front(parse_config(doc)) as f:
            await _watch(_Viewers(f, name, config_file, metrics_port), topic, ends, proc)

    try:
        asyncio.run(main())
    except (TimeoutError, AssertionError):
        print(proc.log()[-6000:], file=sys.stderr)
        raise
    finally:
        proc.stop()


async def _watch(v: _Viewers, topic: str, ends: dict[int, int], proc: ManagedProcess) -> None:
    total = sum(ends.values())

    def alive() -> None:
        if not proc.alive():
            raise RuntimeError(f"the run exited:\n{proc.log()[-3000:]}")

    # The run starts its JVM, then folds PER_BATCH records a batch: catching up, with a rate
    # and an ETA once two looks at Kafka saw the watermark move.
    seen: list[admin_pb.MapStatus] = []

    async def measured() -> bool:
        alive()
        s = await v.status()
        seen[:] = [s]
        return (
            s.state == State.CATCHING_UP
            and s.total_lag > READY_LAG
            and s.catch_up_rate > 0
            and s.eta_seconds > 0
        )

    await eventually("GetStatus: catching up, with a rate and an ETA", measured, timeout=400)
    status = seen[0]
    assert 0 < status.total_lag < total
    assert sum(p.lag for p in status.partitions) == status.total_lag
    assert {p.partition for p in status.partitions} == set(ends)
    assert any(p.catch_up_rate > 0 for p in status.partitions)

    # A lookup answers meanwhile, with the watermark that tells how far the map is.
    reply = await v.maps.Get(map_pb.GetRequest(map=v.name, key="k1"), timeout=30)
    assert reply.found
    folded = {o.partition: o.offset for o in reply.watermark.offsets if o.topic == topic}
    assert sum(folded.values()) < total

    cli: dict[str, Any] = {}

    async def cli_catching_up() -> bool:
        cli.clear()
        cli.update(await v.cli())
        return cli["state"] == "catching_up" and (cli["eta_seconds"] or 0) > 0

    await eventually("status --json: catching up", cli_catching_up, timeout=60)
    assert cli["records_left"] > 0 and cli["catch_up_rate"] > 0
    assert cli["input_rate"] == 0  # nothing is produced meanwhile
    assert [p["partition"] for p in cli["partitions"]] == sorted(ends)
    assert sum(p["records_left"] for p in cli["partitions"]) == cli["records_left"]

    http = await v.f.json("GET", f"/v1/maps/{v.name}/status")
    assert http["state"] in ("CATCHING_UP", "RUNNING")  # it may have caught up by now
    assert {"catch_up_rate", "input_rate", "eta_seconds"} <= http.keys()
    assert {"catch_up_rate", "input_rate", "eta_seconds"} <= http["partitions"][0].keys()

    async def not_ready() -> bool:
        status, body = await v.ready(f"?map={v.name}")
        return status == 503 and "catching up" in body["error"]["message"]

    await eventually("/readyz?map=: 503, catching up", not_ready, timeout=60)
    assert await v.map_health(f"map/{v.name}") == NOT_SERVING
    assert await v.map_health("") == SERVING  # one map catching up keeps the replica in
    assert (await v.ready())[0] == 200

    async def metrics_catching_up() -> bool:
        samples = await v.metrics()
        return (
            samples.get("materializer_catching_up") == 1
            and samples.get("materializer_catch_up_rate", 0) > 0
            and samples.get("materializer_catch_up_eta_seconds", 0) > 0
            and sum(samples.get(f"materializer_records_left:{p}", 0) for p in ends) > 0
        )

    await eventually("metrics: catching up", metrics_catching_up, timeout=60)

    # Caught up: running, nothing left, serving again.
    async def caught_up() -> bool:
        alive()
        s = await v.status()
        return s.state == State.RUNNING and s.total_lag == 0 and s.eta_seconds == 0

    await eventually("GetStatus: running, nothing left", caught_up, timeout=600)
    status = await v.status()
    assert [(p.partition, p.materialized_offset, p.lag) for p in status.partitions] == [
        (p, ends[p], 0) for p in sorted(ends)
    ]

    async def serving() -> bool:
        return await v.map_health(f"map/{v.name}") == SERVING and (
            await v.ready(f"?map={v.name}")
        ) == (200, {"status": "SERVING"})

    await eventually("map health: serving", serving, timeout=60)
    cli = await v.cli()
    assert (cli["state"], cli["records_left"], cli["eta_seconds"]) == ("running", 0, 0)
    samples = await v.metrics()
    assert samples["materializer_catching_up"] == 0
    assert [samples[f"materializer_records_left:{p}"] for p in sorted(ends)] == [0] * len(ends)
    reply = await v.maps.Get(map_pb.GetRequest(map=v.name, key="k1"), timeout=30)
    assert {o.partition: o.offset for o in reply.watermark.offsets} == ends


def test_a_reported_catch_up_reaches_status_and_health_and_lookups_still_answer(
    kafka_bootstrap, redis_url, redis_client, new_topic
):
    """What the run reports is what every viewer shows: no Spark here, the report is written
    as the run writes it."""
    topic = new_topic(2)
    records = [(f"k{i}".encode(), b"{}") for i in range(10)]
    ends = {0: 0, 1: 0} | end_offsets(produce(kafka_bootstrap, topic, records))
    name = f"cu{uuid.uuid4().hex[:8]}"
    cfg = parse_config(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "redis": {"url": redis_url},
            "maps": {name: {"source": {"topics": [topic], "schema": "id STRING"}, "key": "id"}},
        }
    )
    write_batch(redis_url, name, 0, {"k": b'{"id":"k"}'}, {topic: {p: 0 for p in ends}})
    partitions = tuple(
        PartitionCatchUp(topic, p, ends[p], 4.0, 1.0, ends[p] / 3.0) for p in sorted(ends)
    )

    def report(state: str) -> None:
        figures = MapReport(
            state,
            reported_at_ms=int(time.time() * 1000),
            records_left=sum(ends.values()),
            catch_up_rate=8.0,
            input_rate=2.0,
            eta_seconds=sum(ends.values()) / 6.0,
            catch_up_partitions=partitions,
        )
        redis_client.hset(status_key(name), mapping=figures.to_hash())

    async def body(f: Front) -> None:
        v = _Viewers(f, name, Path("-"), 0)
        report("catching_up")
        await eventually("map health: not serving", lambda: _is(v, NOT_SERVING))
        status, answer = await v.ready(f"?map={name}")
        assert status == 503
        message = answer["error"]["message"]
        assert f"map {name!r} is catching up ({sum(ends.values())} records left" in message
        assert await v.map_health("") == SERVING
        assert (await v.ready())[0] == 200
        s = await v.status()
        assert (s.state, s.total_lag, s.catch_up_rate, s.input_rate) == (
            State.CATCHING_UP,
            sum(ends.values()),
            8.0,
            2.0,
        )
        assert s.eta_seconds == sum(ends.values()) / 6.0
        rows = [
            (p.partition, p.lag, p.catch_up_rate, p.input_rate, p.eta_seconds) for p in s.partitions
        ]
        assert rows == [(p, ends[p], 4.0, 1.0, ends[p] / 3.0) for p in sorted(ends)]
        http = await f.json("GET", f"/v1/maps/{name}/status")
        assert (http["state"], http["catch_up_rate"], http["eta_seconds"]) == (
            "CATCHING_UP",
            8.0,
            sum(ends.values()) / 6.0,
        )
        assert http["partitions"][0]["input_rate"] == 1.0
        # Lookups answer as they do, with the watermark that tells how far the map is.
        got = await v.maps.Get(map_pb.GetRequest(map=name, key="k"), timeout=30)
        assert got.found and [o.offset for o in got.watermark.offsets] == [0] * len(ends)

        report("paused")  # a paused map has no catch-up figures, whatever its report holds
        s = await v.status()
        assert (s.state, s.catch_up_rate, s.eta_seconds) == (State.PAUSED, 0.0, -1.0)
        assert {p.eta_seconds for p in s.partitions} == {-1.0}
        report("running")
        await eventually("map health: serving", lambda: _is(v, SERVING))
        assert await v.ready(f"?map={name}") == (200, {"status": "SERVING"})

    serve_http(cfg, body)


async def _is(v: _Viewers, status: int) -> bool:
    return await v.map_health(f"map/{v.name}") == status
