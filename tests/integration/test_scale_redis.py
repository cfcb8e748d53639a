"""A Redis Cluster as the map store: the same pipeline, lookups and joins as on one server.

Three masters share the 16384 hash slots; each ``<map>:<key>`` lands in its own
slot, so one map's entities, watermark and change stream sit on different
masters. The same map is materialized into a single redis-server and into the
cluster, and every answer is compared across the two and with a reference
fold.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import redis
from redis.cluster import RedisCluster as ClusterClient

from materializer.clients.redis import client_for, per_master
from materializer.config import AppConfig, KafkaConfig, RedisConfig
from materializer.contract.changelog import EXPIRED_HEADER
from materializer.contract.markers import mark_whole, markers
from materializer.contract.redis_layout import (
    EXPIRE_OP,
    changes_key,
    entity_key,
    expiry_index_key,
    status_key,
)
from materializer.contract.status import MapReport
from materializer.enrichment.job import start_enrichment
from materializer.job import start_map
from materializer.ops.verify import Comparison, Differences, verify
from materializer.redis.apply import apply_batches
from materializer.redis.deliveries import new_producer, producer_settings
from materializer.redis.expiry import sweep_expired
from materializer.redis.functions import FoldTarget, load_library
from materializer.restore.rehydrate import rehydrate
from materializer.testing import RedisCluster, produce
from materializer.testing.reference import fold_latest
from materializer.testing.waiting import wait_until
from materializer.v1 import enrich_service_pb2 as enrich_pb
from materializer.v1 import enrich_service_pb2_grpc as enrich_grpc
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.errors import StoreUnavailable
from query_service.server import create_server
from query_service.stores.redis import RedisMapStore
from tests.helpers.redis_fold import records
from tests.helpers.slices import (
    FIELDS,
    config,
    delta_map_rs,
    end_offsets,
    read_topic,
    redis_map,
    slice_config,
    user_events,
    watermark,
)


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisCluster]:
    with RedisCluster(masters=3) as cluster:
        yield cluster


def _orders(n: int, users: int, rng: random.Random) -> list[tuple[bytes, bytes]]:
    """Orders keyed by id, each naming a user (some unknown, to exercise misses)."""
    return [
        (f"o{i}".encode(), orjson.dumps({"id": f"o{i}", "user": f"u{rng.randrange(users + 5)}"}))
        for i in range(n)
    ]


async def _answers(cfg: AppConfig, name: str, keys: list[str], orders: list[bytes]) -> Any:
    """Every Get, one BatchGet and one Enrich stream, through a real channel."""
    store = RedisMapStore.from_config(cfg.redis)
    server, port = await create_server(cfg, store=store)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            maps = pb_grpc.MapServiceStub(channel)  # type: ignore[no-untyped-call]
            gets = [
                (r.found, r.entity)
                for r in [await maps.Get(pb.GetRequest(map=name, key=k), timeout=30) for k in keys]
            ]
            batch = await maps.BatchGet(pb.BatchGetRequest(map=name, keys=keys), timeout=30)
            spec = enrich_pb.JoinSpec(lookups=[enrich_pb.Lookup(map=name, key_field="user")])
            request = enrich_pb.EnrichRequest(spec=spec, events=orders, request_id="r")
            enrich = enrich_grpc.EnrichServiceStub(channel)  # type: ignore[no-untyped-call]
            enriched = [r async for r in enrich.Enrich(iter([request]), timeout=60)]
    finally:
        await server.stop(None)
        await store.close()
    return (
        gets,
        [(e.found, e.entity) for e in batch.entries],
        batch.watermark.batch_id,
        [(e.index, e.event, e.dropped, e.error, list(e.missed)) for e in enriched[0].events],
    )


def _materialize(spark: Any, cfgs: Iterable[AppConfig], name: str) -> None:
    """Fold everything produced so far into each config's stores."""
    for cfg in cfgs:
        queries = start_map(spark, cfg, name)
        try:
            queries.process_all_available()
        finally:
            queries.stop()


