"""The map's consumer group ``materializer.<map>``: each batch's end offsets, for Kafka's tools.

The fold reads its topics through Spark's checkpoint, never through this
group: the group only mirrors the checkpoint, so that ``kafka-consumer-groups
--describe --group materializer.<map>`` and any lag monitor built on consumer
groups show how far the map is. Offsets are committed after the batch is in
Redis and the changelog, by a consumer of the group that never subscribes:
the group has no members, so the broker takes its commits as it takes the
admin API's.

Not through the admin API: librdkafka aborts the whole process when an admin
request to a group coordinator times out before the coordinator could be
reached, and the coordinator answers later while the client lives
(``rd_kafka_enq_once_del_source_return: Assertion 'eonce->refcnt > 0'``,
confluentinc/librdkafka#4605, still in librdkafka 2.16). A broker that hangs
for longer than the commit timeout (a long GC pause, a frozen machine) did
exactly that to the run. A consumer's commit that finds no coordinator waits
for one instead (up to ``session.timeout.ms``), and the sink goes on meanwhile.

Every batch commits the end offsets of all its partitions, not only the ones
that moved: a replayed batch commits the same offsets again, a fresh
checkpoint moves the group back with it, and a commit that failed is mended
by the next one that succeeds. A failure never fails the batch, since the
group is only a view of the map's progress.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from materializer.batch import Batch, Sink
from materializer.clients.kafka import topic_partitions

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
"""How long a batch waits for the commit before it goes on without it."""
POLL_S = 0.005
"""How long one ``poll`` waits while the sink waits for a commit's answer. A consumer
with no subscription gets no messages, so each ``poll`` lasts its whole timeout even
when the answer came at once: at 0.1 s the commit took a large share of every batch of
a live map, at 5 ms it takes little (docs/decisions/0014-kafka-fetch-wait-of-20-ms.md)."""


class GroupOffsetsSink(Sink):
    """The batch's end offsets (Kafka's "next offsets") as the group's committed offsets.

    Runs on the driver. Idempotent: the same batch commits the same offsets.
    At most one commit is on its way at a time, so an earlier batch's commit
    that was late never lands after a later one's.
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
        self._consumer: Consumer | None = None
        self._sent = 0
        self._answered = 0
        self._answer: tuple[KafkaError | None, list[TopicPartition]] = (None, [])
        self._failing = False

    def close(self) -> None:
        """Close the group's consumer: it waits for a commit still on its way, for as
        long as librdkafka gives one (``session.timeout.ms``, a request's timeout)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def write(self, batch: Batch) -> None:
        """Commit the offsets of ``batch``; a failure is logged (once until a commit succeeds)."""
        offsets = self._end_offsets(batch.batch_id)
        try:
            self._commit(offsets)
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

    def _commit(self, offsets: dict[str, dict[int, int]]) -> None:
        """Commit ``offsets`` and wait for the answer, all within ``TIMEOUT_S``; raise the
        broker's refusal, or TimeoutError (the commit then stays on its way)."""
        partitions = topic_partitions(offsets)
        if not partitions:
            return
        consumer = self._group_consumer()
        deadline = time.monotonic() + TIMEOUT_S
        self._wait(consumer, deadline)  # an earlier batch's commit, still on its way
        consumer.commit(offsets=partitions, asynchronous=True)
        self._sent += 1
        self._wait(consumer, deadline)
        error, answered = self._answer
        if error is not None:
            raise KafkaException(error)
        for tp in answered:
            if tp.error is not None:
                raise KafkaException(tp.error)

    def _wait(self, consumer: Consumer, deadline: float) -> None:
        """Serve the consumer's callbacks until every commit sent has its answer."""
        while self._answered < self._sent:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"the group coordinator did not answer a commit within {TIMEOUT_S:g} s"
                )
            consumer.poll(min(left, POLL_S))  # no subscription: it only serves callbacks

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's answer to a commit, served by ``poll`` in ``_wait``."""
        self._answered += 1
        self._answer = (error, partitions)

    def _group_consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    **self._settings,
                    "group.id": self.group,
                    "enable.auto.commit": False,
                    "on_commit": self._on_commit,
                }
            )
        return self._consumer
