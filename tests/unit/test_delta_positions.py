"""Where a Delta table's next writer starts (``delta.positions``): the further of the
table's merged changelog position and the map's own Delta checkpoint, never behind either."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
from deltalake import CommitProperties, write_deltalake

from materializer.checkpoints.files import CheckpointFiles
from materializer.contract.table_marks import encode
from materializer.delta.positions import EARLIEST, MergedPositions, resume_at, starting_offsets

CHANGELOG = "orders.changelog"


def _table(path: Path, merged: dict[int, int] | None) -> MergedPositions:
    """A table whose one commit records ``merged`` (None: no table at all)."""
    if merged is not None:
        metadata = encode(None, {CHANGELOG: merged})
        write_deltalake(
            path,
            pa.table({"_key": ["k"]}),
            commit_properties=CommitProperties(custom_metadata={"userMetadata": metadata}),
        )
    return MergedPositions((str(path), None), CHANGELOG)


def _checkpoint(path: Path, committed: dict[int, int] | None) -> CheckpointFiles:
    """A Delta query's checkpoint whose last committed batch ended at ``committed``."""
    path.mkdir(parents=True)
    if committed is not None:
        (path / "offsets").mkdir()
        (path / "commits").mkdir()
        offsets = {CHANGELOG: {str(p): o for p, o in committed.items()}}
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}
        lines = ["v1", orjson.dumps(meta).decode(), orjson.dumps(offsets).decode()]
        (path / "offsets" / "7").write_text("\n".join(lines))
        (path / "commits" / "7").write_text('v1\n{"nextBatchWatermarkMs":0}')
    return CheckpointFiles(str(path))


def test_a_writer_takes_up_the_further_of_the_table_and_its_checkpoint(tmp_path):
    merged = _table(tmp_path / "t", {0: 50, 1: 10})
    own = _checkpoint(tmp_path / "c", {0: 40, 1: 30})
    assert resume_at(merged, own, [0, 1, 2]) == {0: 50, 1: 30, 2: EARLIEST}
    # The map's own query starts there, since the table is ahead in partition 0.
    assert orjson.loads(starting_offsets(merged, own, lambda: {CHANGELOG: [0, 1, 2]}) or "") == {
        CHANGELOG: {"0": 50, "1": 30, "2": EARLIEST}
    }


def test_a_checkpoint_level_with_or_past_the_table_is_kept(tmp_path):
    merged = _table(tmp_path / "t", {0: 40, 1: 10})
    own = _checkpoint(tmp_path / "c", {0: 40, 1: 30})
    asked = []
    assert starting_offsets(merged, own, lambda: asked.append(1) or {}) is None
    assert not asked  # Kafka is not asked for partitions then


def test_a_new_query_on_a_table_with_a_position_starts_there(tmp_path):
    merged = _table(tmp_path / "t", {0: 5})
    own = _checkpoint(tmp_path / "c", None)
    assert orjson.loads(starting_offsets(merged, own, lambda: {CHANGELOG: [0, 1]}) or "") == {
        CHANGELOG: {"0": 5, "1": EARLIEST}
    }
    fresh = _table(tmp_path / "none", None)  # no table yet: the checkpoint (or earliest) says
    assert starting_offsets(fresh, own, lambda: {CHANGELOG: [0, 1]}) is None
    assert resume_at(fresh, own, [0, 1]) == {0: EARLIEST, 1: EARLIEST}


def test_a_commit_records_a_position_never_behind_the_tables(tmp_path):
    merged = _table(tmp_path / "t", {0: 50, 1: 10})
    # A batch of a writer that started behind the table in partition 0.
    assert merged.reached({0: 45, 1: 20}) == {0: 50, 1: 20}
    assert merged.reached({0: 60, 1: 20, 2: 3}) == {0: 60, 1: 20, 2: 3}
    assert merged.floor() == {0: 60, 1: 20, 2: 3}  # its own commits move it on
