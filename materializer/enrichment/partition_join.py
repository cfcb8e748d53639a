"""Executor side of an enrichment: one Arrow batch of events joined with the maps at a time.

Each batch of a partition costs one Redis round trip per round of the join
(an MGET per map, pipelined), through the one client its executor process
keeps per Redis URL. The join's rules are ``materializer.enrichment.rounds``, the
same as the query service's Enrich, so an event enriched either way comes out the
same. In ``delta`` mode the entities arrive as columns of the batch instead
(Spark joined the tables), and only the assembly happens here.

Every input record leaves as exactly one row of ``OUTPUT_SCHEMA``: an
enriched event (``out``), a dead letter (``dead``: the original record with
the error in its headers), or a dropped event (no row at all, for inner
joins and ``on_miss: drop``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from materializer import record_columns as c
from materializer.clients.redis import queue_gets
from materializer.config import RedisConfig
from materializer.contract.redis_layout import entity_key
from materializer.enrichment.plan import JoinPlan, LookupStep
from materializer.enrichment.rounds import (
    EventState,
    Found,
    apply_round,
    key_of,
    kind,
    round_keys,
)
from materializer.source.dead_letters import ERROR_HEADERS

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

EVENT = "__event"
"""The event as JSON bytes: the record's value itself, or its decoded fields re-encoded."""
TARGET = "__target"
OUT, DEAD = "out", "dead"

HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
OUTPUT_ARROW = pa.schema(
    [
        (TARGET, pa.string()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(HEADER)),
    ]
)


def output_schema() -> StructType:
    """``OUTPUT_ARROW`` as Spark's type: the columns Spark's ``kafka`` writer takes, plus
    where each row goes."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        StringType,
        StructField,
        StructType,
    )

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType(
        [
            StructField(TARGET, StringType()),
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("headers", ArrayType(header)),
        ]
    )


def found_column(index: int) -> str:
    """``delta`` mode: the column holding lookup ``index``'s entity JSON (null: no entity)."""
    return f"__found_{index}"


@dataclass(frozen=True)
class PartitionJoin:
    """The ``mapInArrow`` function of one batch; picklable, built on the driver per batch."""

    plan: JoinPlan
    physical: dict[str, str]
    """Map name to the physical name of its current generation, read once per batch."""
    redis: RedisConfig | None
    """Where the maps are; None in ``delta`` mode, where the entities are columns."""
    output_key: tuple[str, ...] | None
    """A path into the enriched event, or None for the input record's own key."""

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """What ``mapInArrow`` runs over each partition."""
        for batch in batches:
            yield self.join(batch)

    def join(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """One batch of records in, their enriched events and dead letters out."""
        columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        stages: list[str] = []
        events = [
            _parse(event, stage, message, stages)
            for event, stage, message in zip(
                columns[EVENT], columns[c.ERROR_STAGE], columns[c.ERROR_MESSAGE], strict=True
            )
        ]
        for steps in self.plan.rounds:
            keys = round_keys(events, steps)
            found = self._read(steps, keys, columns)
            apply_round(events, steps, keys, found)
        return self._rows(events, stages, columns)

    def _read(
        self, steps: Sequence[LookupStep], keys: list[list[Any]], columns: dict[str, list[Any]]
    ) -> Found:
        found: dict[str, dict[str, bytes | None]] = {step.map: {} for step in steps}
        if self.redis is None:  # delta mode: one round, lookup i's entities in column i
            for i, step in enumerate(steps):
                entities = columns[found_column(i)]
                for event_keys, entity in zip(keys, entities, strict=True):
                    if event_keys and isinstance(event_keys[i], str) and entity is not None:
                        found[step.map][event_keys[i]] = entity.encode()
            return found
        from materializer.clients.redis import client_for

        wanted: dict[str, dict[str, None]] = {step.map: {} for step in steps}
        for event_keys in keys:
            for step, key in zip(steps, event_keys, strict=False):
                if isinstance(key, str):
                    wanted[step.map][key] = None
        pipe = client_for(self.redis).pipeline(transaction=False)
        asked = [
            (name, list(ks), queue_gets(pipe, [entity_key(self.physical[name], k) for k in ks]))
            for name, ks in wanted.items()
            if ks
        ]
        replies = iter(pipe.execute())
        for name, ks, take in asked:
            found[name] = dict(zip(ks, take(replies), strict=True))
        return found

    def _rows(
        self, events: list[EventState], stages: list[str], columns: dict[str, list[Any]]
    ) -> pa.RecordBatch:
        targets: list[str] = []
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        headers: list[list[dict[str, Any]]] = []
        for i, event in enumerate(events):
            original = columns[c.HEADERS][i] or []
            if event.doc is not None:
                targets.append(OUT)
                keys.append(self._key(event.doc, columns[c.KAFKA_KEY][i]))
                values.append(orjson.dumps(event.doc))
                headers.append(original)
            elif not event.dropped:
                source = (stages[i], event.error)
                where = (columns[c.TOPIC][i], columns[c.PARTITION][i], columns[c.OFFSET][i])
                targets.append(DEAD)
                keys.append(columns[c.KAFKA_KEY][i])
                values.append(columns[c.VALUE][i])
                headers.append(
                    original
                    + [
                        {"key": name, "value": str(value).encode()}
                        for (name, _), value in zip(ERROR_HEADERS, (*source, *where), strict=True)
                    ]
                )
        return pa.RecordBatch.from_arrays(
            [
                pa.array(targets, pa.string()),
                pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()),
                pa.array(headers, pa.list_(HEADER)),
            ],
            schema=OUTPUT_ARROW,
        )

    def _key(self, doc: dict[str, Any], record_key: bytes | None) -> bytes | None:
        """The output record's key: the input's, or the member at ``output_key`` (None when
        it is missing or no key can be made of it)."""
        if self.output_key is None:
            return record_key
        key = key_of(doc, self.output_key)
        return key.encode() if isinstance(key, str) else None


def _parse(
    event: bytes | None, stage: str | None, message: str | None, stages: list[str]
) -> EventState:
    """The event as a JSON object, or a failed state naming the stage that failed."""
    if stage is not None:
        stages.append(stage)
        return EventState(None, error=message or "")
    stages.append("decode")
    if event is None:
        return EventState(None, error="a record without a value (a tombstone) has no event")
    try:
        doc = orjson.loads(event)
    except orjson.JSONDecodeError as exc:
        return EventState(None, error=f"not a UTF-8 JSON object: {exc}")
    if not isinstance(doc, dict):
        return EventState(None, error=f"the event is {kind(doc)}, not a JSON object")
    stages[-1] = "enrich"  # from here on, what fails is the join
    return EventState(doc)
