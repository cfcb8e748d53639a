"""Two ``query-service serve`` processes over the same maps answer alike, and either may go.

Replicas share nothing but Redis, so any of them may take any call: behind one
port (gRPC servers set SO_REUSEPORT on Linux, so a second process binds the
port the first listens on and the kernel spreads new connections over both),
or behind a client that balances round robin over their two addresses. Every
answer is compared with the seeded maps (an independent reference) and with
the other replica's; each process's own request counter shows that it served;
once one process is gone the other answers alone.

Query and GetAsOf read a map's Delta table, not Redis, so they are not among
the calls compared here.
"""

from __future__ import annotations

import asyncio
import os
import random
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import orjson
import pytest
import redis
import yaml
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from materializer.contract.watermark import Watermark
from materializer.testing import free_port
from materializer.testing.process import ManagedProcess
from materializer.v1 import common_pb2 as common
from materializer.v1 import enrich_service_pb2 as epb
from materializer.v1 import enrich_service_pb2_grpc as epb_grpc
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from tests.helpers.enrich import SPECS, Maps, random_events, request, seed_maps, split
from tests.helpers.enrich import assert_answers as assert_enriched
from tests.helpers.query_redis import map_doc, query_service_command

DEADLINE = 30.0
START_SECONDS = 120.0
COMPARED = frozenset({"Get", "BatchGet", "Enrich"})
"""The methods whose calls the suite makes, as the request counter names them."""
HEALTH_CHECK = frozenset({"Check"})
MIN_CONNECTIONS = 16
MAX_CONNECTIONS = 64
ATTEMPTS = 5
FRESH_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
"""A channel of its own connection: channels share subchannels (and so TCP connections)
through a process-wide pool otherwise."""


# --- the seeded maps and what they must answer -------------------------------------------


@pytest.fixture()
def maps(redis_client: redis.Redis) -> Iterator[Maps]:
    """Users and companies, written as the materializer lays them out in Redis."""
    yield from seed_maps(redis_client)


def watermark(mark: Watermark) -> common.Watermark:
    """The watermark a lookup carries, built from the seeded one."""
    built = common.Watermark(
        batch_id=mark.batch_id,
        offsets=[
            common.PartitionOffset(topic=t, partition=p, offset=o)
            for t, ps in sorted(mark.offsets.items())
            for p, o in sorted(ps.items())
        ],
    )
    if mark.updated_at_ms:
        stamp = Timestamp()
        stamp.FromMilliseconds(mark.updated_at_ms)
        built.updated_at.CopyFrom(stamp)
    return built


@dataclass(frozen=True)
class Plan:
    """The calls of one suite, and what the seeded maps say they must answer."""

    gets: tuple[pb.GetRequest, ...]
    batches: tuple[pb.BatchGetRequest, ...]
    enrich: tuple[epb.EnrichRequest, ...]
    lookups: tuple[epb.Lookup, ...]

    @property
    def calls(self) -> int:
        """Calls per suite: every Get, every BatchGet, one Enrich stream."""
        return len(self.gets) + len(self.batches) + 1


def make_plan(maps: Maps) -> Plan:
    """Lookups of present and missing keys in both maps, and a two-map enrichment."""
    users, companies = maps.entities[maps.users], maps.entities[maps.companies]
    missing = ["nobody", "u99", "c99"]
    gets = [pb.GetRequest(map=maps.users, key=k) for k in [*list(users)[:6], "42", *missing]]
    gets += [pb.GetRequest(map=maps.companies, key=k) for k in ["c0", "c5", "nobody"]]
    batches = [
        pb.BatchGetRequest(map=maps.users, keys=[*users, *missing, "u0", "42"]),
        pb.BatchGetRequest(map=maps.companies, keys=["c99", *companies, "c0"]),
    ]
    lookups = SPECS["two-maps-three-rounds"](maps.users, maps.companies)
    rng = random.Random(17)
    enrich = [
        request(events, f"r{i}", lookups=lookups if i == 0 else None)
        for i, events in enumerate(split(rng, random_events(rng, 120)))
    ]
    return Plan(tuple(gets), tuple(batches), tuple(enrich), tuple(lookups))


def entity(maps: Maps, map_name: str, key: str) -> bytes:
    """The stored JSON of a key, empty when the map holds none."""
    found = maps.entities[map_name].get(key)
    return orjson.dumps(found) if found is not None else b""


@dataclass(frozen=True)
class Answers:
    """Everything one suite of calls was answered, in call order."""

    gets: tuple[pb.GetResponse, ...]
    batches: tuple[pb.BatchGetResponse, ...]
    enriched: tuple[epb.EnrichResponse, ...]


