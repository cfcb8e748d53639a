"""The demo's work dir: a kept one keeps what is worth reading, and nothing foreign is deleted."""

from __future__ import annotations

from pathlib import Path

import pytest

from materializer.demo.workdir import CONFIG_NAME, PIPELINE_LOG, WAREHOUSE, open_workdir
from materializer.errors import SetupError


def _run(path: Path | None) -> Path:
    """What a run leaves: config, a log, a table, and broker data and checkpoints."""
    workdir = open_workdir(path)
    workdir.config.write_text("maps: {}\n")
    (workdir.path / PIPELINE_LOG).write_text("log\n")
    (workdir.folder(WAREHOUSE) / "users").mkdir()
    (workdir.folder("kafka") / "data").mkdir()
    (workdir.folder("checkpoints") / "users").mkdir()
    workdir.close()
    return workdir.path


def test_a_temporary_work_dir_is_removed():
    assert not _run(None).exists()


def test_a_kept_work_dir_keeps_config_logs_and_tables_and_the_next_run_starts_afresh(
    tmp_path: Path,
):
    kept = _run(tmp_path / "demo")
    assert sorted(p.name for p in kept.iterdir()) == [CONFIG_NAME, PIPELINE_LOG, WAREHOUSE]
    again = open_workdir(kept)
    assert again.path == kept and not again.temporary
    assert list(kept.iterdir()) == []


def test_a_folder_with_other_files_is_refused_and_left_alone(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine\n")
    (tmp_path / WAREHOUSE).mkdir()
    with pytest.raises(SetupError, match=r"notes\.txt"):
        open_workdir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", WAREHOUSE]
