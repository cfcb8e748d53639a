"""Reads that are more than a key lookup in Redis, over the entities the real pipeline
wrote (its Delta table and Redis map):

- Watch with a filter, over gRPC and as Server-Sent Events, against a plain-Python
  reference of which changes it sends: steps of writes through the fold's own Redis
  Functions; after each step the streams are read up to a change of that step that
  surely matches, so each change is decided on the value its step wrote;
- lookups while Redis has lost the map's copy and its run writes it back: answered
  from the Delta table, with its version and watermark, byte for byte as Redis held
  them."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import grpc
import orjson
import pytest
import redis
from deltalake import DeltaTable

from materializer.config import KafkaConfig
from materializer.contract.markers import markers
from materializer.contract.redis_layout import entity_key, meta_key, status_key
from materializer.contract.status import MapReport
from materializer.contract.table_marks import table_watermark
from materializer.contract.watermark import Watermark
from materializer.redis.deliveries import producer_settings
from materializer.redis.functions import FoldTarget
from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import admin_service_pb2_grpc as admin_grpc
from materializer.v1 import common_pb2 as common
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as map_grpc
from tests.helpers.query_redis import Front, serve_http
from tests.helpers.query_redis import run as run_channel
from tests.helpers.query_table import Entity, Table, build_table, new_map_name, run
from tests.helpers.redis_fold import apply

MAP = new_map_name()
WHERE = "age >= 50 AND name <> 'Bob'"
Sent = tuple[str, int, bool]
"""A change as the reference and the streams are compared: key, operation, left."""


def matches(entity: Entity | None) -> bool:
    """``WHERE`` in plain Python, SQL's NULLs included: a missing field never matches."""
    return (
        entity is not None
        and entity.get("age") is not None
        and entity["age"] >= 50
        and entity.get("name") is not None
        and entity["name"] != "Bob"
    )


