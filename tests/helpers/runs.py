"""``materializer run`` as users start it, and what its fold batches left behind: the
log's lines, the watermark each batch committed and the keys each batch wrote.

The run is a process of its own: a test sees its batches only from outside, in its
log and in Redis, where each fold batch appends its watermark to the map's table
marks and one change entry per key it wrote to the change stream.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
import yaml

from materializer.contract.redis_layout import changes_key, table_marks_key, text_fields
from materializer.contract.table_marks import TableMark
from materializer.testing.process import ManagedProcess


def config_file(doc: dict[str, Any], tmp: Path) -> Path:
    """``doc`` written as ``maps.yaml``, the file users give ``-c``."""
    path = tmp / "maps.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@contextlib.contextmanager
def materializer_run(config: Path) -> Iterator[ManagedProcess]:
    """``materializer run -c <config>`` for the body, its log in ``run.log`` beside the file.

    Stopped after the body as an orchestrator stops it (SIGTERM), which it must end
    cleanly; when the body fails, the end of its log is printed, where the reason is.
    """
    args = [sys.executable, "-m", "materializer", "run", "-c", str(config)]
    proc = ManagedProcess(args, config.parent / "run.log")
    try:
        yield proc
    except BaseException:
        print(proc.log()[-6000:], file=sys.stderr)
        raise
    finally:
        proc.stop()
    assert proc.proc.returncode == 0, proc.log()[-3000:]


def fold_batches(client: redis.Redis, map_name: str) -> list[tuple[int, dict[int, int]]]:
    """Each fold batch the map committed, in order: its batch id and the next offset per
    partition of its one source topic after it (the watermark of its table mark)."""
    out = []
    for _, fields in client.xrange(table_marks_key(map_name)):
        mark = TableMark.from_entry(fields)
        assert mark is not None, fields
        (offsets,) = mark.watermark.offsets.values()
        out.append((mark.watermark.batch_id, offsets))
    return out


def records_per_batch(batches: list[tuple[int, dict[int, int]]]) -> list[int]:
    """The records each batch folded: what its watermark adds to the one before (the first
    batch's counted from the topic's start)."""
    folded = [sum(offsets.values()) for _, offsets in batches]
    return [after - before for before, after in zip([0, *folded], folded, strict=False)]


def keys_written(client: redis.Redis, map_name: str, batch_id: int) -> set[str]:
    """The keys the map's change stream says that batch wrote."""
    entries = (text_fields(f) for _, f in client.xrange(changes_key(map_name)))
    return {e["key"] for e in entries if e.get("batch_id") == str(batch_id)}
