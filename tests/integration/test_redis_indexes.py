"""A map's indexes as the fold's Redis Functions keep them (``index.lua``), against a real
redis-server and a real Redis Cluster: every entry equal to what the entities Redis holds
make of them in plain Python (``contract.index_entries``), through writes, deletes,
expiries, an index built while the fold writes, one dropped, and a restore's fill."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from materializer.clients.redis import Client, client_for, masters, on
from materializer.config import IndexConfig, KafkaConfig, RedisConfig, parse_config
from materializer.contract import index_entries
from materializer.contract.markers import mark_whole, tags
from materializer.contract.redis_layout import (
    entity_key,
    index_keys_pattern,
    indexed_key,
)
from materializer.redis.deliveries import new_producer, producer_settings
from materializer.redis.expiry import sweep_expired
from materializer.redis.functions import FoldTarget, load_library
from materializer.redis.indexes import build, declare, declared_states
from materializer.redis.map_keys import entity_keys
from materializer.redis.writer import fill
from materializer.testing.redis import RedisCluster
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.indexes.plan import IndexScan
from query_service.indexes.reads import IndexReads, IndexUnread
from query_service.stores.redis import RedisMapStore
from tests.helpers.indexes import expected_members, index_members
from tests.helpers.query_redis import run
from tests.helpers.redis_fold import apply

CITIES = ["Oslo", "Zürich", "", "a\x00b", "a", "a\x00", "Ōsaka"]
TOTALS: list[Any] = [0, -0.0, 1, -1, 2.5, -2.5, 2**53 + 1, 2**63 - 1, -1e300, 1e-300, 7]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(masters=3) as c:
        yield c


@pytest.fixture(params=["one server", "cluster"])
def target(request, redis_url: str, kafka_bootstrap: str, new_topic) -> FoldTarget:
    url = redis_url if request.param == "one server" else request.getfixturevalue("cluster").url
    config = RedisConfig(url=url, cluster=request.param == "cluster")
    load_library(config)
    name = f"ix{random.randrange(10**9)}"
    mark_whole(client_for(config), name)
    return FoldTarget(
        redis=config,
        map_name=name,
        changelog_topic=new_topic(2),
        producer=producer_settings(KafkaConfig(bootstrap_servers=kafka_bootstrap), 1_048_576),
    )


def held(client: Client, name: str) -> dict[str, dict[str, Any]]:
    """The entities Redis holds, by key."""
    prefix = len(entity_key(name, ""))
    out = {}
    for keys in entity_keys(client, name):
        for key in keys:
            raw = client.get(key)
            if raw is not None:
                out[key.decode()[prefix:]] = orjson.loads(raw)
    return out


def random_entity(rng: random.Random) -> dict[str, Any] | None:
    if rng.random() < 0.15:
        return None
    entity: dict[str, Any] = {"n": rng.randrange(100)}
    pick = rng.random()
    if pick < 0.7:
        entity["city"] = rng.choice(CITIES)
    elif pick < 0.8:
        entity["city"] = rng.choice([None, True, False, {"x": 1}, [1]])
    if rng.random() < 0.8:
        entity["total"] = rng.choice(TOTALS)
    if rng.random() < 0.5:
        entity["tier"] = rng.choice(["gold", "silver", 3, False])
    return entity


def test_python_reads_the_entries_lua_writes(target: FoldTarget) -> None:
    client = client_for(target.redis)
    declare(client, target.map_name, [IndexConfig(field="city"), IndexConfig(field="total")])
    pairs = zip(CITIES * 2, TOTALS, strict=False)
    rows = [(f"k{i}", "1", {"city": c, "total": t}) for i, (c, t) in enumerate(pairs)]
    rows.append(("{tag}k", "1", {"city": "Oslo", "total": 7}))
    apply(target, 0, rows)
    entities = held(client, target.map_name)
    for field in ("city", "total"):
        members = index_members(client, target.map_name, field)
        assert members == expected_members(entities, field)
        assert {index_entries.key_of(m) for m in members} == set(entities)
    # Byte order is value order: numbers, then strings, each ascending, keys breaking ties.
    totals = sorted(index_members(client, target.map_name, "total"))
    values = [entities[index_entries.key_of(m)]["total"] for m in totals]
    assert values == sorted(values, key=float)
    cities = sorted(index_members(client, target.map_name, "city"))
    assert [entities[index_entries.key_of(m)]["city"].encode() for m in cities] == sorted(
        e["city"].encode() for e in entities.values()
    )
    # One value's entries are the span from its prefix to the prefix and 0xFF.
    prefix = index_entries.value_prefix("a")
    span = {m for m in cities if prefix <= m < prefix + index_entries.END}
    assert {index_entries.key_of(m) for m in span} == {
        k for k, e in entities.items() if e["city"] == "a"
    }


def test_indexes_equal_the_entities_through_writes_deletes_builds_and_drops(
    target: FoldTarget,
) -> None:
    rng = random.Random(7)
    client = client_for(target.redis)
    name = target.map_name
    for field in declare(
        client, name, [IndexConfig(field="city"), IndexConfig(field="total", kind="sorted")]
    ):
        build(client, name, field, expiring=False)  # nothing to read yet: ready at once
    batch = 0

    def write_some(rounds: int) -> None:
        nonlocal batch
        for _ in range(rounds):
            rows = [
                (f"k{rng.randrange(300)}", f"{batch:06d}", random_entity(rng)) for _ in range(60)
            ]
            apply(target, batch, rows)
            batch += 1

    write_some(20)
    # An index declared while the fold writes: built beside it, equal once built.
    fields = declare(
        client,
        name,
        [
            IndexConfig(field="city"),
            IndexConfig(field="total", kind="sorted"),
            IndexConfig(field="tier"),
        ],
    )
    assert fields == ["tier"]
    writer = threading.Thread(target=write_some, args=(20,))
    writer.start()
    added = build(client, name, "tier", expiring=False)
    writer.join()
    assert added > 0
    states = declared_states(client, name)
    assert all(s["tier"].ready for s in states.values())
    write_some(10)
    entities = held(client, name)
    for field in ("city", "total", "tier"):
        assert index_members(client, name, field) == expected_members(entities, field), field
    # Dropped: its entries go, and writes no longer keep them.
    declare(client, name, [IndexConfig(field="total", kind="sorted")])
    write_some(5)
    assert index_members(client, name, "city") == set()
    assert index_members(client, name, "tier") == set()
    assert index_members(client, name, "total") == expected_members(held(client, name), "total")
    # Declared again: unbuilt until built, then whole.
    assert declare(
        client, name, [IndexConfig(field="total", kind="sorted"), IndexConfig(field="city")]
    ) == ["city"]
    build(client, name, "city", expiring=False)
    assert index_members(client, name, "city") == expected_members(held(client, name), "city")
    # None left: nothing of the indexes stays.
    declare(client, name, [])
    assert list(client.scan_iter(match=index_keys_pattern(name))) == []


def test_expired_entities_leave_the_indexes(target: FoldTarget) -> None:
    rng = random.Random(11)
    client = client_for(target.redis)
    name = target.map_name
    for field in declare(
        client,
        name,
        [IndexConfig(field="city"), IndexConfig(field="total", kind="sorted")],
        expiring=True,
    ):
        build(client, name, field, expiring=True)
    short = replace(target, ttl_ms=400)
    long = replace(target, ttl_ms=600_000)
    apply(short, 0, [(f"s{i}", "1", random_entity(rng) or {"city": "Oslo"}) for i in range(50)])
    apply(long, 1, [(f"l{i}", "1", random_entity(rng) or {"city": "Oslo"}) for i in range(50)])
    # A key that expired in Redis and is written again before the sweep: moved, not doubled.
    time.sleep(0.6)
    apply(long, 2, [("s0", "2", {"city": "Bergen", "total": 3})])
    producer = new_producer(short)
    assert sweep_expired(short, producer) == 49
    entities = held(client, name)
    assert set(entities) == {f"l{i}" for i in range(50)} | {"s0"}
    for field in ("city", "total"):
        assert index_members(client, name, field) == expected_members(entities, field)
    # What each expiring entity is indexed under is kept for those only.
    recorded = set()
    for node_name, node in masters(client).items():
        tag = tags(client, name)[node_name]
        recorded |= {
            k.decode() for k in client.execute_command("HKEYS", indexed_key(name, tag), **on(node))
        }
    assert recorded == {
        k
        for k, e in entities.items()
        if expected_members({k: e}, "city") | expected_members({k: e}, "total")
    }
    # A field dropped from an expiring map and declared again starts its indexes again,
    # record and all: the record of an entity Redis expired since names entries no build
    # finds, and its next write, the same as before, would trust them.
    apply(short, 3, [("gone", "1", {"city": "Oslo", "total": 1})])
    time.sleep(0.6)
    both = [IndexConfig(field="city"), IndexConfig(field="total")]
    declare(client, name, [IndexConfig(field="city")], expiring=True)
    for field in declare(client, name, both, expiring=True):
        build(client, name, field, expiring=True)
    apply(long, 4, [("gone", "2", {"city": "Oslo", "total": 1})])  # expired, written again
    assert sweep_expired(short, producer) == 0
    entities = held(client, name)
    assert entities["gone"] == {"city": "Oslo", "total": 1}
    for field in ("city", "total"):
        assert index_members(client, name, field) == expected_members(entities, field)


def test_a_restore_fills_entities_with_their_entries(target: FoldTarget) -> None:
    client = client_for(target.redis)
    name = target.map_name
    declare(client, name, [IndexConfig(field="city")])
    apply(target, 0, [("a", "1", {"city": "Oslo"}), ("b", "1", {"city": "Rome"})])
    lost = {"c": {"city": "Oslo"}, "d": {"city": "Lima"}, "a": {"city": "Nowhere"}}
    written = fill(target.redis, name, [(k, (orjson.dumps(v), None)) for k, v in lost.items()])
    assert written == 2  # "a" kept what the fold made of it
    entities = held(client, name)
    assert entities["a"] == {"city": "Oslo"}
    assert index_members(client, name, "city") == expected_members(entities, "city")


def typed(key: str, entity: dict[str, Any]) -> dict[str, Any]:
    """An entity whose fields hold their table column's type (or null)."""
    city, total = entity.get("city"), entity.get("total")
    return {
        "id": key,
        "city": city if isinstance(city, str) else None,
        "total": total if isinstance(total, int | float) and abs(total) < 1e300 else None,
        "n": entity.get("n"),
    }


