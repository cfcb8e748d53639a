"""The source offsets in a Delta commit's userMetadata: the format readers rely on, and how a
version without one finds the mark it reflects."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from materializer.contract import table_marks
from materializer.contract.table_marks import (
    CommitMark,
    decode,
    encode,
    table_mark,
    table_positions,
    table_watermark,
)
from materializer.contract.watermark import Watermark

MARK = Watermark(batch_id=41, offsets={"orders": {1: 987, 0: 1200}}, updated_at_ms=17, app_id="q")


def test_the_user_metadata_is_the_contract():
    assert encode(MARK, {"orders.changelog": {1: 4980, 0: 5210}}) == (
        '{"changelog":{"orders.changelog":{"0":5210,"1":4980}},"format":1,'
        '"watermark":{"app_id":"q","batch_id":41,'
        '"offsets":{"orders":{"0":1200,"1":987}},"updated_at_ms":17}}'
    )
    assert encode(MARK) == (
        '{"format":1,"watermark":{"app_id":"q","batch_id":41,'
        '"offsets":{"orders":{"0":1200,"1":987}},"updated_at_ms":17}}'
    )


def test_a_mark_round_trips():
    assert decode(encode(MARK)) == CommitMark(MARK, {})
    changelog = {"orders.changelog": {0: 5210}}
    assert decode(encode(MARK, changelog)) == CommitMark(MARK, changelog)


@pytest.mark.parametrize(
    "other",
    [
        None,
        "",
        "free text a user wrote",
        "[1, 2]",
        '{"format": 2, "watermark": {"batch_id": 1, "offsets": {}}}',  # a newer format
        '{"format": 1}',
        '{"format": 1, "watermark": {"offsets": {}}}',
        '{"format": 1, "watermark": {"batch_id": 1, "offsets": {"t": {"x": 1}}}}',
        '{"format": 1, "watermark": {"batch_id": 1, "offsets": []}}',
    ],
)
def test_other_metadata_records_no_offsets(other):
    assert decode(other) is None


def _commit(path: Path, i: int, metadata: str | None = None, mode: str = "append") -> None:
    custom = None if metadata is None else {"userMetadata": metadata}
    write_deltalake(
        path,
        pa.table({"_key": [f"k{i}"], "n": [i]}),
        mode=mode,  # type: ignore[arg-type]
        commit_properties=CommitProperties(custom_metadata=custom),
    )


def _mark(batch: int) -> Watermark:
    return Watermark(batch_id=batch, offsets={"t": {0: 10 * batch}}, app_id="q")


def test_a_version_without_a_mark_reflects_the_newest_earlier_one(tmp_path: Path):
    path = tmp_path / "t"
    _commit(path, 0)  # created without one (the table's DDL)
    _commit(path, 1, encode(_mark(1)))
    _commit(path, 2, encode(_mark(2)))
    DeltaTable(path).delete("n = 0")  # a retention DELETE records none
    _commit(path, 3, "someone else's note")
    table = DeltaTable(path)
    assert table.version() == 4
    assert table_watermark(table) == _mark(2)
    assert table_watermark(DeltaTable(path, version=1)) == _mark(1)
    assert table_watermark(DeltaTable(path, version=0)) is None


def test_an_older_snapshot_reads_its_own_commits_not_the_newest(tmp_path: Path):
    """delta-rs's history() of a time-travelled snapshot lists the newest commits in storage
    under the snapshot's version numbers; the marks must not come from there."""
    path = tmp_path / "t"
    _commit(path, 0, encode(_mark(1)))
    old = DeltaTable(path)
    _commit(path, 1, encode(_mark(2)))
    _commit(path, 2, encode(_mark(3)))
    assert table_watermark(old) == _mark(1)
    assert table_watermark(DeltaTable(path, version=1)) == _mark(2)


def test_the_walk_back_is_bounded_and_reads_growing_slices(tmp_path: Path, monkeypatch):
    path = tmp_path / "t"
    _commit(path, 0, encode(_mark(1)))
    for i in range(1, 12):
        _commit(path, i)
    read: list[list[int]] = []
    commit_infos = table_marks._CommitReader.commit_infos

    def spy(self, versions):
        read.append(versions)
        return commit_infos(self, versions)

    monkeypatch.setattr(table_marks._CommitReader, "commit_infos", spy)
    assert table_watermark(DeltaTable(path)) == _mark(1)
    assert [len(s) for s in read] == [1, 8, 3]
    assert [v for s in read for v in s] == list(range(11, -1, -1))

    read.clear()
    monkeypatch.setattr(table_marks, "WALK_BACK_COMMITS", 5)
    assert table_watermark(DeltaTable(path)) is None
    assert [v for s in read for v in s] == [11, 10, 9, 8, 7]


def test_a_commit_the_log_no_longer_keeps_ends_the_walk(tmp_path: Path):
    path = tmp_path / "t"
    _commit(path, 0, encode(_mark(1)))
    _commit(path, 1)
    table = DeltaTable(path)
    table.create_checkpoint()
    (path / "_delta_log" / f"{0:020d}.json").unlink()
    assert table_mark(DeltaTable(path)) is None


def test_a_commit_without_a_known_watermark_still_records_its_changelog_position():
    changelog = {"orders.changelog": {0: 12, 1: 7}}
    text = encode(None, changelog)
    assert text == '{"changelog":{"orders.changelog":{"0":12,"1":7}},"format":1}'
    assert decode(text) == CommitMark(None, changelog)


def test_the_next_writer_starts_at_the_position_the_newest_commit_records(tmp_path):
    _commit(tmp_path, 0, encode(MARK, {"orders.changelog": {0: 5, 1: 3}}), mode="overwrite")
    _commit(tmp_path, 1, encode(None, {"orders.changelog": {0: 9, 1: 3}, "other": {0: 1}}))
    _commit(tmp_path, 2)  # a retention DELETE or OPTIMIZE records none
    table = DeltaTable(tmp_path)
    assert table_positions(table, "orders.changelog") == {0: 9, 1: 3}
    assert table_positions(table, "not.merged.here") == {}
    assert table_watermark(table) is None  # under-claims: the newest mark knew none
