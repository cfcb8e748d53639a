"""A streaming query's checkpoint read (and, for offset resets, edited) without Spark.

Operations such as ``rehydrate`` and ``reset-offsets`` run from the command
line against a stopped map; starting a JVM just to read a few small files would
cost them tens of seconds. The folder is reached through pyarrow's file
systems, so a local path and an object store URI (``s3://…``) both work.

Spark's layout: ``metadata`` (the query id), ``offsets/<batch_id>`` (written
before a batch runs: its end offsets) and ``commits/<batch_id>`` (written once
the batch's sinks returned). A batch with offsets but no commit was cut short
and runs again on the next start.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

import orjson
import pyarrow.fs as pafs

from materializer.clients.object_store import arrow_filesystem
from materializer.config import OBJECT_STORE_SCHEMES, ObjectStoreConfig
from materializer.errors import MaterializerError


class CheckpointError(MaterializerError):
    """A checkpoint that is missing or not in a state the operation can work from."""


def _filesystem(location: str, store: ObjectStoreConfig | None) -> tuple[pafs.FileSystem, str]:
    if store is not None and location.startswith(OBJECT_STORE_SCHEMES):
        return arrow_filesystem(store, location)
    if "://" in location:
        fs, path = pafs.FileSystem.from_uri(location)
        return fs, path.rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(location)


class CheckpointFiles:
    """One query's checkpoint folder, e.g. ``<checkpoint_root>/<map>/fold``."""

    def __init__(self, location: str, store: ObjectStoreConfig | None = None) -> None:
        self.location = location
        self._fs, self._root = _filesystem(location, store)

    def _path(self, *parts: str) -> str:
        return posixpath.join(self._root, *parts)

    def _read(self, *parts: str) -> str:
        with self._fs.open_input_stream(self._path(*parts)) as stream:
            return bytes(stream.read()).decode()

    def _batches(self, folder: str) -> list[int]:
        selector = pafs.FileSelector(self._path(folder), allow_not_found=True)
        names = (posixpath.basename(info.path) for info in self._fs.get_file_info(selector))
        return sorted(int(name) for name in names if name.isdigit())

    def exists(self) -> bool:
        """Whether the query ever started (it writes ``metadata`` first)."""
        return bool(self._fs.get_file_info(self._path("metadata")).type == pafs.FileType.File)

    def query_id(self) -> str:
        """The streaming query's id, as the pipeline's app ids use it."""
        return str(orjson.loads(self._read("metadata"))["id"])

    def last_committed(self) -> int | None:
        """The newest batch whose sinks all returned; ``None`` before the first."""
        batches = self._batches("commits")
        return batches[-1] if batches else None

    def last_planned(self) -> int | None:
        """The newest batch with offsets: the last committed one, or one cut short after it."""
        batches = self._batches("offsets")
        return batches[-1] if batches else None

    def end_offsets(self, batch_id: int) -> dict[str, dict[int, int]]:
        """Per topic and partition, the next offset after ``batch_id``."""
        return parse_offsets_log(self._read("offsets", str(batch_id)))

    def initial_offsets(self) -> dict[str, dict[int, int]] | None:
        """Where the query's first batch starts, as the Kafka source resolved it at its first
        start (``sources/0/0``); None when it has not written them."""
        path = self._path("sources", "0", "0")
        if self._fs.get_file_info(path).type != pafs.FileType.File:
            return None
        # A leading zero byte (kept for old Spark readers), the log version, then the offsets.
        lines = [ln for ln in self._read("sources", "0", "0").lstrip("\0").splitlines() if ln]
        if len(lines) < 2:
            return None
        offsets: dict[str, dict[int, int]] = {}
        for topic, partitions in orjson.loads(lines[1]).items():
            offsets[topic] = {int(p): int(o) for p, o in partitions.items() if int(o) >= 0}
        return offsets

    def position(self) -> dict[str, dict[int, int]] | None:
        """Where the query reads next: the last committed batch's end offsets (a batch cut
        short after it runs again from there), or its initial offsets; None before any."""
        committed = self.last_committed()
        if committed is not None:
            return self.end_offsets(committed)
        return self.initial_offsets()

    def batch_timestamp_ms(self, batch_id: int) -> int:
        """When Spark planned the batch (UTC epoch milliseconds)."""
        lines = [ln for ln in self._read("offsets", str(batch_id)).splitlines() if ln.strip()]
        meta: dict[str, Any] = orjson.loads(lines[1])
        return int(meta.get("batchTimestampMs", 0))

    def settled_batch(self) -> int | None:
        """The last committed batch, refusing a checkpoint with a batch cut short after it.

        Such a batch runs again on the next start with the offsets it planned;
        editing or reading around it would disagree with that replay.
        """
        committed, planned = self.last_committed(), self.last_planned()
        if planned is not None and planned != committed:
            raise CheckpointError(
                f"{self.location}: batch {planned} was cut short and has not run again yet; "
                "start the map once so it finishes, stop it, then retry"
            )
        return committed

    def drop_planned(self, batch_id: int) -> None:
        """Remove the offsets of ``batch_id``, a batch planned after the last committed one
        that can never run (its records are gone): the next start plans a batch afresh from
        the last committed one's end offsets."""
        if batch_id == self.last_committed():
            raise CheckpointError(f"{self.location}: batch {batch_id} is committed")
        for name in (str(batch_id), f".{batch_id}.crc"):
            path = self._path("offsets", name)
            if self._fs.get_file_info(path).type == pafs.FileType.File:
                self._fs.delete_file(path)

    def rewrite_end_offsets(self, batch_id: int, offsets: dict[str, dict[int, int]]) -> None:
        """Replace the end offsets of committed batch ``batch_id``: the next batch starts there.

        Only the offsets line changes; the batch metadata (watermarks, the
        session conf it ran with) stays. The file is replaced by a rename, and
        Hadoop's checksum file beside it is removed (it would no longer match).
        """
        lines = [ln for ln in self._read("offsets", str(batch_id)).splitlines() if ln.strip()]
        sources = [ln for ln in lines[2:] if ln != "-"]
        if len(sources) != 1:
            raise CheckpointError(
                f"{self.location}: expected one source in offsets/{batch_id}, found {len(sources)}"
            )
        encoded = {
            topic: {str(p): o for p, o in sorted(parts.items())}
            for topic, parts in sorted(offsets.items())
        }
        text = "\n".join([lines[0], lines[1], orjson.dumps(encoded).decode()])
        target = self._path("offsets", str(batch_id))
        staging = self._path("offsets", f".{batch_id}.reset.tmp")
        with self._fs.open_output_stream(staging) as out:
            out.write(text.encode())
        self._fs.move(staging, target)
        crc = self._path("offsets", f".{batch_id}.crc")
        if self._fs.get_file_info(crc).type == pafs.FileType.File:
            self._fs.delete_file(crc)


def parse_batch_time(text: str) -> int:
    """One ``offsets/<batch_id>`` file: the batch's timestamp (``batchTimestampMs`` of its
    metadata line), which Spark gives the batch's ``current_timestamp()``, in a replay too."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return int(orjson.loads(lines[1])["batchTimestampMs"])


def parse_offsets_log(text: str) -> dict[str, dict[int, int]]:
    """One ``offsets/<batch_id>`` file: per topic and partition, the batch's end offsets.

    Line 0 is the log version, line 1 the batch metadata, then one line per
    source (``-`` for a source without offsets yet).
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    offsets: dict[str, dict[int, int]] = {}
    for line in lines[2:]:
        if line == "-":
            continue
        for topic, partitions in orjson.loads(line).items():
            offsets.setdefault(topic, {}).update({int(p): int(o) for p, o in partitions.items()})
    return offsets
