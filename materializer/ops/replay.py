"""A map's fold replayed from Kafka into a throwaway copy: the independent check of ``verify``.

The Delta table and Redis are both fed from one fold, so comparing them cannot
catch a fold that went wrong in both. Folding the topics again from their
earliest offsets, up to exactly the offsets Redis's watermark names, gives a
second opinion. The replay runs the map's own queries into a scratch
generation (its Redis keys, table, changelog and checkpoints), reads that
copy's entities, and drops it.

A map whose source starts at ``latest``, or whose topics no longer hold their
first events (retention), folded events a replay cannot see: differences are
then expected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.catalog.purge import drop_copy
from materializer.clients.redis import Client
from materializer.config import AppConfig
from materializer.contract.control import MapControl
from materializer.contract.redis_layout import physical_name
from materializer.job import start_map
from materializer.ops.rebuild import Progress, catch_up, replay_config
from materializer.ops.verify import redis_digests

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCRATCH_GENERATION = 999_999_999
"""The replay's copy: a generation number rebuilds, counting up from 0, never reach."""


def replay_digests(
    spark: SparkSession,
    config: AppConfig,
    map_name: str,
    until: dict[str, dict[int, int]],
    client: Client,
) -> dict[str, bytes]:
    """Key to value digest of the map folded from the earliest offsets up to ``until``."""
    drop_copy(config, client, map_name, SCRATCH_GENERATION)
    queries = start_map(
        spark,
        replay_config(config, map_name),
        map_name,
        generation=SCRATCH_GENERATION,
        side_outputs=False,
        offsets_group=None,
        until=until,
    )
    try:
        control = MapControl(client, map_name)
        catch_up(control, SCRATCH_GENERATION, until, _quiet, queries, "replaying")
    finally:
        queries.stop()
    try:
        return redis_digests(client, physical_name(map_name, SCRATCH_GENERATION))
    finally:
        drop_copy(config, client, map_name, SCRATCH_GENERATION)


def _quiet(_: Progress) -> None:
    """The replay's progress is the spinner of the command around it."""
