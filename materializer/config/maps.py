"""One materialized map: its source, key, fold, error handling, changelog and TTLs."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from materializer.config.base import INTERNAL_PREFIX, KAFKA_KEY, FoldPath, _Model
from materializer.config.durations import NonNegativeDuration, PositiveDuration
from materializer.config.transforms import Transform, ValueToKeyTransform


class SourceConfig(_Model):
    """The topics a map folds and how their values decode.

    ``format`` picks the decoder: ``json`` (``schema`` as Spark SQL DDL, or no
    schema: fields inferred per micro-batch, new ones added as they appear;
    ``latest`` fold only, no transforms),
    ``avro`` (``schema_file``, or ``schema_registry_url`` for Confluent's wire
    format), ``protobuf`` (``descriptor_file`` and ``message``, or
    ``schema_registry_url`` with an optional ``message``), or ``string`` (the
    value as one string field), or ``json_schema`` (Confluent's JSON Schema wire
    format: the registry's 5-byte header, then JSON, typed by ``schema`` as for
    ``json``; the JSON carries its own field names, so the registry is not asked).

    ``envelope`` says what a decoded value is: ``none``, the entity itself; ``debezium``,
    Debezium's change event (``before``, ``after``, ``op``, ``source``, ``ts_ms``), whose
    ``after`` is the entity, ``op: d`` a delete, and the tombstone after it nothing
    (``materializer.source.debezium``). Its ``schema`` (``json``, ``json_schema``) declares
    the row's columns; with ``avro`` they are ``after``'s fields in the registry.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    topics: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    format: Literal["json", "json_schema", "avro", "protobuf", "string"] = "json"
    schema_: Annotated[str | None, Field(alias="schema", min_length=1)] = None
    """Spark SQL DDL of a JSON value, e.g. ``id STRING, name STRING, age INT``; without it
    the fields are inferred from the values, one micro-batch at a time."""
    schema_file: str | None = None
    descriptor_file: str | None = None
    message: str | None = None
    schema_registry_url: str | None = None
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"
    """Where the reader schemas are registered, as Confluent's serializers name subjects:
    ``topic`` one record type per topic (``<topic>-value``); ``record`` (``<record name>``)
    and ``topic_record`` (``<topic>-<record name>``) let one topic carry several record
    types, those of ``record_types``, each read into the map's fields."""
    record_types: list[Annotated[str, Field(min_length=1)]] | None = None
    """The full names of the record types a topic carries (``subject_name_strategy``
    ``record`` or ``topic_record``): the map's fields are all of theirs, a field a type
    lacks is null, and a record of another type is a dead letter."""
    string_field: str = "value"
    envelope: Literal["none", "debezium"] = "none"

    @model_validator(mode="after")
    def _envelope_formats(self) -> SourceConfig:
        if self.envelope != "debezium":
            return self
        if self.format in ("json", "json_schema") and self.schema_ is None:
            raise ValueError(
                "envelope debezium with format json needs schema: the row's columns as Spark "
                "SQL DDL (the fold's entity is the change event's after)"
            )
        if self.format == "avro" and self.schema_registry_url is None:
            raise ValueError(
                "envelope debezium with format avro needs schema_registry_url: Debezium's "
                "Avro converter writes Confluent's wire format"
            )
        if self.format not in ("json", "json_schema", "avro"):
            raise ValueError(
                f"envelope debezium reads format json, json_schema or avro, not {self.format}"
            )
        if self.subject_name_strategy != "topic":
            raise ValueError(
                "envelope debezium reads one table's topic: subject_name_strategy topic"
            )
        return self

    @model_validator(mode="after")
    def _format_options(self) -> SourceConfig:
        fmt = self.format
        given = {
            name
            for name in (
                "schema_",
                "schema_file",
                "descriptor_file",
                "message",
                "schema_registry_url",
            )
            if getattr(self, name) is not None
        }
        allowed = {
            "json": {"schema_"},
            "json_schema": {"schema_"},
            "avro": {"schema_file", "schema_registry_url"},
            "protobuf": {"descriptor_file", "message", "schema_registry_url"},
            "string": set(),
        }[fmt]
        extra = given - allowed
        if extra:
            names = ", ".join(sorted(n.rstrip("_") for n in extra))
            raise ValueError(f"{names} does not apply to format {fmt}")
        if fmt == "json_schema" and not given:
            raise ValueError("format json_schema needs schema (Spark SQL DDL of the values)")
        if fmt == "avro" and len(given) != 1:
            raise ValueError("format avro needs exactly one of schema_file, schema_registry_url")
        if fmt == "protobuf" and not (
            "schema_registry_url" in given or {"descriptor_file", "message"} <= given
        ):
            raise ValueError(
                "format protobuf needs descriptor_file and message, or schema_registry_url"
            )
        if fmt == "protobuf" and "schema_registry_url" in given and "descriptor_file" in given:
            raise ValueError(
                "format protobuf takes descriptor_file or schema_registry_url, not both"
            )
        several = self.subject_name_strategy != "topic"
        if several and fmt not in ("avro", "protobuf"):
            raise ValueError(
                "subject_name_strategy record or topic_record is for format avro or protobuf"
            )
        if several and "message" in given:
            raise ValueError(
                "message does not apply with subject_name_strategy record or topic_record: "
                "record_types names the messages"
            )
        if several and "schema_registry_url" not in given:
            raise ValueError("subject_name_strategy needs schema_registry_url")
        if several and not self.record_types:
            raise ValueError(
                f"subject_name_strategy {self.subject_name_strategy} needs record_types: the "
                "full names of the record types the topic carries"
            )
        if self.record_types and not several:
            raise ValueError(
                "record_types applies with subject_name_strategy record or topic_record only"
            )
        url = self.schema_registry_url
        if url is not None and not re.match(r"^https?://[^/\s]+", url):
            raise ValueError("schema_registry_url must be an http:// or https:// URL")
        return self


