"""The YAML configuration: one file declares the connections and the maps.

Every model forbids unknown keys, so a typo is an error that names its key path
rather than a setting silently ignored.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from materializer.errors import ConfigError

INTERNAL_PREFIX = "__"
"""Column names the pipeline adds start with it; no entity field or key may."""
KAFKA_KEY = "$kafka_key"
_MAP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$")
_DURATION_UNITS: dict[str, float] = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("", "s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}
_DURATION_FORM = (
    'must be a duration such as "30 minutes", "500 ms", "1.5 hours" or a number of seconds '
    "(units: ms, s, m, h, d, or their words)"
)


def _duration(value: Any) -> Any:
    """A human duration (``"30 minutes"``) or a number of seconds, as a ``timedelta``."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(_DURATION_FORM)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value.lower())):
        unit = _DURATION_UNITS.get(match.group(2))
        if unit is None:
            raise ValueError(f"unknown unit {match.group(2)!r}: {_DURATION_FORM}")
        seconds = float(match.group(1)) * unit
    else:
        raise ValueError(_DURATION_FORM)
    try:
        return timedelta(seconds=seconds)
    except (OverflowError, ValueError):  # inf, nan, beyond timedelta's 999,999,999 days
        raise ValueError(_DURATION_FORM) from None


Duration = Annotated[timedelta, BeforeValidator(_duration)]
"""A ``timedelta`` written as ``"30 minutes"``, ``"2 s"``, ``"500 ms"`` or seconds (``90``)."""


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be more than 0")
    return value


PositiveDuration = Annotated[Duration, AfterValidator(_positive)]
"""A ``Duration`` of more than nothing."""