@pytest.mark.timeout(900)
def test_a_cluster_holds_the_map_a_single_redis_holds_and_serves_it_alike(
    spark, kafka_bootstrap, redis_url, redis_client, redis_cluster, new_topic, tmp_path: Path
):
    topic, orders_topic = new_topic(3), new_topic(2)
    name = f"spread_{uuid.uuid4().hex[:6]}"
    docs = {
        "single": slice_config(tmp_path / "single", kafka_bootstrap, redis_url, topic, name),
        "cluster": slice_config(
            tmp_path / "cluster", kafka_bootstrap, redis_cluster.url, topic, name
        ),
    }
    docs["cluster"]["redis"]["cluster"] = True
    output = f"{orders_topic}.enriched"
    docs["cluster"]["enrichments"] = {
        f"{name}_orders": {
            "source": {"topics": [orders_topic]},
            "lookups": [{"map": name, "key_field": "user"}],
            "output": {"topic": output},
        }
    }
    cfgs = {where: config(doc) for where, doc in docs.items()}

    records = user_events(500, 80, seed=11)
    positions = produce(kafka_bootstrap, topic, records)
    _materialize(spark, cfgs.values(), name)
    # A second wave that deletes keys the first wrote: DELs routed to their slots.
    more = user_events(200, 80, seed=12) + [(f"u{i}".encode(), None) for i in range(10)]
    positions += produce(kafka_bootstrap, topic, more)
    records += more
    _materialize(spark, cfgs.values(), name)

    events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
    reference = fold_latest(events, "id", FIELDS)
    assert not {f"u{i}" for i in range(10)} & reference.keys()
    cluster_client = ClusterClient.from_url(redis_cluster.url)
    try:
        assert redis_map(redis_client, name) == reference
        assert redis_map(cluster_client, name) == reference  # type: ignore[arg-type]
        for where in cfgs:
            assert delta_map_rs(tmp_path / where / "warehouse" / name) == reference
        # The map is spread over every master, not kept on one.
        for node in redis_cluster.nodes:
            with redis.Redis.from_url(node.url) as node_client:
                on_node = list(node_client.scan_iter(match=f"{name}:*", count=1000))
            assert len(on_node) > len(reference) // 6, node.url
        marks = [watermark(redis_client, name), watermark(cluster_client, name)]  # type: ignore[arg-type]
        assert all(m is not None and m.offsets == {topic: end_offsets(positions)} for m in marks)
        # The change streams end in the same state per key.
        streams = [
            {
                f[b"key"]: f[b"op"]
                for _, f in client.xrange(changes_key(name))  # type: ignore[attr-defined]
            }
            for client in (redis_client, cluster_client)
        ]
        assert streams[0] == streams[1]
        assert {k.decode() for k, op in streams[1].items() if op == b"upsert"} == set(reference)

        # Lookups and joins answer the same from both, and the entities are the reference's.
        rng = random.Random(5)
        orders = _orders(60, 80, rng)
        keys = [*sorted(reference), "u0", "u3", "nobody"]
        single, spread = (
            asyncio.run(_answers(cfgs[w], name, keys, [v for _, v in orders])) for w in cfgs
        )
        gets, batch, batch_id, enriched = spread
        assert (gets, batch, enriched) == (single[0], single[1], single[3])
        assert [(found, orjson.loads(e) if found else None) for found, e in gets] == [
            (k in reference, reference.get(k)) for k in keys
        ]
        assert batch_id == marks[1].batch_id  # type: ignore[union-attr]

        # Rehydrate reloads a cluster that lost entities (and drops a stray key) from the
        # Delta table and the changelog, writing each key to its master; verify agrees.
        lost = list(cluster_client.scan_iter(match=f"{name}:u1*"))
        assert lost
        cluster_client.delete(*lost)
        cluster_client.set(f"{name}:stray", b"{}")
        rehydrate(cfgs["cluster"], name, cluster_client)
        assert redis_map(cluster_client, name) == reference  # type: ignore[arg-type]
        none = Differences()
        assert verify(cfgs["cluster"], name, cluster_client).stores == Comparison(none, none, none)

        # The streaming enrichment reads the cluster on the executors: its output is the
        # gRPC Enrich's answer for the same events.
        produce(kafka_bootstrap, orders_topic, orders)
        query = start_enrichment(spark, cfgs["cluster"], f"{name}_orders")
        try:
            query.process_all_available()
        finally:
            query.stop()
        streamed = {m.key(): m.value() for m in read_topic(kafka_bootstrap, output)}
        assert streamed == {
            key: event for (key, _), (_, event, *_rest) in zip(orders, enriched, strict=True)
        }
    finally:
        cluster_client.close()


def test_expiries_on_a_cluster_reach_the_change_stream_and_the_changelog(
    redis_cluster, kafka_bootstrap, new_topic
):
    redis = RedisConfig(url=redis_cluster.url, cluster=True)
    client = client_for(redis)
    name = f"exp{uuid.uuid4().hex[:6]}"
    target = FoldTarget(
        redis=redis,
        map_name=name,
        changelog_topic=new_topic(2),
        producer=producer_settings(KafkaConfig(bootstrap_servers=kafka_bootstrap), 1_048_576),
        ttl_ms=500,
    )
    load_library(redis)
    mark_whole(client, name)
    keys = [f"k{i}" for i in range(30)]
    rows = [(k, "1", {"id": k}) for k in keys]
    apply_batches(target, 0, "app", records(rows), new_producer(target))
    # The keys spread over the masters, each scored in its own master's index.
    indexes = per_master(client, name, expiry_index_key)
    assert len(indexes) == 3
    assert sum(client.zcard(index) for index in indexes.values()) == len(keys)
    assert all(client.zcard(index) for index in indexes.values())

    wait_until(
        "the keys to expire", lambda: not any(client.exists(entity_key(name, k)) for k in keys)
    )
    assert sweep_expired(target, new_producer(target)) == len(keys)

    entries = client.xrange(changes_key(name))
    assert sorted(
        f[b"key"].decode() for _, f in entries if f[b"op"] == EXPIRE_OP.encode()
    ) == sorted(keys)
    tombstones = [
        m.key().decode()
        for m in read_topic(kafka_bootstrap, target.changelog_topic)
        if m.value() is None and (EXPIRED_HEADER, b"1") in (m.headers() or [])
    ]
    assert sorted(tombstones) == sorted(keys)


