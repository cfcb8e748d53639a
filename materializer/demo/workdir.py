"""The demo's work dir: its config and logs, and the state of one run.

A temp dir by default, removed at exit. A kept one (``--workdir``) keeps the
last run's config, logs and Delta tables to look at afterwards; the rest
(broker data, checkpoints) means nothing once the broker is gone, so it is
removed at exit, and the next run starts by clearing what the last one left.
A folder holding anything else is refused: the demo never deletes a file it
did not write.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from materializer.errors import SetupError

CONFIG_NAME = "demo.yaml"
PIPELINE_LOG = "pipeline.log"
QUERY_LOG = "query-service.log"
WAREHOUSE = "warehouse"
SCRATCH = ("kafka", "redis", "checkpoints", "spark-tmp", "spark-warehouse")
"""Run state that is of no use after the run: removed at exit even from a kept work dir."""
WRITTEN = frozenset({CONFIG_NAME, PIPELINE_LOG, QUERY_LOG, WAREHOUSE, *SCRATCH})
"""Everything a demo run writes in its work dir."""


@dataclass(frozen=True)
class WorkDir:
    """Where one demo run keeps its files."""

    path: Path
    temporary: bool

    @property
    def config(self) -> Path:
        """The demo's configuration file."""
        return self.path / CONFIG_NAME

    def folder(self, name: str) -> Path:
        """A folder of the run's state, created on first use."""
        folder = self.path / name
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def close(self) -> None:
        """Remove a temporary work dir, or a kept one's scratch folders."""
        if self.temporary:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for name in SCRATCH:
            shutil.rmtree(self.path / name, ignore_errors=True)


def open_workdir(path: Path | None) -> WorkDir:
    """A fresh temp dir, or ``path`` made ready for a new run."""
    if path is None:
        return WorkDir(Path(tempfile.mkdtemp(prefix="materializer-demo-")), temporary=True)
    path = path.resolve()
    if path.exists():
        if not path.is_dir():
            raise SetupError(f"--workdir {path}: not a folder")
        foreign = sorted(p.name for p in path.iterdir() if p.name not in WRITTEN)
        if foreign:
            raise SetupError(
                f"--workdir {path}: holds files the demo did not write ({', '.join(foreign[:3])}"
                f"{', …' if len(foreign) > 3 else ''}); give a new or empty folder"
            )
        for entry in path.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return WorkDir(path, temporary=False)