class Secret(_Model):
    """A credential: read from the environment or a file when a client needs it, so the
    config file (a ConfigMap, a repository) never holds it. ``value`` (or a plain string
    in YAML) is for local runs. Its repr and every log line show only where it comes from.
    """

    env: str | None = None
    file: str | None = None
    value: SecretStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _plain_string(cls, data: Any) -> Any:
        return {"value": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _one_source_that_exists(self) -> Secret:
        given = [name for name in ("env", "file", "value") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of env, file or value")
        return self

    def reveal(self, key_path: str) -> str:
        """The secret itself, for a client's settings only. Read when needed, not when the
        file is parsed: ``validate`` runs where the secrets are not mounted."""
        if self.env is not None:
            if self.env not in os.environ:
                raise ConfigError(
                    key_path, [f"{key_path}: environment variable {self.env} is not set"]
                )
            return os.environ[self.env]
        if self.file is not None:
            return read_config_file(self.file, key_path).strip()
        assert self.value is not None
        return self.value.get_secret_value()

    def __repr__(self) -> str:
        return (
            f"Secret(env={self.env!r})"
            if self.env
            else f"Secret(file={self.file!r})"
            if self.file
            else "Secret(value=***)"
        )


class SaslConfig(_Model):
    """SASL over the brokers' listener: a user name and its password."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    username: str = Field(min_length=1)
    password: Secret


def read_config_file(path: str, key_path: str) -> str:
    """A file a setting names (a certificate, a secret), or an error naming the setting."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(key_path, [f"{key_path}: cannot read {path}: {exc.strerror}"]) from None


class KafkaSecurity(_Model):
    """TLS and SASL for every Kafka client the product runs: Spark's source and writers,
    dead letters, the changelog, transactional outputs, admin calls, consumer-group
    commits and the query service's status reads (``materializer.contract.kafka_clients``)."""

    tls: bool | None = None
    """Encrypt the connections; on by default when ``ca_file`` or ``cert_file`` is set."""
    ca_file: str | None = None
    """PEM certificates of the authorities that signed the brokers' (default: the system's)."""
    cert_file: str | None = None
    """PEM client certificate, for brokers that require mutual TLS; with ``key_file``."""
    key_file: str | None = None
    key_password: Secret | None = None
    sasl: SaslConfig | None = None

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if self.tls is False and (self.ca_file or self.cert_file):
            raise ValueError("ca_file and cert_file need tls")
        return self

    @property
    def uses_tls(self) -> bool:
        """Whether connections are encrypted."""
        return self.tls if self.tls is not None else bool(self.ca_file or self.cert_file)

    @property
    def protocol(self) -> str:
        """Kafka's ``security.protocol`` for these settings."""
        if self.sasl is not None:
            return "SASL_SSL" if self.uses_tls else "SASL_PLAINTEXT"
        return "SSL" if self.uses_tls else "PLAINTEXT"


class KafkaConfig(_Model):
    """Where the brokers are and how to reach them; ``properties`` pass to every Kafka
    client as they are (timeouts, tuning), after what ``security`` sets."""

    bootstrap_servers: str = "localhost:9092"
    security: KafkaSecurity | None = None
    properties: dict[str, str] = Field(default_factory=dict)


class RedisConfig(_Model):
    """The Redis server, or Redis Cluster, holding the maps."""

    url: str = "redis://localhost:6379/0"
    cluster: bool = False
    """The URL names one node of a Redis Cluster: each entity key lands in its own hash
    slot, so a map spreads over every master (``materializer.contract.redis_client``)."""

    @model_validator(mode="after")
    def _cluster_has_database_zero(self) -> RedisConfig:
        database = urlsplit(self.url).path.strip("/")
        if self.cluster and database not in ("", "0"):
            raise ValueError(
                f"url: a Redis Cluster has database 0 only, and the URL selects {database}"
            )
        return self


class DeltaConfig(_Model):
    """Where the Delta tables live: ``<root>/<map>``."""

    root: str = "./warehouse"
    trigger_interval: str = "5 seconds"
    """How often each map's table takes in the changelog: fewer, bigger MERGEs as it grows.
    Lookups never wait for it; Redis is written by the fold itself."""


class ObjectStoreConfig(_Model):
    """An S3 API (AWS, or a compatible server) holding ``delta.root`` and
    ``spark.checkpoint_root`` when they are ``s3a://`` URLs. Spark writes through
    hadoop-aws; the query service, ``rehydrate`` and ``verify`` read through delta-rs, both
    with these settings (``materializer.contract.object_store``). Without keys, each uses the AWS
    default chain (environment, profile, the node's or pod's role)."""

    endpoint: str | None = None
    """``http(s)://host:port`` of an S3-compatible server; None for AWS itself."""
    region: str = "us-east-1"
    path_style: bool = False
    """Buckets in the path (``endpoint/bucket/key``), as most compatible servers want."""
    access_key_id: Secret | None = None
    secret_access_key: Secret | None = None

    @field_validator("endpoint")
    @classmethod
    def _endpoint_url(cls, endpoint: str | None) -> str | None:
        if endpoint is not None and not re.match(r"^https?://[^/\s]+/?$", endpoint):
            raise ValueError("must be http(s)://host[:port]")
        return endpoint

    @model_validator(mode="after")
    def _both_keys(self) -> ObjectStoreConfig:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("access_key_id and secret_access_key go together")
        return self


OBJECT_STORE_SCHEMES = ("s3a://", "s3://")


class SparkConfig(_Model):
    """The Spark session and the streaming queries' cadence and checkpoints."""

    master: str = "local[*]"
    checkpoint_root: str = "./checkpoints"
    trigger_interval: str = "100 milliseconds"
    """Cadence of the folds (and enrichments): a record waits up to this long for the batch
    that takes it, so it bounds freshness from below; an idle poll is one offsets request."""
    side_trigger_interval: str = "5 seconds"
    """Unused: dead letters and history are written by the fold's own query, at its cadence.
    Accepted so that configurations written for earlier versions still load."""
    shuffle_partitions: Annotated[int, Field(ge=1)] = 4
    stop_timeout: Duration = timedelta(seconds=100)
    """How long a stop (SIGTERM, Ctrl-C) may take: the folds finish their batches, then the
    Delta tables take in the changelog up to them. Within the chart's grace period (120 s);
    what the timeout cuts short is logged, and the next start replays it."""
    max_offsets_per_trigger: Annotated[int, Field(ge=1)] | None = None
    jars: Literal["shipped", "installed"] = "shipped"
    """How executors get the Kafka, Delta (and S3) jars: ``shipped``, Spark copies them from
    the driver to each executor as it starts (about 700 MB with the S3 jars); ``installed``,
    every executor has them at the driver's paths already (one container image for both,
    as the chart runs), so they go on the class paths and nothing is copied."""
    conf: dict[str, str] = Field(default_factory=dict)


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
        if several != bool(self.record_types):
            raise ValueError(
                "record_types lists the record types of subject_name_strategy record or "
                "topic_record, and only of those"
            )
        url = self.schema_registry_url
        if url is not None and not re.match(r"^https?://[^/\s]+", url):
            raise ValueError("schema_registry_url must be an http:// or https:// URL")
        return self


class FilterTransform(_Model):
    """Keep records for which a Spark SQL condition holds."""

    type: Literal["filter"]
    condition: Annotated[str, Field(min_length=1)]


class RenameTransform(_Model):
    """Rename fields: ``{old: new}``."""

    type: Literal["rename"]
    fields: Annotated[dict[str, str], Field(min_length=1)]


class DropTransform(_Model):
    """Remove the listed fields."""

    type: Literal["drop"]
    fields: Annotated[list[str], Field(min_length=1)]


class KeepTransform(_Model):
    """Keep only the listed fields."""

    type: Literal["keep"]
    fields: Annotated[list[str], Field(min_length=1)]


class MaskTransform(_Model):
    """Replace values with the empty value of their type ("" , 0, false, empty array)."""

    type: Literal["mask"]
    fields: Annotated[list[str], Field(min_length=1)]


class CastTransform(_Model):
    """Cast fields to Spark SQL types: ``{field: type}``; a failed cast is a transform error."""

    type: Literal["cast"]
    fields: Annotated[dict[str, str], Field(min_length=1)]


class FlattenTransform(_Model):
    """Nested structs become top-level fields joined by ``delimiter``."""

    type: Literal["flatten"]
    delimiter: str = "."


class TimestampConvertTransform(_Model):
    """Convert a field between epoch milliseconds, formatted strings and timestamps."""

    type: Literal["timestamp_convert"]
    field: str
    target: Literal["timestamp", "string", "unix_millis", "date"] = "timestamp"
    format: str | None = None
    """A datetime pattern, used to parse strings and to format ``string`` targets."""


class ValueToKeyTransform(_Model):
    """The record key becomes the listed value field (or a JSON object of several)."""

    type: Literal["value_to_key"]
    fields: Annotated[list[str], Field(min_length=1)]


class ExtractFieldTransform(_Model):
    """The value becomes the fields of one struct field."""

    type: Literal["extract_field"]
    field: str


class InsertFieldTransform(_Model):
    """Add a field with a static value or the record's topic/partition/offset/timestamp."""

    type: Literal["insert_field"]
    field: str
    value: str | int | float | bool | None = None
    from_: Annotated[
        Literal["topic", "partition", "offset", "timestamp"] | None, Field(alias="from")
    ] = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _one_source(self) -> InsertFieldTransform:
        if (self.value is None) == (self.from_ is None):
            raise ValueError("give exactly one of value, from")
        return self


class ComputeTransform(_Model):
    """Set fields from Spark SQL expressions: ``{field: expression}``."""

    type: Literal["compute"]
    fields: Annotated[dict[str, str], Field(min_length=1)]


Transform = Annotated[
    FilterTransform
    | RenameTransform
    | DropTransform
    | KeepTransform
    | MaskTransform
    | CastTransform
    | FlattenTransform
    | TimestampConvertTransform
    | ValueToKeyTransform
    | ExtractFieldTransform
    | InsertFieldTransform
    | ComputeTransform,
    Field(discriminator="type"),
]
TRANSFORM_TYPES = frozenset(
    t.model_fields["type"].annotation.__args__[0]  # type: ignore[union-attr]
    for t in (
        FilterTransform,
        RenameTransform,
        DropTransform,
        KeepTransform,
        MaskTransform,
        CastTransform,
        FlattenTransform,
        TimestampConvertTransform,
        ValueToKeyTransform,
        ExtractFieldTransform,
        InsertFieldTransform,
        ComputeTransform,
    )
)


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
    vacuum_retention: Duration | None = timedelta(hours=168)
    """VACUUM keeps data files removed this long ago: the time-travel window; null: no VACUUM."""

    @field_validator("vacuum_retention")
    @classmethod
    def _not_negative(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < timedelta(0):
            raise ValueError("must be 0 or more")
        return value

    @model_validator(mode="after")
    def _something_expires(self) -> TtlConfig:
        if self.redis is None and self.delta is None:
            raise ValueError("give redis, delta or both: how long an entity is kept there")
        return self


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


class NearCacheConfig(_Model):
    """An in-process LRU of one map's entities in each query-service process."""

    max_entries: Annotated[int, Field(ge=1)] = 10_000


class LookupConfig(_Model):
    """One lookup of an enrichment profile: the entity keyed by an event field."""

    map: Annotated[str, Field(min_length=1)]
    key_field: Annotated[str, Field(min_length=1)]
    """A top-level member of the event, or a dotted path into nested objects."""
    alias: str | None = None
    """Where the entity goes in the event; defaults to the map's name."""
    fields: list[str] = Field(default_factory=list)
    join: Literal["left", "inner"] = "left"
    on_miss: Literal["null", "omit", "error"] = "null"


class EnrichProfileConfig(_Model):
    """A named join that Enrich requests refer to instead of spelling it out."""

    lookups: Annotated[list[LookupConfig], Field(min_length=1)]


class EnrichmentLookupConfig(LookupConfig):
    """A lookup of a streaming enrichment: as Enrich's, and a miss may drop or dead-letter."""

    on_miss: Literal["null", "omit", "drop", "dead_letter"] = "null"  # type: ignore[assignment]
    """``null``: pass the event with the alias null; ``omit``: without it; ``drop``: leave
    the event out (as ``join: inner``); ``dead_letter``: to the dead-letter topic."""

    @model_validator(mode="after")
    def _inner_drops(self) -> EnrichmentLookupConfig:
        if self.join == "inner" and self.on_miss not in ("null", "drop"):
            raise ValueError(
                f"on_miss: join inner drops an event whose lookup misses; "
                f"{self.on_miss} applies to left joins"
            )
        return self


class EnrichmentOutputConfig(_Model):
    """Where enriched events go, keyed how, with which delivery guarantee."""

    topic: Annotated[str, Field(min_length=1)]
    key: Annotated[str, Field(min_length=1)] = KAFKA_KEY
    """``$kafka_key`` (the input record's key) or a member of the enriched event (a dotted
    path into nested objects, ``user.id`` say)."""
    format: Literal["json"] = "json"
    """Compact UTF-8 JSON, the entities embedded as the maps store them."""
    guarantee: Literal["at_least_once", "exactly_once"] = "at_least_once"
    """``exactly_once``: one Kafka transaction per batch with the batch's input offsets;
    ``read_committed`` consumers see each output once, after the batch commits."""
    transaction_timeout_ms: Annotated[int, Field(ge=1000, le=900_000)] = 60_000
    """``exactly_once``: the broker aborts a transaction left open this long (a crashed run)."""


class EnrichmentConfig(_Model):
    """A streaming enrichment: events of a topic joined with maps, written to a topic."""

    source: SourceConfig
    transforms: list[Transform] = Field(default_factory=list)
    """Applied before the lookups, e.g. ``compute`` to derive a lookup key."""
    lookups: Annotated[list[EnrichmentLookupConfig], Field(min_length=1)]
    lookups_from: Literal["redis", "delta"] = "redis"
    """``redis``: the live maps, read in batches per Spark partition; ``delta``: a join
    with each map's Delta table as of each batch, for backfills of a long history."""
    output: EnrichmentOutputConfig
    dead_letter: DeadLetterConfig | None = None
    """Defaults to ``<enrichment>.dlq``: undecodable events and ``on_miss: dead_letter``."""

    @model_validator(mode="after")
    def _delta_keys_from_event(self) -> EnrichmentConfig:
        """A table join is planned before any entity is read: keys must be the event's own."""
        if self.lookups_from == "delta":
            aliases: set[str] = set()
            for i, lookup in enumerate(self.lookups):
                if lookup.key_field.split(".")[0] in aliases:
                    raise ValueError(
                        f"lookups.{i}.key_field: with lookups_from delta, keys come from the "
                        "event itself, not from an earlier lookup's entity"
                    )
                aliases.add(lookup.alias or lookup.map)
        return self

    @model_validator(mode="after")
    def _transforms_need_schema(self) -> EnrichmentConfig:
        """Without a schema, events go to the join as the JSON they are, never as columns."""
        if self.transforms and self.source.format == "json" and self.source.schema_ is None:
            raise ValueError(
                "transforms: need source.schema (JSON events without one are joined as they are)"
            )
        return self

    def as_map(self) -> MapConfig:
        """The source and transforms as a map would have them: the decoders take a map."""
        return MapConfig(source=self.source, key=KAFKA_KEY, transforms=self.transforms)


class AuthConfig(_Model):
    """Bearer tokens, each allowed some maps and verbs; read from a file or the environment.

    The tokens document (YAML or JSON) is ``{tokens: [{token, maps, verbs}]}``,
    ``maps`` and ``verbs`` as lists, ``"*"`` for all.
    """

    tokens_file: str | None = None
    tokens_env: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> AuthConfig:
        if (self.tokens_file is None) == (self.tokens_env is None):
            raise ValueError("give exactly one of tokens_file, tokens_env")
        return self


class TlsConfig(_Model):
    """TLS for the query service; ``client_ca_file`` turns on mutual TLS."""

    cert_file: Annotated[str, Field(min_length=1)]
    key_file: Annotated[str, Field(min_length=1)]
    client_ca_file: str | None = None


class QueryConfig(_Model):
    """The query service: gRPC, and its HTTP/JSON front."""

    host: str = "0.0.0.0"  # noqa: S104 - a service in a pod listens on all interfaces
    port: Annotated[int, Field(ge=0, le=65535)] = 50051
    http_port: Annotated[int, Field(ge=0, le=65535)] = 8080
    """The HTTP/JSON front on the same host; 0 turns it off."""
    max_batch_keys: Annotated[int, Field(ge=1)] = 10_000
    """Keys per BatchGet; beyond it RESOURCE_EXHAUSTED."""
    near_cache: dict[str, NearCacheConfig] = Field(default_factory=dict)
    """Maps with a near cache; none by default."""
    enrich_profiles: dict[str, EnrichProfileConfig] = Field(default_factory=dict)
    auth: AuthConfig | None = None
    tls: TlsConfig | None = None
    metrics_port: Annotated[int, Field(ge=0, le=65535)] | None = 9464
    """Prometheus metrics over HTTP; null turns them off."""


class MetricsConfig(_Model):
    """Prometheus metrics of ``materializer run`` (batches, rows, lag, freshness) over HTTP."""

    host: str = "0.0.0.0"  # noqa: S104 - scraped from the pod network
    port: Annotated[int, Field(ge=0, le=65535)] = 9465
    """``/metrics`` on this port; 0 turns it off."""
    state_interval: PositiveDuration = timedelta(minutes=1)
    """How often each map's fold state is counted (a ``SCAN`` of the keyspace) for status and
    metrics."""


class AppConfig(_Model):
    """The whole file."""

    kafka: KafkaConfig = KafkaConfig()
    redis: RedisConfig = RedisConfig()
    delta: DeltaConfig = DeltaConfig()
    spark: SparkConfig = SparkConfig()
    query: QueryConfig = QueryConfig()
    metrics: MetricsConfig = MetricsConfig()
    object_store: ObjectStoreConfig | None = None
    maps: dict[str, MapConfig] = Field(default_factory=dict)
    enrichments: dict[str, EnrichmentConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _object_store_declared(self) -> AppConfig:
        """An s3a:// root needs the S3 settings (``{}`` takes AWS's defaults): a root that
        silently used other credentials than the query service would split the data."""
        for key, root in (
            ("delta.root", self.delta.root),
            ("spark.checkpoint_root", self.spark.checkpoint_root),
        ):
            if root.startswith(OBJECT_STORE_SCHEMES) and self.object_store is None:
                raise ValueError(
                    f"{key}: {root} is in an object store: declare object_store (endpoint, "
                    "region, path_style, keys; {} for AWS's defaults)"
                )
            if root.startswith("s3://"):
                raise ValueError(f"{key}: write s3a:// (Hadoop's S3 client), not s3://")
        return self

    @model_validator(mode="after")
    def _own_topics(self) -> AppConfig:
        """A changelog topic feeds one map's Delta table, so no two maps may share one, and
        no map may write its changelog or dead letters into a topic it reads."""
        problems = []
        owner: dict[str, str] = {}
        for name, m in self.maps.items():
            changelog = m.changelog.topic if m.changelog else f"{name}.changelog"
            if changelog in owner:
                problems.append(
                    f"maps.{name}.changelog.topic: {changelog!r} is already map "
                    f"{owner[changelog]}'s changelog"
                )
            owner.setdefault(changelog, name)
            if changelog in m.source.topics:
                problems.append(f"maps.{name}.changelog.topic: {changelog!r} is a source topic")
            if m.dead_letter and m.dead_letter.topic in m.source.topics:
                problems.append(
                    f"maps.{name}.dead_letter.topic: {m.dead_letter.topic!r} is a source topic"
                )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @model_validator(mode="after")
    def _query_maps_declared(self) -> AppConfig:
        """Maps that lookups and near caches name must be declared, or a typo would go
        unnoticed; enrichments need names and topics of their own."""
        problems = [
            f"query.near_cache.{name}: no such map"
            for name in self.query.near_cache
            if name not in self.maps
        ]
        lookups = [
            (f"query.enrich_profiles.{profile}", spec.lookups)
            for profile, spec in self.query.enrich_profiles.items()
        ] + [(f"enrichments.{name}", spec.lookups) for name, spec in self.enrichments.items()]
        for where, specs in lookups:
            for i, lookup in enumerate(specs):
                if lookup.map not in self.maps:
                    problems.append(f"{where}.lookups.{i}.map: no such map {lookup.map!r}")
        problems += [
            f"enrichments.{name}: a map has this name (they share checkpoints and metrics)"
            for name in self.enrichments
            if name in self.maps
        ]
        for name, spec in self.enrichments.items():
            if spec.output.topic in spec.source.topics:
                problems.append(
                    f"enrichments.{name}.output.topic: {spec.output.topic!r} is a source topic"
                )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @field_validator("maps", "enrichments")
    @classmethod
    def _map_names(cls, jobs: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        kind = "map" if info.field_name == "maps" else "enrichment"
        for name in jobs:
            if not _MAP_NAME.match(name):
                raise ValueError(f"{kind} name {name!r} must match {_MAP_NAME.pattern}")
        return jobs

    @model_validator(mode="after")
    def _near_cache_sees_no_expiry(self) -> AppConfig:
        """A near cache is invalidated by the change stream, which a Redis expiry never enters:
        it would go on serving the keys ``ttl.redis`` expired."""
        problems = [
            f"query.near_cache.{name}: map {name} has ttl.redis, and the near cache would keep "
            "serving the keys Redis expired"
            for name, m in self.maps.items()
            if name in self.query.near_cache and m.ttl is not None and m.ttl.redis is not None
        ]
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def map(self, name: str) -> MapConfig:
        """The named map, or a ConfigError that lists the ones that exist."""
        try:
            return self.maps[name]
        except KeyError:
            known = ", ".join(sorted(self.maps)) or "none"
            raise ConfigError("", [f"maps.{name}: no such map (known: {known})"]) from None


# Environment variables that override connection settings, so one file serves
# every environment (a container sets them; tests point them at their services).
ENV_OVERRIDES: dict[str, tuple[str, str]] = {
    "MATERIALIZER_KAFKA_BOOTSTRAP_SERVERS": ("kafka", "bootstrap_servers"),
    "MATERIALIZER_REDIS_URL": ("redis", "url"),
    "MATERIALIZER_DELTA_ROOT": ("delta", "root"),
    "MATERIALIZER_SPARK_MASTER": ("spark", "master"),
    "MATERIALIZER_CHECKPOINT_ROOT": ("spark", "checkpoint_root"),
    "MATERIALIZER_QUERY_PORT": ("query", "port"),
}


def _key_path(loc: tuple[int | str, ...]) -> str:
    """``maps.users.transforms.0.fields``: the union tag pydantic inserts is left out."""
    parts: list[str] = []
    for i, part in enumerate(loc):
        if i and isinstance(loc[i - 1], int) and part in TRANSFORM_TYPES:
            continue
        parts.append("schema" if part == "schema_" else str(part))
    return ".".join(parts)


def _message(error: Any) -> str:
    """Pydantic's message in the words of a config file's reader."""
    kind = error["type"]
    if kind == "literal_error":
        choices = error["ctx"]["expected"].replace("'", "").replace(" or ", ", ")
        return f"must be one of {choices}"
    if kind == "union_tag_invalid":
        choices = error["ctx"]["expected_tags"].replace("'", "")
        return f"unknown type {error['ctx']['tag']!r}: must be one of {choices}"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def parse_config(data: Any, source: str = "<config>") -> AppConfig:
    """Validate a decoded document; every problem is reported with its key path."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, ["<root>: must be a mapping"])
    for var, (section, key) in ENV_OVERRIDES.items():
        if var in os.environ:
            data.setdefault(section, {})
            if isinstance(data[section], dict):
                data[section][key] = os.environ[var]
    try:
        return AppConfig.model_validate(data)
    except ValidationError as exc:
        problems = [problem for e in exc.errors() for problem in _problems(e)]
        raise ConfigError(source, problems) from None


_RELATIVE_PATH = re.compile(r"^([A-Za-z_][\w.-]*): ")


def _problems(error: Any) -> list[str]:
    """``key.path: message`` lines. A validator that checks several keys at once words each
    line as ``relative.path: message``, which is joined to where the validator sits."""
    path = _key_path(error["loc"])
    out = []
    for line in _message(error).splitlines():
        relative = _RELATIVE_PATH.match(line) if error["type"] == "value_error" else None
        if relative:
            line = (
                f"{'.'.join(p for p in (path, relative.group(1)) if p)}: {line[relative.end() :]}"
            )
        else:
            line = f"{path or '<root>'}: {line}"
        out.append(line)
    return out


def load_config(path: str | Path) -> AppConfig:
    """Read and validate a YAML file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), [f"<file>: cannot read: {exc.strerror}"]) from None
    return parse_config_text(text, str(p))


def parse_config_text(text: str, source: str = "<config>") -> AppConfig:
    """Validate a YAML (or JSON) document given as text."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"<file>: not valid YAML: {exc}"]) from None
    return parse_config(data, source)


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


def config_problems(config: AppConfig) -> list[str]:
    """Checks that need more than one key at a time, made before any map starts.

    ``materializer validate`` and the admin API report these along with the
    model's own, so both give the same answer for the same file.
    """
    return [
        f"maps.{name}.{problem}"
        for name, map_config in config.maps.items()
        if is_inferred(map_config)
        for problem in inferred_problems(map_config)
    ]


def validate_text(text: str, source: str = "<config>") -> list[str]:
    """Every problem of a configuration document, each with its key path; empty when valid."""
    try:
        config = parse_config_text(text, source)
    except ConfigError as exc:
        return exc.problems
    return config_problems(config)
