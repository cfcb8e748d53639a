"""A map's Redis copy restored by the materializer itself when a server lost it.

Redis holds the fold's state beside each entity, so a server restarted
empty (no persistence), or replaced by an empty one, must not be folded on:
an aggregate would start counting again from nothing. Each master holds a
*marker* of the map while its copy is whole (``layout.marker_key``); the
fold's writing functions refuse to run where it is missing, and the run's
supervisor looks for it twice a second.

A copy found without its marker is restored from what Delta and the
changelog hold (``ExpectedState``, as ``rehydrate`` does), but only where a
server lost it: an entity is written where neither it nor its fold state
exists (``materializer.redis.writer.fill``), so a master that kept its data keeps what the
fold made of it. The fold's last committed batch is the newest the restored
copy can hold, because a batch sends its changelog only once all of it is
in Redis; the batch that was cut short is replayed when the map starts
again, and folds onto that copy once. The markers go last: until then the
query service answers UNAVAILABLE for the map's missing keys, never
NOT_FOUND.

A restored entity has no fold state: ``latest`` applies the next record for
it whatever its order, ``merge`` and ``aggregate`` seed their state from the
entity (``KeyFolder.seed``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from materializer.checkpoints.files import CheckpointFiles
from materializer.clients.redis import client_for
from materializer.config import AppConfig
from materializer.config.names import checkpoint_path
from materializer.contract.markers import is_whole, mark_whole
from materializer.contract.redis_layout import meta_key, physical_name
from materializer.redis.functions import load_library
from materializer.redis.writer import fill
from materializer.restore.expected_state import ExpectedState, fold_watermark

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restored:
    """What a restore did."""

    map_name: str
    physical: str
    written: int
    """Entities written where a server had lost them."""
    table_version: int | None
    tail_records: int
    seconds: float


def ensure_whole(config: AppConfig, map_name: str, generation: int) -> Restored | None:
    """Before a map's queries start: restore its copy if a server lost it, then mark it.

    A map whose fold never committed a batch has nothing to restore: it is
    marked as it is. The fold's queries must not be running.
    """
    physical = physical_name(map_name, generation)
    client = client_for(config.redis)
    if is_whole(client, physical):
        return None
    files = CheckpointFiles(checkpoint_path(config, physical, "fold"), config.object_store)
    if not files.exists() or files.last_committed() is None:
        mark_whole(client, physical)
        return None
    return restore(config, map_name, generation)


def restore(config: AppConfig, map_name: str, generation: int) -> Restored:
    """Write what the servers lost of the map's copy, its watermark if lost, then the markers.

    The fold's queries must not be running.
    """
    started = time.monotonic()
    physical = physical_name(map_name, generation)
    client = client_for(config.redis)
    log.warning("map %s: Redis lost its copy; restoring it from Delta and the changelog", map_name)
    load_library(config.redis)  # a server restarted empty lost the functions too
    state = ExpectedState.open(config, map_name, generation)
    written = 0
    for batch in state.batches():
        keys = batch.keys.to_pylist()
        values = batch.values.to_pylist()
        expiry = [None] * len(keys) if batch.expiry_ms is None else batch.expiry_ms.to_pylist()
        written += fill(
            config.redis,
            physical,
            list(zip(keys, zip(values, expiry, strict=True), strict=True)),
        )
    watermark = fold_watermark(config, physical)
    if watermark is not None and not client.exists(meta_key(physical)):
        client.hset(meta_key(physical), mapping=dict(watermark.to_hash()))  # type: ignore[arg-type]
    mark_whole(client, physical)
    done = Restored(
        map_name=map_name,
        physical=physical,
        written=written,
        table_version=state.table_version,
        tail_records=state.tail.records,
        seconds=time.monotonic() - started,
    )
    log.warning(
        "map %s: copy restored: %d entities written (Delta version %s, %d changelog "
        "records after it) in %.1f s",
        map_name,
        done.written,
        done.table_version,
        done.tail_records,
        done.seconds,
    )
    return done