@pytest.mark.parametrize("function", [True, False], ids=["read-function", "pipeline"])
def test_a_cluster_batch_read_is_one_call_per_master_and_follows_a_moved_slot(
    redis_cluster, function: bool
):
    """With the materializer's functions loaded, one read call per master; without, a pipeline
    of GETs; either way a slot the client's map has wrong is read where it moved."""
    from redis.asyncio.cluster import RedisCluster as AsyncCluster

    from query_service.stores.cluster_reads import MasterReads

    config = RedisConfig(url=redis_cluster.url, cluster=True)
    client = client_for(config)
    for node in client.get_primaries():
        client.execute_command("FUNCTION", "FLUSH", target_nodes=node)
    if function:
        load_library(config)
    keys = [f"mr:{i}" for i in range(300)]
    sync = ClusterClient.from_url(redis_cluster.url)
    for i, key in enumerate(keys[:250]):  # the last 50 are absent
        sync.set(key, f"v{i}")
    sync.close()

    async def main() -> tuple[list[Any], list[Any]]:
        cluster = AsyncCluster.from_url(redis_cluster.url)
        reads = MasterReads(cluster, timeout=5.0)
        try:
            await cluster.initialize()
            first = await reads.get(keys)
            # A stale slot map (a reshard the client has not seen): the key's slot points
            # at another master, which answers MOVED; the read follows it.
            slot = cluster.keyslot(keys[7])
            owner = cluster.nodes_manager.slots_cache[slot][0]
            other = next(n for n in cluster.get_primaries() if n.name != owner.name)
            cluster.nodes_manager.slots_cache[slot] = [other]
            second = await reads.get(keys)
            assert reads._function is function  # noqa: SLF001 - which path read them
            return first, second
        finally:
            await reads.close()
            await cluster.aclose()

    first, second = asyncio.run(main())
    expected = [f"v{i}".encode() for i in range(250)] + [None] * 50
    assert first == expected
    assert second == expected


class _RestoredWhileChecking(RedisMapStore):
    """A store whose next marker read finds the copy restored a moment before it: the
    materializer's restore ending between a lookup's read and its marker check."""

    restore: Any = None

    async def _read_markers(self, map_name: str, physical: str) -> tuple[bool, bool]:
        if self.restore is not None:
            self.restore()
            self.restore = None
        return await super()._read_markers(map_name, physical)


@pytest.mark.parametrize("where", ["server", "cluster"])
def test_a_key_restored_between_a_lookups_read_and_its_marker_check_is_found(
    where: str, redis_url: str, redis_cluster: RedisCluster
):
    cfg = RedisConfig(url=redis_url if where == "server" else redis_cluster.url)
    cfg = cfg.model_copy(update={"cluster": where == "cluster"})
    name = f"restored_{uuid.uuid4().hex[:8]}"
    client = client_for(cfg)
    entity = b'{"id":"k"}'

    def restore() -> None:  # as the materializer's restore: the entities, then the markers
        client.set(entity_key(name, "k"), entity)
        mark_whole(client, name)

    restore()
    client.hset(status_key(name), mapping=MapReport(state="running").to_hash())

    async def body() -> tuple[Any, ...]:
        store = _RestoredWhileChecking.from_config(cfg)
        try:
            seen = await store.get_with_watermark(name, "k")  # the copy seen whole here
            client.delete(entity_key(name, "k"), *markers(client, name).values())  # lost
            with pytest.raises(StoreUnavailable) as lost:
                await store.get_with_watermark(name, "k")
            store.restore = restore
            again = await store.get_with_watermark(name, "k")
            absent = await store.get_with_watermark(name, "absent")
            return seen.entity, lost.value, again.entity, absent.entity
        finally:
            await store.close()

    seen, lost, again, absent = asyncio.run(body())
    assert seen == entity
    assert "Redis lost its copy" in str(lost)
    assert again == entity  # read again once whole, not answered NOT_FOUND
    assert absent is None
