"""The connection sections: Kafka (with its security), Redis, Delta, the object store, Spark."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from materializer.config.base import FoldPath, _Model
from materializer.config.durations import NonNegativeDuration, PositiveDuration
from materializer.errors import ConfigError


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
    commits and the query service's status reads (``materializer.clients.kafka``)."""

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
    slot, so a map spreads over every master (``materializer.clients.redis``)."""

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
    trigger_interval: NonNegativeDuration = timedelta(seconds=5)
    """How often each map's table takes in the changelog: fewer, bigger MERGEs as it grows.
    Lookups never wait for it; Redis is written by the fold itself."""
    merge_engine: Literal["delta_rs", "spark"] = "delta_rs"
    """Who MERGEs a batch of changes into the table. ``delta_rs``: the driver, from the
    batch's last change per key as Arrow; it takes a small fraction of Spark's time and
    CPU (docs/decisions/0008-delta-merge-by-delta-rs.md), which the fold then has for
    itself. ``spark``:
    the executors, for a map whose batches of changes the driver cannot hold in memory."""
    max_changes_per_batch: Annotated[int, Field(gt=0)] = 1_000_000
    """At most this many changelog records per MERGE (or ``spark.max_offsets_per_trigger``
    if smaller); a longer backlog (a rebuild, a restart after a long stop) is taken in
    several. Bounds the driver's memory with ``delta_rs``: the batch's entities must fit
    in ``spark.driver.maxResultSize`` (1 GiB unless ``spark.conf`` says otherwise). A batch
    is fixed once planned, so one that does not fit is replayed as it is: raise that
    setting or run it with ``merge_engine: spark``."""


class ObjectStoreConfig(_Model):
    """An S3 API (AWS, or a compatible server) holding ``delta.root`` and
    ``spark.checkpoint_root`` when they are ``s3a://`` URLs. Spark writes through
    hadoop-aws; the query service, ``rehydrate`` and ``verify`` read through delta-rs, both
    with these settings (``materializer.clients.object_store``). Without keys, each uses the AWS
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
    trigger_interval: NonNegativeDuration = timedelta(milliseconds=100)
    """Cadence of the folds (and enrichments): a record waits up to this long for the batch
    that takes it, so it bounds freshness from below; an idle poll is one offsets request."""
    side_trigger_interval: NonNegativeDuration = timedelta(seconds=5)
    """Unused: dead letters and history are written by the fold's own query, at its cadence.
    Accepted so that configurations written for earlier versions still load."""
    shuffle_partitions: Annotated[int, Field(ge=1)] = 4
    stop_timeout: NonNegativeDuration = timedelta(seconds=100)
    """How long a stop (SIGTERM, Ctrl-C) may take: the folds finish their batches, then the
    Delta tables take in the changelog up to them (the chart's grace period is this plus
    20 s); what the timeout cuts short is logged, and the next start replays it. In a
    worker group a stopping worker leaves the group after it."""
    max_offsets_per_trigger: Annotated[int, Field(ge=1)] | None = None
    path: FoldPath = "realtime"
    """How the run's maps fold once caught up (a map's own ``path`` wins): ``realtime``,
    the caught-up maps share queries in Spark's Real-time Mode whose writers fold each
    record as it arrives, milliseconds behind Kafka; ``microbatch``, each map's query folds
    a batch per trigger, a few hundred milliseconds behind, for a map that needs what only
    it does (``history``, ``on_error: fail``, Avro from a registry, Protobuf and a Redis
    cluster stay there by themselves)
    (docs/decisions/0032-the-live-path-in-real-time-mode.md). A map catches up in
    micro-batches on either path."""
    live_slots: Annotated[int, Field(ge=1)] = 128
    """On a ``local[*]`` master, the task slots added for the real-time queries, which hold
    one per source partition of their maps the whole time (a slot is a thread that waits on
    Kafka, not a core); a map whose partitions would not fit stays on micro-batches."""
    live_maps_per_query: Annotated[int, Field(ge=1)] = 8
    """How many maps share one real-time query at most. Each of a query's tasks holds the
    whole query's plan, so its memory grows with its maps times its partitions; a map
    joining or leaving restarts its own query only, a pause of that query's maps alone
    (and of every map's Delta table, which all the path's maps share one query for)."""
    live_commit_interval: PositiveDuration = timedelta(seconds=1)
    """How often at most each task of the real-time query commits its Kafka transaction:
    the map's changelog (hence its Delta table) and dead letters trail Redis by up to this
    much; Redis never waits for it. Each task commits its own, so the broker takes one
    transaction an interval per source partition: at 100 ms, sixteen maps of four
    partitions cost the broker a third of a core more and the maps twice their p99."""
    jars: Literal["shipped", "installed"] = "shipped"
    """How executors get the Kafka, Delta (and S3) jars: ``shipped``, Spark copies them from
    the driver to each executor as it starts (about 700 MB with the S3 jars); ``installed``,
    every executor has them at the driver's paths already (one container image for both,
    as the chart runs), so they go on the class paths and nothing is copied. A ``local``
    master's executors are the driver's JVM, which has them on its class path either way."""
    conf: dict[str, str] = Field(default_factory=dict)
