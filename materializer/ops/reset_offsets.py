"""``reset-offsets``: move where a still map's fold reads next, as Kafka Connect's offset reset.

The fold's position lives in its Spark checkpoint, not in a consumer group: the
last committed batch's end offsets are where the next batch starts. A reset
rewrites those offsets (``CheckpointFiles.rewrite_end_offsets``) and leaves the
fold's state, Redis and the Delta table as they are: events skipped are never
folded, events replayed change nothing (the fold's state knows them). To
start over from nothing, ``rebuild`` the map instead.

A map whose next records Kafka no longer holds (``materializer.checkpoints.source_loss``)
goes on after a reset to where records are: a batch Spark planned over the
missing records can never run, so the reset drops it. A map whose topic now
ends before its position was created anew: its state orders events by the
old topic's offsets, so the reset is refused and ``rebuild`` named instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from materializer.checkpoints.files import CheckpointError, CheckpointFiles
from materializer.checkpoints.source_loss import find_loss
from materializer.clients.kafka_offsets import (
    Position,
    admin_client,
    commit_group_offsets,
    partition_offsets,
)
from materializer.config import AppConfig
from materializer.config.names import MAP_GROUP, checkpoint_path
from materializer.contract.control import MapControl
from materializer.contract.redis_layout import physical_name
from materializer.errors import MaterializerError


class BadPosition(MaterializerError):
    """``--to`` is neither earliest, latest, epoch milliseconds nor an ISO-8601 time."""


class ResetRefused(MaterializerError):
    """A reset would leave the map wrong: a topic was created anew under it (rebuild it)."""


def parse_position(text: str) -> Position:
    """``earliest`` | ``latest`` | epoch milliseconds | ISO-8601 time (UTC unless it says)."""
    if text in ("earliest", "latest"):
        return text
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadPosition(
            f"--to {text!r}: use earliest, latest, epoch milliseconds or an ISO-8601 time "
            "such as 2026-11-23T10:00:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.now().astimezone().tzinfo).astimezone()
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True)
class OffsetReset:
    """What a reset changes: the batch whose end offsets move, from ``before`` to ``after``."""

    map_name: str
    batch_id: int
    before: dict[str, dict[int, int]]
    after: dict[str, dict[int, int]]
    dropped: int | None = None
    """A batch planned after ``batch_id`` over records Kafka no longer holds: the reset
    drops it, as it can never run."""


def plan_reset(config: AppConfig, control: MapControl, to: Position) -> OffsetReset:
    """Where the fold would start after the reset; nothing is changed yet."""
    name = control.map_name
    control.ensure_still()
    generation = control.generation()
    files = CheckpointFiles(
        checkpoint_path(config, physical_name(name, generation), "fold"), config.object_store
    )
    loss = find_loss(config, name, generation)
    if loss is not None and loss.topic_recreated:
        raise ResetRefused(f"not reset: {loss}")
    batch, dropped = None, None
    if files.exists():
        try:
            batch = files.settled_batch()
        except CheckpointError:
            if loss is None:
                raise
            batch, dropped = files.last_committed(), files.last_planned()
    if batch is None:
        raise CheckpointError(
            f"map {name!r} has not folded a batch yet: its first run starts at "
            f"maps.{name}.source.starting_offsets, set that instead"
        )
    topics = config.map(name).source.topics
    after = partition_offsets(admin_client(config.kafka), topics, to)
    return OffsetReset(name, batch, files.end_offsets(batch), after, dropped)


def apply_reset(config: AppConfig, control: MapControl, reset: OffsetReset) -> None:
    """Rewrite the checkpoint, then move the map's consumer group to match.

    The map is checked again first: a materializer that started meanwhile
    would race the edit.
    """
    control.ensure_still()
    files = CheckpointFiles(
        checkpoint_path(config, control.physical(), "fold"), config.object_store
    )
    if (
        reset.dropped is not None
        and files.last_planned() == reset.dropped
        and files.last_committed() == reset.batch_id
    ):
        files.drop_planned(reset.dropped)
    if files.settled_batch() != reset.batch_id:
        raise CheckpointError(
            f"map {reset.map_name!r} folded batches since the reset was planned; plan it again"
        )
    files.rewrite_end_offsets(reset.batch_id, reset.after)
    group = MAP_GROUP.format(map=reset.map_name)
    commit_group_offsets(admin_client(config.kafka), group, reset.after)