class AggregateSpec(_Model):
    """One aggregate column of an ``aggregate`` fold."""

    fn: Literal["count", "sum", "min", "max", "first", "last"]
    field: str | None = None

    @model_validator(mode="after")
    def _field_needed(self) -> AggregateSpec:
        if self.fn != "count" and self.field is None:
            raise ValueError(f"{self.fn} needs field")
        return self


class FoldConfig(_Model):
    """How events of one key combine into the entity."""

    mode: Literal["latest", "merge", "aggregate"] = "latest"
    event_time: str | None = None
    """``latest`` and ``merge``: order events by this field, the offset breaking ties."""
    aggregates: dict[str, AggregateSpec] = Field(default_factory=dict)
    delete_when: str | None = None
    """A Spark SQL condition on an event that deletes the entity."""
    deleted_retention: PositiveDuration = timedelta(days=1)
    """How long a deleted entity's fold state stays in Redis: within it a replayed event
    cannot bring the entity back or count twice; after it the state goes, so a map whose
    keys come and go stays bounded. Replays reach back one batch, so a day is ample."""

    @model_validator(mode="after")
    def _mode_options(self) -> FoldConfig:
        if self.mode == "aggregate" and not self.aggregates:
            raise ValueError("mode aggregate needs aggregates")
        if self.mode != "aggregate" and self.aggregates:
            raise ValueError(f"aggregates do not apply to mode {self.mode}")
        if self.mode == "aggregate" and self.event_time is not None:
            raise ValueError(f"event_time does not apply to mode {self.mode}")
        return self


class DeadLetterConfig(_Model):
    """Where records that cannot be folded go."""

    topic: Annotated[str, Field(min_length=1)]


class ChangelogConfig(_Model):
    """The compacted topic of entity changes that feeds the Delta table."""

    topic: Annotated[str, Field(min_length=1)]


class ChangesConfig(_Model):
    """The capped change stream ``<map>:__changes__``."""

    max_len: Annotated[int, Field(ge=1)] = 100_000


class TtlConfig(_Model):
    """How long an entity nobody updates is kept; Redis and Delta expire independently."""

    redis: PositiveDuration | None = None
    """Each write of a key sets its expiry: a key not written for this long is gone."""
    delta: PositiveDuration | None = None
    """Rows of the table not updated for this long are deleted by the periodic cleanup."""
    cleanup_interval: PositiveDuration = timedelta(hours=1)
    """How often the Delta query runs the retention DELETE (and VACUUM) after its MERGE."""
    vacuum_retention: NonNegativeDuration | None = timedelta(hours=168)
    """VACUUM keeps data files removed this long ago: the time-travel window; null: no VACUUM."""

    @model_validator(mode="after")
    def _something_expires(self) -> TtlConfig:
        if self.redis is None and self.delta is None:
            raise ValueError("give redis, delta or both: how long an entity is kept there")
        return self


