"""Fencing a worker that lost a map, store by store, on one Redis server and on a cluster:
once another worker took the map over, the former owner's writes are refused by the
Redis Functions, its changelog producer by Kafka, and its Delta query by the owner
check; the new owner's go through. No Spark: the fold's own apply path, as a batch
runs it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from materializer.clients.redis import client_for
from materializer.config import AppConfig, parse_config
from materializer.contract.markers import mark_whole
from materializer.contract.redis_layout import entity_key
from materializer.group.fencing import take_over
from materializer.redis.apply import apply_batches
from materializer.redis.deliveries import Deliveries, new_producer, producer_settings
from materializer.redis.expiry import sweep_expired
from materializer.redis.functions import Fenced, FoldTarget, load_library
from materializer.testing import create_topic
from materializer.testing.redis import RedisCluster
from tests.helpers.redis_fold import records
from tests.helpers.slices import slice_config
from tests.integration.test_worker_group import changelog


@contextmanager
def redis_of(cluster: bool, redis_url: str) -> Iterator[str]:
    if not cluster:
        yield redis_url
        return
    with RedisCluster(3) as servers:
        yield servers.url


def group_map(tmp: Path, kafka: str, url: str, topic: str, cluster: bool) -> AppConfig:
    doc = slice_config(tmp, kafka, url, topic, map_name=f"fenced{uuid.uuid4().hex[:6]}")
    doc["redis"]["cluster"] = cluster
    doc["worker"] = {"group": f"g{uuid.uuid4().hex[:6]}"}
    return parse_config(doc)


@pytest.mark.parametrize("cluster", [False, True], ids=["server", "cluster"])
def test_a_former_owner_is_refused_by_redis_kafka_and_the_delta_check(
    kafka_bootstrap, redis_url, new_topic, tmp_path: Path, cluster: bool
):
    with redis_of(cluster, redis_url) as url:
        cfg = group_map(tmp_path, kafka_bootstrap, url, new_topic(2), cluster)
        name = next(iter(cfg.maps))
        client = client_for(cfg.redis)
        load_library(cfg.redis)
        mark_whole(client, name)
        changes = cfg.maps[name].changelog.topic
        assert changes is not None
        create_topic(kafka_bootstrap, 2, changes)
        # Keys on every master of a cluster.
        keys = [f"k{i}" for i in range(12)]

        old = take_over(cfg, name)
        before = FoldTarget(
            redis=cfg.redis,
            map_name=name,
            changelog_topic=changes,
            producer=producer_settings(cfg.kafka, 1 << 20),
            epoch=old.epoch,
            transactional_id=old.transactional_id,
        )
        old_producer = new_producer(before)
        rows = [(k, "0001", {"id": k, "v": 1}) for k in keys]
        apply_batches(before, 0, "app", records(rows), old_producer)
        # A batch in flight when its worker stopped: its records sent, not yet committed.
        in_flight = Deliveries(old_producer, before)
        in_flight.send(changes, b"k0", orjson.dumps({"id": "k0", "v": 98}), [])

        new = take_over(cfg, name)
        with pytest.raises(Fenced):
            in_flight.flush()
        # Nor can it make another producer: the map is another worker's (driver or task).
        for task in (None, 1):
            with pytest.raises(Fenced):
                new_producer(before, task)
        assert new.epoch > old.epoch
        later = [(k, "0002", {"id": k, "v": 2}) for k in keys]
        with pytest.raises(Fenced):
            apply_batches(before, 1, "app", records(later), old_producer)
        values = [orjson.loads(client.get(entity_key(name, k))) for k in keys]
        assert [v["v"] for v in values] == [1] * len(keys)
        # Nothing of it reached a read_committed reader.
        assert changelog(kafka_bootstrap, changes) == {k: {"id": k, "v": 1} for k in keys}
        # And its Delta query stops before its MERGE.
        with pytest.raises(Fenced):
            old.check()
        new.check()

        after = replace(before, epoch=new.epoch, transactional_id=new.transactional_id)
        newest = [(k, "0003", {"id": k, "v": 3}) for k in keys]
        producer = new_producer(after)
        # Expiry sweeps that find nothing leave no transaction open on the driver's producer,
        # which the next batch then uses.
        for _ in range(2):
            assert sweep_expired(replace(after, ttl_ms=60_000), producer) == 0
        apply_batches(after, 2, "app", records(newest), producer)
        assert changelog(kafka_bootstrap, changes) == {k: {"id": k, "v": 3} for k in keys}
        values = [orjson.loads(client.get(entity_key(name, k))) for k in keys]
        assert [v["v"] for v in values] == [3] * len(keys)
