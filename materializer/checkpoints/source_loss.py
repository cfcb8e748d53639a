"""Source records a map still needs that Kafka no longer holds.

A map reads on from its fold checkpoint's position. Retention (or a
``delete-records``) may remove records past that position before the map
read them, and a topic deleted and created again may end before it. Spark's
Kafka source then fails the query (its ``failOnDataLoss``) with a message of
its own that names the offsets of the batch it planned, or only the
partitions it lost, and says nothing of the map or of a way out. Comparing
the checkpoint's position with each partition's log start and end says
exactly what is gone, so the run checks before it starts a map's queries and
when a fold fails with Spark's data-loss error, and reports this module's
message instead (in its log and in the map's status).

What is gone is never folded. The way out the message names depends on why:
records deleted under the map can be skipped (``reset-offsets --to
earliest``: the map goes on with what is left, and records it reads again
change nothing) or the map folded again from what the topics still hold
(``rebuild``); a topic that now ends before the map's position was created
anew, and the map's state still orders events by the old topic's offsets, so
only ``rebuild`` makes it right. A topic created again that already holds more
records than the map had read looks like the old one to offsets alone: that
one goes unnoticed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException

from materializer.checkpoints.files import CheckpointFiles
from materializer.clients.kafka_offsets import (
    KAFKA_TIMEOUT_SECONDS,
    admin_client,
    partition_offsets,
)
from materializer.config import AppConfig
from materializer.config.names import checkpoint_path
from materializer.contract.redis_layout import physical_name
from materializer.errors import MaterializerError

log = logging.getLogger(__name__)

GapKind = Literal["deleted", "past_end", "partition_gone", "topic_gone"]

DATA_LOSS_MARKERS = (
    "failOnDataLoss",  # every KAFKA_DATA_LOSS message of Spark's Kafka source
    "OffsetOutOfRangeException",  # the consumer's own, below it
    "START_OFFSET_GREATER_THAN_END_OFFSET",
    "UnknownTopicOrPartition",  # a topic deleted under a running map
)
"""Text in a failed fold's error that says Spark's Kafka source found records missing."""

Offsets = dict[str, dict[int, int]]
Bounds = dict[str, dict[int, tuple[int, int]]]
"""Per topic Kafka knows and partition: (log start offset, log end offset)."""


@dataclass(frozen=True)
class Gap:
    """Offsets of one source partition the map would read next that Kafka does not hold.

    ``first`` to ``last`` (inclusive) are the offsets missing; ``position`` is
    the map's next offset in the partition (None for a partition the map has
    not read yet, which Spark reads from offset 0).
    """

    topic: str
    partition: int
    kind: GapKind
    position: int | None
    first: int
    last: int

    def describe(self) -> str:
        """One clause naming the topic, the partition and the offsets missing."""
        where = f"topic {self.topic} partition {self.partition}"
        if self.kind == "deleted":
            them = "it" if self.first == self.last else "them"
            gone = f"{_offsets(self.first, self.last)} deleted before the map read {them}"
            if self.position is None:
                return f"{where} (new to the map): {gone} (the partition starts at {self.last + 1})"
            return (
                f"{where}: {gone} (the map's next offset is {self.position}, "
                f"the partition now starts at {self.last + 1})"
            )
        if self.kind == "past_end":
            return (
                f"{where}: the map's next offset {self.position} is past the partition's end "
                f"{self.first} ({_offsets(self.first, self.last)} removed: the topic was "
                "deleted and created again, or truncated)"
            )
        if self.kind == "partition_gone":
            return (
                f"{where} no longer exists (the map's next offset in it was {self.position}; "
                "the topic was deleted, or created again with fewer partitions)"
            )
        return (
            f"{where}: the topic no longer exists (the map's next offset in it was {self.position})"
        )


def _offsets(first: int, last: int) -> str:
    return f"offset {first} was" if first == last else f"offsets {first} to {last} were"


class SourceDataLoss(MaterializerError):
    """A map's next source records are gone from Kafka: its message names each partition's
    missing offsets and the commands that let the map go on."""

    def __init__(self, map_name: str, gaps: Sequence[Gap]) -> None:
        self.map_name = map_name
        self.gaps = list(gaps)
        super().__init__(loss_message(map_name, self.gaps))

    @property
    def topic_recreated(self) -> bool:
        """Whether a topic ends before the map's position or lost partitions: only a
        rebuild makes the map right again."""
        return any(g.kind != "deleted" for g in self.gaps)


def loss_message(map_name: str, gaps: Sequence[Gap]) -> str:
    """What is gone, then the way out."""
    what = "; ".join(g.describe() for g in gaps)
    restart = f"then `materializer restart {map_name}` (or start the run again)"
    if any(g.kind != "deleted" for g in gaps):
        way_out = (
            "Its state orders events by the old topic's offsets, so the new records would be "
            f"folded wrongly: fold it again from what the topics hold now with `materializer "
            f"rebuild {map_name}`, {restart}."
        )
    else:
        way_out = (
            f"To go on, skip them with `materializer reset-offsets {map_name} --to earliest` "
            "(what the map holds stays; records it reads again change nothing), or fold it "
            f"again from what the topics still hold with `materializer rebuild {map_name}`; "
            f"{restart}."
        )
    return f"map {map_name} cannot read on from its checkpoint: {what}. {way_out}"


def find_gaps(topics: Sequence[str], position: Offsets, bounds: Bounds) -> list[Gap]:
    """Compare where the map reads next with what each partition holds now.

    A partition the map has not read yet counts from offset 0, as Spark reads
    a partition added to a topic. Topics of the position that the map no
    longer reads are left out.
    """
    gaps: list[Gap] = []
    for topic in sorted(set(topics)):
        read = position.get(topic, {})
        if topic not in bounds:
            gaps += [Gap(topic, p, "topic_gone", o, o, o) for p, o in sorted(read.items())]
            continue
        now = bounds[topic]
        for partition in sorted(set(read) | set(now)):
            if partition not in now:
                at = read[partition]
                gaps.append(Gap(topic, partition, "partition_gone", at, at, at))
                continue
            start, end = now[partition]
            if partition not in read:
                if start > 0:
                    gaps.append(Gap(topic, partition, "deleted", None, 0, start - 1))
                continue
            at = read[partition]
            if at < start:
                gaps.append(Gap(topic, partition, "deleted", at, at, start - 1))
            elif at > end:
                gaps.append(Gap(topic, partition, "past_end", at, end, at - 1))
    return gaps


def log_bounds(admin: Any, topics: Sequence[str]) -> Bounds:
    """Each partition's log start and end offsets, for the topics Kafka knows.

    All topics are listed rather than the ones wanted: naming a missing topic
    may make a broker that auto-creates topics create it.
    """
    metadata = admin.list_topics(timeout=KAFKA_TIMEOUT_SECONDS).topics
    present = []
    for topic in sorted(set(topics)):
        found = metadata.get(topic)
        if found is None:
            continue
        if found.error is not None:
            if found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            raise KafkaException(found.error)
        present.append(topic)
    if not present:
        return {}
    starts = partition_offsets(admin, present, "earliest")
    ends = partition_offsets(admin, present, "latest")
    return {
        t: {p: (starts[t][p], ends[t].get(p, starts[t][p])) for p in starts[t]} for t in present
    }


def find_loss(config: AppConfig, map_name: str, generation: int) -> SourceDataLoss | None:
    """The records the map's fold needs next that Kafka no longer holds, if any.

    A map that never folded has nothing to lose (its first start reads from
    ``starting_offsets``). When the checkpoint or Kafka cannot be read the
    answer is None, with a warning: the queries' own start then decides.
    """
    files = CheckpointFiles(
        checkpoint_path(config, physical_name(map_name, generation), "fold"), config.object_store
    )
    topics = config.map(map_name).source.topics
    try:
        position = files.position() if files.exists() else None
        if position is None:
            return None
        bounds = log_bounds(admin_client(config.kafka), topics)
    except (KafkaException, MaterializerError, OSError, ValueError) as exc:
        log.warning(
            "map %s: could not compare its checkpoint with the topics' offsets: %s", map_name, exc
        )
        return None
    gaps = find_gaps(topics, position, bounds)
    return SourceDataLoss(map_name, gaps) if gaps else None


def check_source(config: AppConfig, map_name: str, generation: int) -> None:
    """Raise ``SourceDataLoss`` when the map's next records are gone: before its queries
    start, so that Spark never plans a batch over them."""
    loss = find_loss(config, map_name, generation)
    if loss is not None:
        raise loss


def explain_failure(
    config: AppConfig, map_name: str, generation: int, error: str, query_name: str
) -> str:
    """A failed query's ``error``; for a map's fold that Spark failed over missing records,
    ``SourceDataLoss``'s message instead (Spark's own when nothing is found missing)."""
    fold = f"{physical_name(map_name, generation)}.fold"
    if map_name not in config.maps or query_name != fold:
        return error
    if not any(marker in error for marker in DATA_LOSS_MARKERS):
        return error
    loss = find_loss(config, map_name, generation)
    return error if loss is None else str(loss)
