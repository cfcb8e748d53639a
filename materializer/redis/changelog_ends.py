"""Where a map's changelog ends after each fold batch: the changelog half of its table mark.

A mark (``contract.table_marks.TableMark``) tells the Delta query "once you
have merged the changelog this far, your table holds this watermark". So its
ends must lie past every changelog record of its batch *and of every batch
before*, in every partition: a partition this batch did not write may hold
an earlier batch's records, which the table must have merged too.

The batch's own records come from the delivery reports (``Applied``), at no
cost beyond the callbacks the producers run anyway; the ends carry from batch
to batch on the driver. They begin, at a fold query's first batch (and after
a batch whose deliveries came back without offsets), with the log ends Kafka
reports after the batch: the high watermarks, past every acknowledged
record. Not read_committed's stable offsets: another producer's open
transaction holds those back below records already written, and an end too
near would let the table claim records it has not merged. Too far is safe:
the table then waits for a later mark.
"""

from __future__ import annotations

import logging
from typing import Any

from materializer.clients.kafka_offsets import admin_client, partition_offsets
from materializer.config import KafkaConfig
from materializer.redis.apply import Applied, furthest

log = logging.getLogger(__name__)


class ChangelogEnds:
    """The changelog's ends after each batch of one fold query (driver side)."""

    def __init__(self, kafka: KafkaConfig, topic: str) -> None:
        self._kafka = kafka
        self.topic = topic
        self._ends: dict[int, int] | None = None
        self._admin: Any = None

    def after(self, applied: Applied) -> dict[int, int] | None:
        """The ends once a batch whose records went where ``applied`` says is delivered;
        ``None``: Kafka could not say where its log ends (the batch gets no mark)."""
        if applied.changelog_ends is None or self._ends is None:
            # Past every record acknowledged so far, this batch's included.
            self._ends = self._log_ends()
            if self._ends is None:
                return None
        else:
            self._ends = furthest(self._ends, applied.changelog_ends)
        return dict(self._ends)

    def close(self) -> None:
        """Release the admin client, once the fold query has stopped."""
        self._admin = None

    def _log_ends(self) -> dict[int, int] | None:
        try:
            if self._admin is None:
                self._admin = admin_client(self._kafka)
            return partition_offsets(self._admin, [self.topic], "latest")[self.topic]
        except Exception as exc:  # noqa: BLE001 - a mark is an extra: the batch goes on
            log.warning("changelog %s: no table mark for this batch (%s)", self.topic, exc)
            self._admin = None
            return None
