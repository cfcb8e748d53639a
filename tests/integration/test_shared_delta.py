"""The Delta query the real-time path's maps share (``live.delta``), against real Kafka, Spark
and Delta: each map's changelog into its own table, one map's failure its alone, and a later
writer taking up where each table stands."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from deltalake import DeltaTable

from materializer.checkpoints.files import CheckpointFiles
from materializer.config.names import changelog_topic
from materializer.contract.table_layout import table_path
from materializer.contract.table_marks import table_positions
from materializer.live import delta as live_delta
from materializer.live.delta import DeltaMember, SharedDelta
from materializer.redis.functions import Fenced
from materializer.run.lifecycle import FENCED_ERROR
from materializer.testing import produce
from tests.helpers.slices import SCHEMA, config, delta_map_rs, slice_config

Change = tuple[bytes, bytes | None]


def changes(name: str, n: int, seed: int) -> list[Change]:
    """Changelog records of ``name``: entities of 12 keys, one in six a deletion."""
    rng = random.Random(seed)
    out: list[Change] = []
    for i in range(n):
        key = f"{name}-{rng.randrange(12)}"
        if rng.random() < 1 / 6:
            out.append((key.encode(), None))
        else:
            doc = {"id": key, "name": f"n{seed}-{i}", "age": rng.randrange(90), "tags": ["a"]}
            out.append((key.encode(), orjson.dumps(doc)))
    return out


def reference(records: list[Change]) -> dict[str, Any]:
    """The table a changelog's records leave: each key's last entity, deleted keys absent."""
    table: dict[str, Any] = {}
    for key, value in records:
        if value is None:
            table.pop(key.decode(), None)
        else:
            table[key.decode()] = orjson.loads(value)
    return table


@pytest.mark.parametrize("together", [True, False], ids=["one-collect", "collect-fails"])
def test_each_map_merges_its_own_changelog_and_a_fenced_map_alone_stops(
    spark: Any,
    kafka_bootstrap: str,
    redis_url: str,
    new_topic: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    together: bool,
) -> None:
    """``collect-fails``: the batch's one collect fails (as one the driver cannot hold
    would); each map collects its own rows, and the maps go on as before."""
    from pyspark.sql.types import _parse_datatype_string

    if not together:

        def fails(changes: Any, entities: dict[str, Any]) -> Any:
            if entities:
                raise RuntimeError("the collect of every map's rows fails")
            return {}

        monkeypatch.setattr(live_delta, "entities_collected", fails)

    names = ["sda", "sdb", "sdc"]
    doc: dict[str, Any] = {"maps": {}}
    for name in names:
        one = slice_config(
            tmp_path,
            kafka_bootstrap,
            redis_url,
            new_topic(2),
            map_name=name,
            changelog={"topic": new_topic(3)},
        )
        doc = {**one, "maps": {**doc["maps"], **one["maps"]}}
    cfg = config(doc)
    entity = _parse_datatype_string(SCHEMA)
    fenced = threading.Event()

    def owner_of_sdc() -> None:
        if fenced.is_set():
            raise Fenced("sdc", 3)

    failures: list[tuple[str, str]] = []
    members = [DeltaMember(n, 0, cfg, entity, owner_of_sdc if n == "sdc" else None) for n in names]
    sent: dict[str, list[Change]] = {n: [] for n in names}
    ends: dict[str, dict[int, int]] = {n: dict.fromkeys(range(3), 0) for n in names}

    def wave(seed: int) -> None:
        for name in names:
            records = changes(name, 150, seed)
            for partition, offset in produce(kafka_bootstrap, changelog_topic(cfg, name), records):
                ends[name][partition] = max(ends[name].get(partition, 0), offset + 1)
            sent[name] += records

    def table(name: str) -> dict[str, Any]:
        return delta_map_rs(table_path(cfg, name))

    shared = SharedDelta(
        spark, cfg, members, str(tmp_path / "shared"), lambda n, e: failures.append((n, e))
    )
    wave(0)
    query = shared.start()
    try:
        query.processAllAvailable()
        assert {n: table(n) for n in names} == {n: reference(sent[n]) for n in names}
        merged_first = reference(sent["sdc"])
        first_ends = dict(ends["sdc"])

        fenced.set()  # another worker owns sdc now: its rows of later batches are not merged
        wave(1)
        query.processAllAvailable()
        assert query.isActive  # the others' batches went on
        assert table("sda") == reference(sent["sda"]) and table("sdb") == reference(sent["sdb"])
        assert table("sdc") == merged_first
        assert [n for n, _ in failures] == ["sdc"] and FENCED_ERROR in failures[0][1]
    finally:
        shared.stop(time.monotonic() + 60)

    # The next writer of sdc's table (a shared query of a later start, on a new checkpoint)
    # takes up where the table stands: wave 1's changes, and nothing of wave 0 again.
    fenced.clear()
    changelog = changelog_topic(cfg, "sdc")
    assert table_positions(DeltaTable(table_path(cfg, "sdc")), changelog) == first_ends
    again = SharedDelta(spark, cfg, [members[2]], str(tmp_path / "again"), _never)
    query = again.start()
    try:
        query.processAllAvailable()
        started = CheckpointFiles(str(tmp_path / "again")).initial_offsets() or {}
    finally:
        again.stop(time.monotonic() + 60)
    assert started[changelog] == first_ends
    assert table("sdc") == reference(sent["sdc"])
    assert table_positions(DeltaTable(table_path(cfg, "sdc")), changelog) == ends["sdc"]


def _never(name: str, error: str) -> None:
    raise AssertionError(f"map {name} failed: {error}")