def assert_seeded(answers: Answers, plan: Plan, maps: Maps) -> None:
    """The answers are what the seeded maps hold, worked out without the service."""
    assert answers.gets == tuple(
        pb.GetResponse(
            found=bool(entity(maps, r.map, r.key)),
            entity=entity(maps, r.map, r.key),
            watermark=watermark(maps.marks[r.map]),
        )
        for r in plan.gets
    )
    assert answers.batches == tuple(
        pb.BatchGetResponse(
            entries=[
                pb.BatchGetEntry(
                    key=k, found=bool(entity(maps, r.map, k)), entity=entity(maps, r.map, k)
                )
                for k in r.keys
            ],
            watermark=watermark(maps.marks[r.map]),
        )
        for r in plan.batches
    )
    assert len(answers.enriched) == len(plan.enrich)
    for response, req in zip(answers.enriched, plan.enrich, strict=True):
        assert_enriched(response, req, plan.lookups, maps)


async def suite(channel: grpc.aio.Channel, plan: Plan) -> Answers:
    """Make every call of ``plan`` on ``channel``; calls wait for a ready connection."""
    stub = pb_grpc.MapServiceStub(channel)  # type: ignore[no-untyped-call]
    gets = [await stub.Get(r, timeout=DEADLINE, wait_for_ready=True) for r in plan.gets]
    batches = [await stub.BatchGet(r, timeout=DEADLINE, wait_for_ready=True) for r in plan.batches]
    enrich = epb_grpc.EnrichServiceStub(channel)  # type: ignore[no-untyped-call]
    call = enrich.Enrich(iter(plan.enrich), timeout=DEADLINE, wait_for_ready=True)
    enriched = [response async for response in call]
    return Answers(tuple(gets), tuple(batches), tuple(enriched))


async def on_new_connection(port: int, plan: Plan) -> Answers:
    """``suite`` over a connection of its own to ``port``."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=FRESH_CONNECTION) as channel:
        return await suite(channel, plan)


async def until_answered(attempt: Callable[[], Awaitable[Answers]]) -> Answers:
    """``attempt`` again when a call was cut off with its connection, a bounded number of times.

    A call already on a connection that dies fails UNAVAILABLE whatever the
    balancing; later ones are routed around the dead peer.
    """
    for _ in range(ATTEMPTS - 1):
        try:
            return await attempt()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
    return await attempt()


# --- the processes -----------------------------------------------------------------------


@dataclass
class Replica:
    """One ``query-service serve`` process and the ports it answers on."""

    proc: ManagedProcess
    port: int
    metrics_port: int

    def served(self) -> float:
        """Compared calls this very process answered, by its own Prometheus counter."""
        return self.requests(COMPARED)

    def requests(self, methods: frozenset[str]) -> float:
        """Calls of ``methods`` this process answered, whatever their status."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - a local http URL
            text = response.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "materializer_query_requests"
            for sample in family.samples
            if sample.name.endswith("_total") and sample.labels["method"] in methods
        )


StartReplica = Callable[[int], Replica]


@pytest.fixture()
def start_replica(tmp_path: Path, redis_url: str, maps: Maps) -> Iterator[StartReplica]:
    """Starts ``query-service serve`` on a port; every process is stopped after the test.

    The one config file leaves the metrics port off; each process gets a port
    of its own with ``--metrics-port`` and its gRPC port with ``--port``, so
    two of them may share the gRPC port while their counters stay apart.
    """
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "redis": {"url": redis_url},
                "query": {"host": "127.0.0.1", "metrics_port": None, "http_port": 0},
                "maps": {m: map_doc(m) for m in (maps.users, maps.companies)},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATERIALIZER_")}
    started: list[Replica] = []

    def start(port: int) -> Replica:
        metrics_port = free_port()
        args = [
            *query_service_command(),
            "serve",
            "-c",
            str(config_file),
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
        ]
        log = tmp_path / f"query-service-{len(started)}.log"
        replica = Replica(ManagedProcess(args, log, env=env), port, metrics_port)
        started.append(replica)
        return replica

    try:
        yield start
    finally:
        for replica in started:
            replica.proc.stop()