def test_a_query_through_an_index_reads_every_master(target: FoldTarget, tmp_path: Path) -> None:
    """The query service's reads of an index on one server and over a cluster's masters,
    merged in entry order, against the entities Redis holds."""
    rng = random.Random(13)
    client = client_for(target.redis)
    name = target.map_name
    indexes = [IndexConfig(field="city"), IndexConfig(field="total", kind="sorted")]
    for field in declare(client, name, indexes):
        build(client, name, field, expiring=False)
    rows = [(f"k{i}", "1", typed(f"k{i}", random_entity(rng) or {})) for i in range(400)]
    apply(target, 0, rows)
    # The table only types the rows: one row of the entities' schema.
    row = {"_key": ["k0"], "id": ["k0"], "city": ["x"], "total": [1.0], "n": [1]}
    write_deltalake(str(tmp_path / name), pa.table(row))
    cfg = parse_config(
        {
            "redis": {"url": target.redis.url, "cluster": target.redis.cluster},
            "delta": {"root": str(tmp_path)},
            "maps": {
                name: {
                    "source": {
                        "topics": ["t"],
                        "schema": "id STRING, city STRING, total DOUBLE, n BIGINT",
                    },
                    "key": "id",
                    "indexes": [i.model_dump() for i in indexes],
                }
            },
        }
    )
    entities = held(client, name)

    async def body(channel: Any) -> dict[str, list[pb.QueryResponse]]:
        stub = pb_grpc.MapServiceStub(channel)
        out = {}
        for where in ("city = 'Oslo'", "total >= 1 AND total < 3", "city IN ('a', 'Zürich')"):
            request = pb.QueryRequest(map=name, where=where, page_size=7)
            out[where] = [p async for p in stub.Query(request, timeout=60)]
        return out

    answers = run(cfg, body)
    keep = {
        "city = 'Oslo'": ("city", lambda e: e.get("city") == "Oslo"),
        "total >= 1 AND total < 3": (
            "total",
            lambda e: e.get("total") is not None and 1 <= e["total"] < 3,
        ),
        "city IN ('a', 'Zürich')": ("city", lambda e: e.get("city") in ("a", "Zürich")),
    }
    for where, pages in answers.items():
        field, test = keep[where]
        wanted = sorted(
            ((k, e) for k, e in entities.items() if test(e)),
            key=lambda kv: index_entries.entry(kv[1][field], kv[0]),
        )
        assert wanted, where
        assert {(p.source, p.index) for p in pages} == {(pb.QueryResponse.REDIS_INDEX, field)}
        assert [r.key for p in pages for r in p.rows] == [k for k, _ in wanted], where


def test_an_index_dropped_after_the_reader_found_it_built_is_not_read(target: FoldTarget) -> None:
    client = client_for(target.redis)
    name = target.map_name
    for field in declare(client, name, [IndexConfig(field="city")]):
        build(client, name, field, expiring=False)
    apply(target, 0, [(f"k{i}", "1", {"city": "Oslo"}) for i in range(20)])
    oslo = IndexScan("city", ((index_entries.value_prefix("Oslo"), b"t"),))

    async def body() -> None:
        store = RedisMapStore.from_config(target.redis)
        reads = IndexReads(store.client, store.where)
        try:
            assert await reads.ready(name) == {"city": "hash"}
            assert len(await reads.entries(name, oslo, None, 100)) == 20
            declare(client, name, [])  # dropped: the reader's state of it is an old one
            with pytest.raises(IndexUnread):
                await reads.entries(name, oslo, None, 100)
            assert await reads.ready(name) == {}
        finally:
            await store.close()

    asyncio.run(body())
