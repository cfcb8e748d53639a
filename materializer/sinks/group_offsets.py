"""The map's consumer group ``materializer.<map>``: each batch's end offsets, for Kafka's tools.

The fold reads its topics through Spark's checkpoint, never through this
group: the group only mirrors the checkpoint, so that ``kafka-consumer-groups
--describe --group materializer.<map>`` and any lag monitor built on consumer
groups show how far the map is. Offsets are committed with the admin API
(the group has no members, so the broker accepts them from outside), after the
batch is in Redis and the changelog.

Every batch commits the end offsets of all its partitions, not only the ones
that moved: a replayed batch commits the same offsets again, a fresh
checkpoint moves the group back with it, and a commit that failed is mended
by the next one that succeeds. A failure never fails the batch, since the
group is only a view of the map's progress.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from materializer.ops.kafka_offsets import commit_group_offsets
from materializer.sinks.base import Batch, Sink

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
"""How long a batch waits for the commit before it goes on without it."""


class GroupOffsetsSink(Sink):
    """The batch's end offsets (Kafka's "next offsets") as the group's committed offsets.

    Runs on the driver. Idempotent: the same batch commits the same offsets.
    """

    name = "group_offsets"

    def __init__(
        self,
        group: str,
        end_offsets: Callable[[int], dict[str, dict[int, int]]],
        client: Mapping[str, str],
    ) -> None:
        self.group = group
        self._end_offsets = end_offsets
        self._settings: dict[str, str | int | float | bool] = dict(client)
        self._admin: AdminClient | None = None
        self._failing = False

    def close(self) -> None:
        """Drop the admin client (librdkafka closes it on release)."""
        self._admin = None

    def write(self, batch: Batch) -> None:
        """Commit the offsets of ``batch``; a failure is logged (once until a commit succeeds)."""
        offsets = self._end_offsets(batch.batch_id)
        try:
            if self._admin is None:
                self._admin = AdminClient(self._settings)
            commit_group_offsets(self._admin, self.group, offsets, TIMEOUT_S)
        except (KafkaException, TimeoutError) as exc:  # TimeoutError: no answer in time
            if not self._failing:
                log.warning(
                    "consumer group %s: could not commit the offsets of batch %d (nothing may "
                    "consume with this group); the map goes on and later batches try again: %s",
                    self.group,
                    batch.batch_id,
                    exc.args[0] if exc.args else exc,
                )
            self._failing = True
            return
        if self._failing:
            log.info("consumer group %s: offsets committed again", self.group)
        self._failing = False