@pytest.fixture(scope="module")
def table(
    spark: Any, kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Table:
    return build_table(
        spark, kafka_bootstrap, redis_url, tmp_path_factory.mktemp("watch-filter"), MAP
    )


def sentinel(step: int) -> str:
    return f"step-{step:03d}"


def steps(count: int) -> list[list[tuple[str, Entity | None]]]:
    """Writes in steps: each a few distinct keys set to values in or out of the filter, or
    deleted, then the step's own key, which matches."""
    rng = random.Random(11)
    keys = [f"w{i:02d}" for i in range(10)]
    out = []
    for step in range(count):
        rows: list[tuple[str, Entity | None]] = []
        for key in rng.sample(keys, 4):
            if rng.random() < 0.2:
                rows.append((key, None))
            else:
                name = rng.choice(["Ann", "Bob", None])
                doc: Entity = {"id": key, "age": rng.choice([40, 50, 60])}
                if name is not None:
                    doc["name"] = name
                rows.append((key, doc))
        rows.append((sentinel(step), {"id": sentinel(step), "age": 99, "name": "Zoë"}))
        out.append(rows)
    return out


def reference(plan: list[list[tuple[str, Entity | None]]], include_left: bool) -> list[Sent]:
    """What a filtered stream sends, step by step, in plain Python."""
    inside: set[str] = set()
    sent: list[Sent] = []
    for rows in plan:
        for key, entity in rows:
            op = pb.Change.DELETE if entity is None else pb.Change.UPSERT
            if matches(entity):
                inside.add(key)
                sent.append((key, op, False))
            elif include_left and key in inside:
                inside.discard(key)
                sent.append((key, op, True))
    return sent


def fold_target(table: Table, kafka_bootstrap: str, topic: str) -> FoldTarget:
    return FoldTarget(
        redis=table.cfg.redis,
        map_name=MAP,
        changelog_topic=topic,
        producer=producer_settings(KafkaConfig(bootstrap_servers=kafka_bootstrap), 1_048_576),
    )


def write(target: FoldTarget, step: int, rows: list[tuple[str, Entity | None]]) -> None:
    apply(target, 1000 + step, [(k, f"9{step:06d}", e) for k, e in rows])


def test_a_filtered_watch_sends_exactly_the_changes_after_which_the_entity_matches(
    table: Table, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    target = fold_target(table, kafka_bootstrap, new_topic(1))
    plan = steps(12)

    async def body(stub: Any) -> dict[str, list[pb.Change]]:
        streams = {
            "plain": stub.Watch(pb.WatchRequest(map=MAP, where=WHERE), timeout=120),
            "left": stub.Watch(
                pb.WatchRequest(map=MAP, where=WHERE, include_left=True, include_entities=True),
                timeout=120,
            ),
        }
        for call in streams.values():
            await call.initial_metadata()  # positioned: every later change reaches it
        got: dict[str, list[pb.Change]] = {name: [] for name in streams}
        for step, rows in enumerate(plan):
            await asyncio.to_thread(write, target, step, rows)
            for name, call in streams.items():
                while not any(c.key == sentinel(step) for c in got[name]):
                    got[name] += (await call.read()).changes
        for call in streams.values():
            call.cancel()
        return got

    got = run(table.cfg, body)
    for name, include_left in (("plain", False), ("left", True)):
        assert [(c.key, c.op, c.left) for c in got[name]] == reference(plan, include_left), name
    # The entity each change was decided on, with include_entities.
    written = {(k, i): e for i, rows in enumerate(plan) for k, e in rows}
    step_of = {c.key: int(c.key.split("-")[1]) for c in got["left"] if c.key.startswith("step")}
    assert all(c.entity == b"" for c in got["plain"])
    assert all(
        orjson.loads(c.entity) == written[(c.key, step_of[c.key])]
        for c in got["left"]
        if c.key in step_of
    )
    assert all(c.op == pb.Change.UPSERT and c.entity for c in got["left"] if not c.left)


def test_the_http_change_stream_takes_the_filter(
    table: Table, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    target = fold_target(table, kafka_bootstrap, new_topic(1))
    rows: list[tuple[str, Entity | None]] = [
        ("h1", {"id": "h1", "age": 70, "name": "Ann"}),
        ("h2", {"id": "h2", "age": 10, "name": "Ann"}),
    ]
    later: list[tuple[str, Entity | None]] = [
        ("h1", {"id": "h1", "age": 70, "name": "Bob"}),
        (sentinel(900), {"id": sentinel(900), "age": 99, "name": "Zoë"}),
    ]

    async def body(f: Front) -> list[dict[str, Any]]:
        url = f"{f.base}/v1/maps/{MAP}/changes"
        out: list[dict[str, Any]] = []
        async with f.http.get(url, params={"include_left": "true", "where": WHERE}) as r:
            assert r.status == 200 and r.content_type == "text/event-stream"
            await asyncio.to_thread(write, target, 900, rows)
            await asyncio.to_thread(write, target, 901, later)
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("data: "):
                    out.append(orjson.loads(line[6:]))
                    if out[-1]["key"] == sentinel(900):
                        return out
        return out

    events = serve_http(table.cfg, body)
    assert [(e["key"], e["op"], e.get("left", False)) for e in events] == [
        ("h1", "upsert", False),
        ("h1", "upsert", True),
        (sentinel(900), "upsert", False),
    ]


def test_a_filter_the_entities_cannot_have_is_refused(table: Table) -> None:
    async def body(stub: Any) -> list[grpc.aio.AioRpcError]:
        errors = []
        for where in ("nope > 1", "_updated_at > 0", "age >", "age LIKE 'x%'"):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Watch(pb.WatchRequest(map=MAP, where=where), timeout=30).read()
            errors.append(info.value)
        return errors

    errors = run(table.cfg, body)
    # Each before the stream opens: the last, which the rows' types refuse, too.
    assert [e.code() for e in errors] == [grpc.StatusCode.INVALID_ARGUMENT] * 4
    assert "nope" in errors[0].details()
    assert "_updated_at" in errors[1].details()


def test_lookups_answer_from_the_table_while_redis_restores_the_map(
    table: Table, redis_client: redis.Redis
) -> None:
    keys = sorted(table.latest)
    [topic] = table.cfg.maps[MAP].source.topics

    def lose() -> None:
        # The run reports the map restoring; Redis lost its entities and markers.
        redis_client.hset(status_key(MAP), mapping=MapReport("restoring").to_hash())
        redis_client.delete(*[entity_key(MAP, k) for k in keys])
        redis_client.delete(*markers(redis_client, MAP).values())

    async def body(channel: grpc.aio.Channel) -> dict[str, Any]:
        maps = map_grpc.MapServiceStub(channel)
        admin = admin_grpc.AdminServiceStub(channel)
        before = await maps.BatchGet(pb.BatchGetRequest(map=MAP, keys=keys), timeout=30)
        await asyncio.to_thread(lose)
        one = await maps.Get(pb.GetRequest(map=MAP, key=keys[0]), timeout=30)
        many = await maps.BatchGet(pb.BatchGetRequest(map=MAP, keys=[*keys, "nobody"]), timeout=30)
        beyond = common.Freshness(
            min_offsets=[common.PartitionOffset(topic=topic, partition=0, offset=10**9)]
        )
        with pytest.raises(grpc.aio.AioRpcError) as waited:  # Redis has not reached them
            await maps.Get(pb.GetRequest(map=MAP, key=keys[1], freshness=beyond), timeout=2)
        # Redis says it reached them, the table does not reflect them: the restore's answer.
        ahead = Watermark(batch_id=10**6, offsets={topic: {0: 10**9, 1: 10**9}})
        await asyncio.to_thread(redis_client.hset, meta_key(MAP), mapping=ahead.to_hash())
        with pytest.raises(grpc.aio.AioRpcError) as unreached:
            await maps.Get(pb.GetRequest(map=MAP, key=keys[1], freshness=beyond), timeout=30)
        status = await admin.GetStatus(admin_pb.GetStatusRequest(map=MAP), timeout=30)
        return {
            "before": before,
            "one": one,
            "many": many,
            "waited": waited.value,
            "unreached": unreached.value,
            "status": status,
        }

    got = run_channel(table.cfg, body)
    held = {e.key: e.entity for e in got["before"].entries}
    assert {k: orjson.loads(v) for k, v in held.items()} == table.latest  # Redis, before
    one, many = got["one"], got["many"]
    assert (one.from_table, one.table_version, one.found) == (True, table.latest_version, True)
    assert one.entity == held[keys[0]]  # the table's row, encoded as Redis holds it
    assert (many.from_table, many.table_version) == (True, table.latest_version)
    assert {e.key: e.entity for e in many.entries if e.found} == held
    assert [e.key for e in many.entries if not e.found] == ["nobody"]
    recorded = table_watermark(DeltaTable(table.path))
    assert recorded is not None
    assert {(o.topic, o.partition): o.offset for o in one.watermark.offsets} == {
        (t, p): o for t, parts in recorded.offsets.items() for p, o in parts.items()
    }
    assert many.watermark == one.watermark
    assert got["waited"].code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert got["unreached"].code() == grpc.StatusCode.UNAVAILABLE
    assert "Redis lost its copy" in (got["unreached"].details() or "")
    [status] = got["status"].maps
    assert status.state == admin_pb.MapStatus.RESTORING and status.serves_from_table