class CatchUpConfig(_Model):
    """How a map that is far behind its source logs shows it: a backlog at the first start,
    after a pause or an outage, or a burst it takes a while to fold.

    While a running map has more records left than ``ready_lag`` it reports
    ``catching_up``: its health (``map/<map>``, ``/readyz?map=``) turns
    NOT_SERVING, so read-your-writes callers wait or go elsewhere, while lookups
    keep answering with the watermark that tells how far it is.
    """

    ready_lag: Annotated[int, Field(ge=0)] = 10_000
    """Records left in the map's source partitions (the sum over them) at or below which it
    is ready again; above it, a running map is ``catching_up``. Set it above what a live
    map holds in flight (its input rate times a trigger interval and a batch), or it turns
    ``catching_up`` at every burst."""
    max_records_per_batch: Annotated[int, Field(ge=1)] | None = 100_000
    """While other maps of its run fold live, a map that starts more than ``ready_lag``
    behind folds at most this many records a batch, in a scheduler pool that yields the
    cores to theirs, and waits between its batches while theirs run long; once within
    ``ready_lag`` (or alone) it runs as usual. Small batches bound how long a live map's
    batch waits for a core; a whole backlog folds faster in few big ones. None: no bound."""


class IndexConfig(_Model):
    """One index of the map's entities in Redis: which entities hold a value of ``field``.

    The fold keeps it atomically with every entity it writes, so a filtered read answered
    from it is as fresh as a lookup by key (``materializer.contract.index_entries``).
    Written as the field's name alone for a ``hash`` index.
    """

    field: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00]+$")]
    """A top-level field of the entity; its booleans, numbers and strings are indexed (a
    null, an object or a list is not)."""
    kind: Literal["hash", "sorted"] = "hash"
    """``hash``: equality and ``IN``; ``sorted``: ranges (``<``, ``>=``, ``BETWEEN``) too.
    Both take one entry per entity in Redis."""

    @model_validator(mode="before")
    @classmethod
    def _field_alone(cls, data: object) -> object:
        return {"field": data} if isinstance(data, str) else data