async def wait_serving(replica: Replica) -> None:
    """Until this very process has answered a health check SERVING on its gRPC port.

    On a shared port a check may reach the other process, so each one goes
    over a new connection and counts only once this process's counter shows it.
    """
    health = health_pb2.HealthCheckRequest()
    for _ in range(int(START_SECONDS / 0.2)):
        if not replica.proc.alive():
            raise AssertionError(f"query-service exited while starting:\n{replica.proc.tail()}")
        try:
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{replica.port}", options=FRESH_CONNECTION
            ) as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(health, timeout=5)
            if reply.status == health_pb2.HealthCheckResponse.SERVING and replica.requests(
                HEALTH_CHECK
            ):
                return
        except (grpc.aio.AioRpcError, OSError):
            pass  # not listening (or its metrics not served) yet
        await asyncio.sleep(0.2)
    raise AssertionError(f"query-service not serving:\n{replica.proc.tail()}")


def round_robin(*ports: int) -> grpc.aio.Channel:
    """One channel over every port, each call to the next connected process in turn."""
    target = "ipv4:" + ",".join(f"127.0.0.1:{p}" for p in ports)
    options = [("grpc.lb_policy_name", "round_robin"), *FRESH_CONNECTION]
    return grpc.aio.insecure_channel(target, options=options)


def who_answered(replicas: Sequence[Replica], before: Sequence[float], calls: int) -> Replica:
    """The one replica whose counter grew, by exactly the suite's calls."""
    grown = [r.served() - b for r, b in zip(replicas, before, strict=True)]
    answered = [r for r, g in zip(replicas, grown, strict=True) if g]
    assert len(answered) == 1, f"calls of one connection counted by {grown}"
    assert max(grown) == calls
    return answered[0]


# --- the tests ---------------------------------------------------------------------------


def test_two_processes_on_one_port_answer_alike_and_one_survives_the_other(
    maps: Maps, start_replica: StartReplica
) -> None:
    """Replicas behind one address, as a host running several of them exposes them."""
    port = free_port()
    plan = make_plan(maps)

    async def body() -> None:
        first = start_replica(port)
        await wait_serving(first)  # alone on the port: the second must share it, not take it
        second = start_replica(port)
        await wait_serving(second)
        replicas = [first, second]

        # New connections, each attributed to the process whose counter grew.
        by_replica: dict[int, list[Answers]] = {0: [], 1: []}
        connections = 0
        while connections < MIN_CONNECTIONS or min(len(a) for a in by_replica.values()) < 2:
            assert connections < MAX_CONNECTIONS, f"one process took every connection: {by_replica}"
            before = [r.served() for r in replicas]
            answers = await on_new_connection(port, plan)
            by_replica[replicas.index(who_answered(replicas, before, plan.calls))].append(answers)
            connections += 1

        baseline = by_replica[0][0]
        assert_seeded(baseline, plan, maps)
        assert all(a == baseline for seen in by_replica.values() for a in seen)

        # A crash: the kernel sends new connections to the listener that is left.
        first.proc.kill()
        assert not first.proc.alive()
        served_before = second.served()
        for _ in range(MIN_CONNECTIONS // 2):
            assert await until_answered(lambda: on_new_connection(port, plan)) == baseline
        assert second.served() - served_before >= MIN_CONNECTIONS // 2 * plan.calls

    asyncio.run(body())


def test_round_robin_over_two_processes_answers_alike_and_routes_around_a_stopped_one(
    maps: Maps, start_replica: StartReplica
) -> None:
    """Replicas at their own addresses, balanced by the client (as with a headless service)."""
    plan = make_plan(maps)

    async def body() -> None:
        replicas = [start_replica(free_port()), start_replica(free_port())]
        for replica in replicas:
            await wait_serving(replica)

        # Each process on its own.
        alone = [await on_new_connection(replica.port, plan) for replica in replicas]
        baseline = alone[0]
        assert_seeded(baseline, plan, maps)
        assert alone[1] == baseline

        # Through one balancing channel, until both processes have taken calls from it.
        before = [r.served() for r in replicas]
        async with round_robin(*(r.port for r in replicas)) as channel:
            for _ in range(20):
                assert await suite(channel, plan) == baseline
                if all(r.served() > b for r, b in zip(replicas, before, strict=True)):
                    break
            grown = [r.served() - b for r, b in zip(replicas, before, strict=True)]
            assert all(grown), f"round robin left a process idle: {grown}"

            # A graceful stop: the same channel moves every call to the other process.
            stopped, survivor = replicas
            stopped.proc.stop()
            assert not stopped.proc.alive()
            before_survivor = survivor.served()
            assert await until_answered(lambda: suite(channel, plan)) == baseline
            for _ in range(3):
                assert await suite(channel, plan) == baseline
        assert survivor.served() - before_survivor >= 4 * plan.calls

    asyncio.run(body())
