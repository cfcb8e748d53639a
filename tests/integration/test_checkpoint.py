"""A map's streaming checkpoints: how they are written, and how the fold reads them back."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from materializer.checkpoints.running import KEPT_BATCHES, Checkpoint
from materializer.config import AppConfig
from materializer.config.names import checkpoint_path
from materializer.contract.redis_layout import state_key
from materializer.job import start_map
from materializer.testing import produce
from tests.helpers.slices import config, slice_config


def run_map(
    spark,
    bootstrap: str,
    redis_url: str,
    topic: str,
    tmp_path: Path,
    rounds: list[list],
    **extra: Any,
) -> tuple[AppConfig, str]:
    """A map over ``topic`` that folds each round of records in a batch of its own."""
    name = f"ckpt{uuid.uuid4().hex[:8]}"
    cfg = config(slice_config(tmp_path, bootstrap, redis_url, topic, map_name=name, **extra))
    queries = start_map(spark, cfg, name)
    try:
        for records in rounds:
            produce(bootstrap, topic, records)
            queries.process_all_available()
    finally:
        queries.stop()
    return cfg, name


def test_checkpoint_logs_go_without_checksum_files_and_other_writes_keep_theirs(
    spark, kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    rounds = [
        [(f"k{i}".encode(), orjson.dumps({"id": f"k{i}", "age": r})) for i in range(10)]
        for r in range(2)
    ]
    cfg, name = run_map(spark, kafka_bootstrap, redis_url, topic, tmp_path, rounds)

    fold = Path(checkpoint_path(cfg, name, "fold"))
    logs = [p.name for p in (fold / "offsets").iterdir()] + [
        p.name for p in (fold / "commits").iterdir()
    ]
    assert "1" in logs  # batches were written...
    assert not [n for n in logs if n.endswith(".crc")]  # ...with no checksum file beside
    # Spark's files (Parquet, as Delta's) go through Hadoop's FileSystem: checksummed still.
    spark.range(3).write.parquet(str(tmp_path / "parquet"))
    assert any(p.name.endswith(".parquet.crc") for p in (tmp_path / "parquet").iterdir())


def test_a_checkpoint_view_keeps_its_last_batches_offsets(
    spark, kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    topic = new_topic(1)
    batches = KEPT_BATCHES + 2
    rounds = [[(b"a", orjson.dumps({"id": "a", "age": r}))] for r in range(batches)]
    cfg, name = run_map(spark, kafka_bootstrap, redis_url, topic, tmp_path, rounds)

    location = checkpoint_path(cfg, name, "fold")
    offsets = Path(location) / "offsets"
    last = max(int(p.name) for p in offsets.iterdir() if p.name.isdigit())
    view = Checkpoint(spark, location)
    read = {batch: view.end_offsets(batch) for batch in range(last + 1)}
    assert read[last] == {topic: {0: batches}}  # one record a round
    kept = range(last + 1 - KEPT_BATCHES, last + 1)
    expected = {batch: read[batch][topic][0] for batch in kept}
    read[last][topic][0] = -1  # what a caller does with its copy stays its own
    for batch in range(last + 1):
        (offsets / str(batch)).unlink()
    # The last batches are answered without their files; an older one is read again.
    assert {batch: view.end_offsets(batch)[topic][0] for batch in kept} == expected
    with pytest.raises(Exception, match="FileNotFound|does not exist"):
        view.end_offsets(last - KEPT_BATCHES)


def test_a_merge_order_holds_its_batch_time_from_the_offsets_log(
    spark, kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    """``merge`` orders events by their batch's timestamp, which the fold takes from the
    batch's offsets log (not from the plan, whose code would change every batch)."""
    topic = new_topic(1)
    started_ms = int(time.time() * 1000)
    rounds = [[(b"a", orjson.dumps({"id": "a", "age": r}))] for r in range(2)]
    cfg, name = run_map(
        spark, kafka_bootstrap, redis_url, topic, tmp_path, rounds, fold={"mode": "merge"}
    )
    ended_ms = int(time.time() * 1000)

    view = Checkpoint(spark, checkpoint_path(cfg, name, "fold"))
    offsets = Path(checkpoint_path(cfg, name, "fold")) / "offsets"
    last = max(int(p.name) for p in offsets.iterdir() if p.name.isdigit())
    ends = [view.end_offsets(b).get(topic, {}).get(0, 0) for b in range(last + 1)]
    second = ends.index(2)  # the batch that read offset 1, the second round's event
    batch_ms = view.batch_time_ms(second)
    assert started_ms <= batch_ms <= ended_ms
    state = orjson.loads(redis.Redis.from_url(redis_url).get(state_key(name, "a")))
    # The last event's order: the batch's timestamp, then partition 0 and offset 1.
    assert state["e"] == f"{batch_ms:020d}" + f"{0:010d}{1:019d}"


def test_what_an_interrupted_log_write_left_is_dropped_before_a_query_starts(spark, tmp_path: Path):
    # A worker stopped or killed while Spark wrote a log entry leaves its temporary file,
    # which makes Spark refuse the folder's next first batch.
    root = tmp_path / "checkpoint"
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "offsets" / "0").write_text("v1\n{}")
    (root / "offsets" / f".1.{uuid.uuid4()}.tmp").write_text("")
    (root / "commits" / f".0.{uuid.uuid4()}.tmp").write_text("")
    (root / "sources").mkdir()
    (root / "sources" / ".kept.tmp").write_text("")  # not a log of the query's own

    assert Checkpoint(spark, str(root)).drop_unfinished_writes() == 2
    assert sorted(p.name for p in (root / "offsets").iterdir()) == ["0"]
    assert list((root / "commits").iterdir()) == []
    assert (root / "sources" / ".kept.tmp").exists()