class MapConfig(_Model):
    """One materialized map: its source, key, fold and error handling."""

    source: SourceConfig
    key: Annotated[str, Field(min_length=1)]
    """A top-level field of the decoded value, or ``$kafka_key``."""
    transforms: list[Transform] = Field(default_factory=list)
    fold: FoldConfig = FoldConfig()
    on_error: Literal["dead_letter", "fail", "skip"] = "dead_letter"
    dead_letter: DeadLetterConfig | None = None
    changelog: ChangelogConfig | None = None
    """Defaults to ``<map>.changelog``."""
    history: bool = False
    """Also append every folded event to ``<root>/<map>__events``."""
    changes: ChangesConfig = ChangesConfig()
    ttl: TtlConfig | None = None
    """Expire entities not updated for a while, in Redis and/or the Delta table."""
    catch_up: CatchUpConfig = CatchUpConfig()
    """When the map counts as catching up (not ready for read-your-writes callers)."""
    indexes: list[IndexConfig] = Field(default_factory=list)
    """Fields of the entity kept indexed in Redis, each a field's name (a ``hash`` index) or
    ``{field, kind}``; added or dropped while the map runs, without a rebuild."""
    path: FoldPath | None = None
    """How the map folds once caught up (None: the run's ``spark.path``). ``realtime`` folds
    maps without ``history`` whose errors go to dead letters or are skipped and whose
    records Spark decodes in the JVM (not Avro from a registry, not Protobuf), on one Redis
    server; a map that asks for it otherwise is refused, by key path, and one that leaves it
    to the run's default stays on micro-batches."""

    @field_validator("indexes")
    @classmethod
    def _one_index_a_field(cls, indexes: list[IndexConfig]) -> list[IndexConfig]:
        seen: set[str] = set()
        for index in indexes:
            if index.field in seen:
                raise ValueError(f"field {index.field!r} is indexed twice")
            seen.add(index.field)
        return indexes

    @model_validator(mode="after")
    def _realtime_folds_it(self) -> MapConfig:
        """A map that asks for the real-time path is one it can fold."""
        if self.path == "realtime" and (problems := realtime_problems(self)):
            raise ValueError(realtime_refusal(problems))
        return self

    @model_validator(mode="after")
    def _change_events_fold(self) -> MapConfig:
        """A Debezium map folds rows: its entity is the row (``latest``) or the row's fields
        (``merge``), and its events are ordered by position or by the envelope's times; a
        row's own column cannot order deletes and truncates, which carry none."""
        if self.source.envelope != "debezium":
            return self
        if self.fold.mode == "aggregate":
            raise ValueError(
                "fold.mode: aggregate does not fold change events (a change is the row "
                "after it, not an increment): use latest or merge"
            )
        if self.fold.event_time not in (None, "ts_ms", "source.ts_ms"):
            raise ValueError(
                f"fold.event_time: {self.fold.event_time} is a column of the row, which a "
                "delete or a truncate does not carry: use source.ts_ms (or ts_ms)"
            )
        if any(isinstance(t, ValueToKeyTransform) for t in self.transforms):
            raise ValueError(
                "transforms: value_to_key re-keys rows, which Debezium's deletes (keyed by "
                "the primary key) would then miss"
            )
        return self

    @model_validator(mode="after")
    def _record_key_used(self) -> MapConfig:
        """``value_to_key`` sets the record key, which only ``key: $kafka_key`` reads."""
        for i, t in enumerate(self.transforms):
            if isinstance(t, ValueToKeyTransform) and self.key != KAFKA_KEY:
                raise ValueError(
                    f"transforms.{i}: value_to_key sets the record key, "
                    f"which the map reads only with key: {KAFKA_KEY}"
                )
        return self


DOCUMENT = "_document"
"""The VARIANT column holding each decoded JSON object until the batch types it."""


_NEEDS_SCHEMA = (
    "needs source.schema: json without a schema has typed fields only after the fold, "
    "one micro-batch at a time"
)


def is_inferred(map_config: MapConfig) -> bool:
    """Whether the map's values are JSON without a declared schema."""
    return map_config.source.format == "json" and map_config.source.schema_ is None


def inferred_problems(map_config: MapConfig) -> list[str]:
    """What a map of schemaless JSON declares that needs typed fields, by key path."""
    problems = []
    if map_config.transforms:
        problems.append(f"transforms: {_NEEDS_SCHEMA}")
    fold = map_config.fold
    if fold.mode in ("aggregate", "merge"):
        problems.append(f"fold.mode: {fold.mode} {_NEEDS_SCHEMA}")
    if fold.event_time is not None:
        problems.append(f"fold.event_time: {_NEEDS_SCHEMA}")
    if fold.delete_when is not None:
        problems.append(f"fold.delete_when: {_NEEDS_SCHEMA}")
    if map_config.key == DOCUMENT or map_config.key.startswith(INTERNAL_PREFIX):
        problems.append(f"key: {map_config.key!r} is a name the pipeline keeps for its own")
    elif map_config.key != KAFKA_KEY and "'" in map_config.key and '"' in map_config.key:
        problems.append("key: a field name may hold either quote character, not both")
    return problems


def realtime_problems(map_config: MapConfig) -> list[str]:
    """Why the real-time path cannot fold the map (empty: it can). A map that asks for it
    is refused; with ``spark.path: realtime`` such a map stays on micro-batches."""
    problems = []
    if map_config.history:
        problems.append("it writes no history (history: true)")
    if map_config.on_error == "fail":
        problems.append("it sends failed records to dead letters or skips them (on_error: fail)")
    src = map_config.source
    if src.format == "protobuf" or (src.format == "avro" and not src.schema_file):
        problems.append(
            f"it decodes {src.format} in Python (mapInArrow), which Spark's Real-time Mode "
            "does not run (source.format)"
        )
    return problems


def realtime_refusal(problems: list[str]) -> str:
    """The message that refuses ``path: realtime`` for ``problems`` (``realtime_problems``)."""
    return "path: realtime cannot fold this map: " + "; ".join(problems)
