"""The Delta store on tables delta-rs writes itself: versions it has, had, and never had."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from materializer.config import AppConfig, parse_config
from query_service.errors import OutOfRange
from query_service.stores.delta import DeltaTables, TableNotFound
from query_service.tables.time_travel import entity_as_of

SOURCE = {"source": {"topics": ["t"], "schema": "id STRING"}, "key": "id"}


def tables_under(root: Path, *maps: str) -> DeltaTables:
    config: AppConfig = parse_config(
        {"delta": {"root": str(root)}, "maps": {m: SOURCE for m in maps}}
    )
    return DeltaTables(config)


@pytest.fixture()
def trimmed(tmp_path: Path) -> DeltaTables:
    """A table at version 3 whose log before its checkpoint at 3 was cleaned up."""
    path = str(tmp_path / "trimmed")
    rows = pa.table({"_key": ["a"], "n": [0]})
    write_deltalake(path, rows, configuration={"delta.logRetentionDuration": "interval 0 seconds"})
    for n in range(1, 4):
        write_deltalake(path, pa.table({"_key": ["a"], "n": [n]}), mode="overwrite")
    table = DeltaTable(path)
    table.create_checkpoint()
    time.sleep(0.01)
    table.cleanup_metadata()
    return tables_under(tmp_path, "trimmed")


def test_versions_no_longer_retained_are_out_of_range(trimmed: DeltaTables):
    assert trimmed.open("trimmed", 3).version() == 3
    with pytest.raises(OutOfRange, match="no longer retains"):
        trimmed.open("trimmed", 1)
    with pytest.raises(OutOfRange, match=r"no such version yet \(latest: 3\)"):
        trimmed.open("trimmed", 4)


def test_time_travel_before_the_oldest_retained_commit_is_out_of_range(trimmed: DeltaTables):
    with pytest.raises(OutOfRange, match="no longer retains"):
        entity_as_of(trimmed, "trimmed", "a", version=2, at_ns=None)
    with pytest.raises(OutOfRange, match="before the oldest version"):
        entity_as_of(trimmed, "trimmed", "a", version=None, at_ns=1_000_000_000)
    now_ns = int(datetime.now(UTC).timestamp() * 1e9)
    latest = entity_as_of(trimmed, "trimmed", "a", version=None, at_ns=now_ns)
    assert latest.commit.version == 3
    assert latest.entity == b'{"n":3}'


def test_a_map_without_a_table_is_not_found(tmp_path: Path):
    tables = tables_under(tmp_path, "later")
    with pytest.raises(TableNotFound, match="has no Delta table yet"):
        tables.open("later")
    with pytest.raises(TableNotFound):
        tables.open("later", 0)
