"""A map keeps folding when one broker of a three-node KRaft cluster dies mid-stream.

Every topic has three replicas and writes need two in sync, so losing one
node loses nothing: the map's clients must find the partitions' new leaders
(and the new controller) and carry on, ending where a plain-Python fold of
every produced event ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from materializer.config.names import changelog_topic
from materializer.contract.table_layout import table_path
from materializer.job import start_map
from materializer.testing import produce
from materializer.testing.kafka import KafkaCluster, create_topic
from materializer.testing.reference import fold_latest
from tests.helpers.slices import (
    FIELDS,
    config,
    delta_map_rs,
    end_offsets,
    redis_map,
    slice_config,
    user_events,
)
from tests.helpers.slices import watermark as read_watermark

MAP = "brokerloss"
NODES = 3


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    """Three combined broker and controller nodes, stopped whatever the tests did to them."""
    kafka = KafkaCluster(size=NODES)
    kafka.start(timeout=180)  # three JVMs starting at once on a small machine
    try:
        yield kafka
    finally:
        kafka.stop()


def replicas(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int]]]:
    """(leader, replicas) of each partition of ``topic``, as the brokers see them now."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    found = admin.list_topics(topic, timeout=30).topics[topic]
    assert found.error is None, found.error
    return {p.id: (p.leader, list(p.replicas)) for p in found.partitions.values()}


def victim(cluster: KafkaCluster, topic: str) -> int:
    """The node whose death hurts most while leaving a quorum: the leader of the most
    partitions of ``topic``, and among equals the active controller.

    Its partitions stop until the controller moves their leadership, so the
    source readers, the changelog writer and the Delta reader all lose a
    leader at once. Being the controller too, its death first makes the two
    survivors elect a new controller (two of three voters are still a
    majority) before anyone can fence it and move those partitions: both
    failovers, one after the other, rather than only one.
    """
    led: dict[int, int] = {}
    for leader, _ in replicas(cluster.bootstrap_servers, topic).values():
        led[leader] = led.get(leader, 0) + 1
    controller = cluster.active_controller()
    return max(led, key=lambda node: (led[node], node == controller))


@pytest.mark.timeout(600)  # after the kill, catching up waits for elections and retries
def test_map_keeps_folding_when_a_broker_is_killed(
    spark: SparkSession,
    cluster: KafkaCluster,
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    bootstrap = cluster.bootstrap_servers
    topic = create_topic(bootstrap, partitions=3, replication_factor=NODES)
    cfg = config(slice_config(tmp_path, bootstrap, redis_url, topic, map_name=MAP))
    changelog = changelog_topic(cfg, MAP)
    records = user_events(300, 40, seed=21)
    positions = produce(bootstrap, topic, records)

    queries = start_map(spark, cfg, MAP)
    try:
        queries.process_all_available()
        dead = victim(cluster, topic)
        # Every partition the map reads and writes has a copy on the node about to die.
        for name in (topic, changelog):
            assert all(dead in held for _, held in replicas(bootstrap, name).values()), name
        assert any(leader == dead for leader, _ in replicas(bootstrap, topic).values())

        cluster.kill(dead)
        # A second wave while the map runs, with deletes of keys that exist; acks=all with
        # the two survivors in sync.
        more = user_events(300, 40, seed=22) + [(b"u1", None), (b"u2", None)]
        positions += produce(
            cluster.alive_bootstrap_servers(), topic, more, settings={"acks": "all"}
        )
        records += more
        queries.process_all_available()
    finally:
        queries.stop()

    survivors = cluster.alive_bootstrap_servers()
    assert dead not in [leader for leader, _ in replicas(survivors, topic).values()]

    events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
    reference = fold_latest(events, "id", FIELDS)
    assert "u1" not in reference and "u2" not in reference
    assert redis_map(redis_client, MAP) == reference
    assert delta_map_rs(Path(table_path(cfg, MAP))) == reference

    mark = read_watermark(redis_client, MAP)
    assert mark is not None
    assert mark.offsets == {topic: end_offsets(positions)}

    # The pipeline made its changelog with the brokers' default replication: a copy per node.
    layout = replicas(survivors, changelog)
    assert layout and all(len(held) == NODES for _, held in layout.values())
