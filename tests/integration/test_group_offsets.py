"""The consumer group ``materializer.<map>`` mirrors the fold's checkpoint, for Kafka's tools."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer

from materializer.batch import Batch
from materializer.checkpoints.running import Checkpoint
from materializer.config.names import checkpoint_path
from materializer.job import start_map
from materializer.runtime.group_offsets import GroupOffsetsSink
from materializer.testing import KafkaBroker, create_topic, produce
from materializer.testing.waiting import wait_until
from tests.helpers.slices import config, group_offsets, slice_config, watermark


def latest_committed_batch(spark, location: str) -> int:
    """The newest batch id in the checkpoint's ``commits/`` folder (batches that completed)."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(f"{location}/commits")
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    names = [status.getPath().getName() for status in fs.listStatus(path)]
    return max(int(n) for n in names if n.isdigit())


def test_each_batch_leaves_the_group_at_the_checkpoint_offsets(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    name = f"grp{uuid.uuid4().hex[:8]}"
    cfg = config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name))
    group = f"materializer.{name}"
    location = checkpoint_path(cfg, name, "fold")
    produced: Counter[int] = Counter()
    queries = start_map(spark, cfg, name)
    try:
        for round_ in range(3):
            records = [
                (f"k{i}".encode(), orjson.dumps({"id": f"k{i}", "age": round_}))
                for i in range(round_ * 7, round_ * 7 + 20)
            ]
            produced.update(partition for partition, _ in produce(kafka_bootstrap, topic, records))
            queries.process_all_available()

            batch_id = latest_committed_batch(spark, location)
            checkpointed = Checkpoint(spark, location).end_offsets(batch_id)
            assert group_offsets(kafka_bootstrap, group, topic) == checkpointed
            mark = watermark(redis_client, name)
            assert mark is not None and mark.batch_id == batch_id
            assert mark.offsets == checkpointed
            # On a fresh topic offsets count records: the reference is what was produced.
            assert checkpointed == {topic: dict(produced)}
            assert len(produced) == 2  # both partitions took records
    finally:
        queries.stop()


def test_without_a_group_nothing_is_committed(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(1)
    name = f"nogrp{uuid.uuid4().hex[:8]}"
    cfg = config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name))
    produce(kafka_bootstrap, topic, [(b"a", b'{"id": "a"}'), (b"b", b'{"id": "b"}')])
    queries = start_map(spark, cfg, name, offsets_group=None)
    try:
        queries.process_all_available()
    finally:
        queries.stop()
    mark = watermark(redis_client, name)
    assert mark is not None and mark.offsets == {topic: {0: 2}}
    assert group_offsets(kafka_bootstrap, f"materializer.{name}", topic) == {}


def _batch(batch_id: int) -> Batch:
    # The sink reads only the batch id; the rows stay in Spark.
    return Batch(rows=None, batch_id=batch_id, app_id="test")  # type: ignore[arg-type]


def test_a_failed_commit_leaves_the_batch_alone_and_the_next_one_mends_the_group(
    kafka_bootstrap, new_topic, caplog: pytest.LogCaptureFixture
):
    topic = new_topic(2)
    group = f"materializer.sink{uuid.uuid4().hex[:8]}"
    produce(kafka_bootstrap, topic, [(f"k{i}".encode(), b"{}") for i in range(10)])
    checkpoint = {
        0: {topic: {0: 1, 1: 2}},
        1: {topic: {0: 3, 1: 4}},
        2: {topic: {0: 5, 1: 5}},
        3: {topic: {0: 6, 1: 4}},
    }
    sink = GroupOffsetsSink(group, checkpoint.__getitem__, {"bootstrap.servers": kafka_bootstrap})

    sink.write(_batch(0))
    assert group_offsets(kafka_bootstrap, group, topic) == checkpoint[0]
    sink.write(_batch(0))  # a replay commits the same offsets again
    assert group_offsets(kafka_bootstrap, group, topic) == checkpoint[0]

    # Someone consumes with the group: the broker refuses commits from outside it.
    member = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    member.subscribe([topic])
    try:
        wait_until("the member's assignment", lambda: bool(member.poll(0.5) or member.assignment()))
        with caplog.at_level(logging.INFO, logger="materializer.runtime.group_offsets"):
            sink.write(_batch(1))  # no exception: the batch goes on
            sink.write(_batch(2))
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, caplog.text  # once, not once per batch
        assert group in warnings[0].getMessage()
    finally:
        member.close()

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="materializer.runtime.group_offsets"):
        sink.write(_batch(3))
    assert "committed again" in caplog.text
    # All partitions are committed, even one whose offset went back (a fresh checkpoint).
    assert group_offsets(kafka_bootstrap, group, topic) == checkpoint[3]


def test_a_commit_the_stalled_broker_left_unanswered_ends_well_when_it_answers_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A broker that hangs (SIGSTOP) before the sink ever reached the group's coordinator,
    then answers again (SIGCONT): the first batch's commit times out and the batch goes on;
    the coordinator's late answer to it does not abort the process (librdkafka's admin API
    did), and later batches mend the group."""
    with KafkaBroker(workdir=tmp_path / "kafka") as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, 2)
        group = f"materializer.stall{uuid.uuid4().hex[:8]}"
        produce(bootstrap, topic, [(f"k{i}".encode(), b"{}") for i in range(10)])
        checkpoint = {0: {topic: {0: 2, 1: 3}}, 1: {topic: {0: 4, 1: 6}}}
        sink = GroupOffsetsSink(group, checkpoint.__getitem__, {"bootstrap.servers": bootstrap})
        try:
            broker.pause()
            try:
                with caplog.at_level(logging.WARNING, logger="materializer.runtime.group_offsets"):
                    sink.write(_batch(0))  # no exception: the batch goes on
            finally:
                broker.resume()
            assert "could not commit the offsets of batch 0" in caplog.text

            def mended() -> bool:
                sink.write(_batch(1))
                return group_offsets(bootstrap, group, topic) == checkpoint[1]

            wait_until("a later batch's commit", mended)
        finally:
            broker.resume()
            sink.close()
