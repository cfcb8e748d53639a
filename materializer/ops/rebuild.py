"""``rebuild``: fold a map again from the first event into a new copy, then move readers to it.

The live copy keeps serving throughout. Steps:

1. a new generation ``g`` (``materializer.contract.redis_layout.physical_name``) gets its own
   Redis keys, Delta table, changelog topic and checkpoints; leftovers of an
   earlier rebuild that never switched are removed first;
2. the map's fold and Delta queries run into it from the earliest offsets
   (dead letters and history are the map's own and are not sent again);
3. once the copy has caught up with the log ends seen at the start, the live
   map is held still (paused, if a materializer runs it), the copy takes in
   what arrived meanwhile, its queries stop, and ``<map>:__generation__``
   switches to ``g`` in one write; the live map resumes on the new copy from
   the copy's own checkpoints, so nothing is folded twice or lost;
4. after a grace period longer than any reader keeps the old generation in
   mind (the query service re-reads it twice a second), the old copy is dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from materializer.catalog.purge import drop_copy
from materializer.clients.kafka_offsets import admin_client, partition_offsets
from materializer.clients.redis import connect
from materializer.config import AppConfig
from materializer.contract.control import MapControl
from materializer.contract.redis_layout import (
    generation_key,
)
from materializer.errors import MaterializerError
from materializer.job import start_map
from materializer.runtime.query_group import QueryGroup

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
ABANDON_SECONDS = 20.0
"""How long a rebuild that stops early lets the new copy's batch in flight end."""


class RebuildFailed(MaterializerError):
    """The replay into the new copy stopped; the live copy was never touched."""


@dataclass
class Progress:
    """What a rebuild reports while it runs (the command draws it)."""

    phase: str
    folded: int = 0
    """Source records the new copy has read (sum of its watermark offsets)."""
    target: int = 0
    """Sum of the log ends it must reach before the switch."""


Report = Callable[[Progress], None]

PHASES = {
    "cleaning": "removing leftovers of an unfinished rebuild",
    "replaying": "replaying the topics into the new copy",
    "switching": "holding the map still and switching readers",
    "grace": "grace period: readers finish with the old copy",
    "dropping": "dropping the old copy",
    "done": "done",
}
"""Each phase a rebuild reports (``Progress.phase``), in words."""


def _offsets_sum(offsets: dict[str, dict[int, int]]) -> int:
    return sum(o for parts in offsets.values() for o in parts.values())


def _covers(mark: dict[str, dict[int, int]], ends: dict[str, dict[int, int]]) -> bool:
    return all(
        mark.get(topic, {}).get(partition, 0) >= end
        for topic, parts in ends.items()
        for partition, end in parts.items()
    )


def within(
    offsets: dict[str, dict[int, int]], ends: dict[str, dict[int, int]]
) -> dict[str, dict[int, int]]:
    """``offsets`` no further than the topics' log ends, for partitions that still exist.

    The live copy of a map whose topic was deleted and created again read
    further than the new topic goes: the new copy cannot reach those offsets,
    and has caught up once it holds what the topics hold.
    """
    return {
        topic: {p: min(o, ends[topic][p]) for p, o in parts.items() if p in ends.get(topic, {})}
        for topic, parts in offsets.items()
    }


def replay_config(config: AppConfig, map_name: str) -> AppConfig:
    """The config with the map reading from the earliest offsets (a new copy starts there)."""
    map_config = config.map(map_name)
    source = map_config.source.model_copy(update={"starting_offsets": "earliest"})
    replay = map_config.model_copy(update={"source": source})
    return config.model_copy(update={"maps": {**config.maps, map_name: replay}})


def rebuild(
    spark: SparkSession,
    config: AppConfig,
    map_name: str,
    *,
    grace_seconds: float = 60.0,
    report: Report = lambda _: None,
) -> int:
    """Rebuild ``map_name`` into a new generation, switch readers to it, drop the old one.

    Returns the new generation. Blocks until the old copy is dropped. A
    failure before the switch leaves the live copy untouched.
    """
    client = connect(config.redis)
    control = MapControl(client, map_name)
    old = control.generation()
    new = old + 1
    try:
        report(Progress("cleaning"))
        drop_copy(config, client, map_name, new)
        topics = config.map(map_name).source.topics
        admin = admin_client(config.kafka)
        target = partition_offsets(admin, topics, "latest")
        queries = start_map(
            spark,
            replay_config(config, map_name),
            map_name,
            generation=new,
            side_outputs=False,
            offsets_group=None,
        )
        try:
            catch_up(control, new, target, report, queries)
            report(Progress("switching", _offsets_sum(target), _offsets_sum(target)))
            with control.held():
                # The live copy is still now: once the new one holds at least as much,
                # readers lose nothing by moving. Waiting for the source to run dry
                # instead would never end while producers keep producing.
                live = control.watermark(old)
                ends = partition_offsets(admin, topics, "latest")
                target = within(live.offsets if live else {}, ends)
                catch_up(control, new, target, report, queries, "switching")
                queries.stop_after_batch()
                client.set(generation_key(map_name), str(new))
            log.info("map %s: readers moved to generation %d", map_name, new)
        except BaseException:
            # Interrupted or failed: the new copy's batch in flight ends before its queries
            # stop (within a bound), rather than being cut short in the middle.
            queries.stop_after_batch(ABANDON_SECONDS)
            raise
        finally:
            queries.stop()
        _grace(grace_seconds, report)
        report(Progress("dropping"))
        drop_copy(config, client, map_name, old)
        report(Progress("done"))
        return new
    finally:
        client.close()


def catch_up(
    control: MapControl,
    generation: int,
    target: dict[str, dict[int, int]],
    report: Report,
    queries: QueryGroup,
    phase: str = "replaying",
) -> None:
    """Wait until the new copy's watermark reaches ``target``; a failed query ends the wait."""
    goal = _offsets_sum(target)
    while True:
        broken = [q for q in queries.queries if not q.isActive]
        if broken:
            raise RebuildFailed(
                f"map {control.map_name!r}: the replay query {broken[0].name} stopped: "
                f"{broken[0].exception()}"
            )
        mark = control.watermark(generation)
        offsets: dict[str, dict[int, int]] = mark.offsets if mark else {}
        report(Progress(phase, _offsets_sum(offsets), goal))
        if mark is not None and _covers(offsets, target):
            return
        if goal == 0:
            return
        time.sleep(POLL_SECONDS)


def _grace(seconds: float, report: Report) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        report(Progress("grace", int(seconds - left), int(seconds)))
        time.sleep(min(POLL_SECONDS, left))
