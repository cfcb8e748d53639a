"""Removing a map's data: one generation of it (a rebuild's old copy, a replay's scratch
copy), or the whole map once it is deleted (``purge``).

Spark-free, so the query service's admin API can purge a map it deleted. What a purge
leaves: the source topics (not the map's) and the dead-letter topic (records nobody
folded, kept for whoever investigates them).
"""

from __future__ import annotations

import logging

import pyarrow.fs as pafs

from materializer.clients.kafka_offsets import admin_client
from materializer.clients.redis import Client, connect
from materializer.config import AppConfig
from materializer.config.names import LIVE_GROUP, MAP_GROUP, changelog_topic, checkpoint_path
from materializer.contract.redis_layout import (
    MAP_SUFFIXES,
    generation_key,
    index_keys_pattern,
    live_freshness_key,
    marker_key,
    parse_generation,
    physical_name,
    state_keys_pattern,
    table_marks_pattern,
)
from materializer.contract.table_layout import history_path, table_path

log = logging.getLogger(__name__)

MAP_QUERIES = ("fold", "delta")
"""The queries whose checkpoints belong to a generation; the others belong to the map."""
MAP_KEYS = MAP_SUFFIXES
"""The Redis keys of the map itself, beside its generations' data."""
KAFKA_TIMEOUT_SECONDS = 30.0


def _delete_folder(folder: str) -> bool:
    """Remove a folder (local or in an object store) if it exists; whether it did."""
    if "://" in folder:
        fs, path = pafs.FileSystem.from_uri(folder)
    else:
        fs, path = pafs.LocalFileSystem(), folder
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return False
    fs.delete_dir(path)
    return True


class GenerationFiles:
    """A generation's folders (its Delta table and checkpoints) on any pyarrow file system."""

    def __init__(self, config: AppConfig, map_name: str, generation: int) -> None:
        physical = physical_name(map_name, generation)
        self.folders = [table_path(config, physical)] + [
            checkpoint_path(config, physical, q) for q in MAP_QUERIES
        ]

    def delete(self) -> list[str]:
        """Remove every folder that exists; those it removed."""
        return [folder for folder in self.folders if _delete_folder(folder)]


def drop_redis_copy(client: Client, map_name: str, generation: int) -> int:
    """Delete a generation's keys (entities, watermark, changes, the fold's states, its
    table marks, markers and indexes); the map's own keys stay."""
    physical = physical_name(map_name, generation)
    keep = {f"{map_name}:{s}".encode() for s in MAP_KEYS}
    dropped = 0
    batch: list[bytes] = []
    markers = f"{marker_key(physical)}*".encode()
    patterns = (
        f"{physical}:*".encode(),
        state_keys_pattern(physical),
        table_marks_pattern(physical),
        markers,
        index_keys_pattern(physical).encode(),
    )
    for pattern in patterns:
        for key in client.scan_iter(match=pattern, count=5000):
            if key in keep:
                continue
            batch.append(key)
            if len(batch) >= 5000:
                dropped += int(client.unlink(*batch))
                batch = []
    if batch:
        dropped += int(client.unlink(*batch))
    return dropped


def drop_copy(config: AppConfig, client: Client, map_name: str, generation: int) -> list[str]:
    """Remove one generation of a map everywhere: Redis, table, checkpoints, changelog;
    what it removed, one line each."""
    dropped = drop_redis_copy(client, map_name, generation)
    removed = [f"{dropped} Redis keys of {physical_name(map_name, generation)}"] if dropped else []
    removed += GenerationFiles(config, map_name, generation).delete()
    topic = changelog_topic(config, map_name, generation)
    admin = admin_client(config.kafka)
    if topic in admin.list_topics(timeout=10).topics:
        for future in admin.delete_topics(
            [topic], operation_timeout=KAFKA_TIMEOUT_SECONDS
        ).values():
            future.result()
        removed.append(f"topic {topic}")
    log.info("map %s: generation %d dropped (%d Redis keys)", map_name, generation, dropped)
    return removed


def purge(config: AppConfig, map_name: str) -> list[str]:
    """Remove everything a deleted map owns; what it removed, one line each.

    ``config`` still holds the map's definition (its changelog topic may be its own).
    Every generation a rebuild may have made is removed, the last one's leftovers too.
    """
    client = connect(config.redis)
    try:
        current = parse_generation(client.get(generation_key(map_name)))
        removed: list[str] = []
        for generation in range(current + 2):
            removed += drop_copy(config, client, map_name, generation)
        for folder in (f"{config.spark.checkpoint_root.rstrip('/')}/{map_name}",
                       history_path(config, map_name)):  # fmt: skip
            if _delete_folder(folder):
                removed.append(folder)
        client.unlink(live_freshness_key(map_name))  # figures the run had not taken yet
        keys = [f"{map_name}:{suffix}" for suffix in MAP_KEYS]
        if client.unlink(*keys):
            removed.append(f"Redis keys {', '.join(keys)}")
    finally:
        client.close()
    admin = admin_client(config.kafka)
    listed = {g.group_id for g in admin.list_consumer_groups().result().valid}
    for group in (MAP_GROUP.format(map=map_name), LIVE_GROUP.format(map=map_name)):
        if group in listed:
            admin.delete_consumer_groups([group], request_timeout=KAFKA_TIMEOUT_SECONDS)[
                group
            ].result()
            removed.append(f"consumer group {group}")
    log.info("map %s purged: %s", map_name, "; ".join(removed) or "nothing was left")
    return removed
