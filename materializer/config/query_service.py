"""The query service's section: listening, auth, TLS, near cache, enrichment profiles, metrics."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import (
    Field,
    model_validator,
)

from materializer.config.base import _Model
from materializer.config.durations import NonNegativeDuration, PositiveDuration


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


class ConsoleConfig(_Model):
    """The web console on the HTTP port: pages for operators, behind the same tokens."""

    enabled: bool = True
    base_path: Annotated[str, Field(pattern=r"^(/[A-Za-z0-9._~-]+)+$")] = "/ui"
    """Where the pages live on the HTTP port; behind an ingress that routes a prefix, that
    prefix (no trailing slash)."""
    session: PositiveDuration = timedelta(hours=12)
    """How long a login lasts; a session is kept in Redis, so every replica knows it."""
    secure_cookie: bool | None = None
    """Whether the session cookie is sent over HTTPS only; by default, when ``query.tls`` is
    on. Set it to true behind an ingress or proxy that terminates TLS."""
    allowed_origins: list[Annotated[str, Field(pattern=r"^https?://[^/\s]+$")]] = Field(
        default_factory=list
    )
    """Origins (``https://console.example.com``) whose forms may change something besides the
    address the request names: the public address, behind a proxy that rewrites ``Host``."""


class SqlConfig(_Model):
    """SQL over the maps' Delta tables: read-only statements, each bounded.

    Statements run in processes of their own (``workers`` of them, started at the
    first statement), so one past its deadline is stopped by ending its process and
    the service keeps serving.
    """

    enabled: bool = True
    workers: Annotated[int, Field(ge=1, le=64)] = 2
    """Statements running at once in one query-service process; each has its own process."""
    max_queued: Annotated[int, Field(ge=0)] = 16
    """Statements that may wait for a worker; beyond it RESOURCE_EXHAUSTED."""
    max_rows: Annotated[int, Field(ge=1)] = 100_000
    """Rows one answer may hold; a statement returning more ends with RESOURCE_EXHAUSTED
    (a request's ``limit`` cuts the answer short instead)."""
    timeout: PositiveDuration = timedelta(seconds=30)
    """The longest a statement runs, whatever the caller's deadline; then DEADLINE_EXCEEDED."""
    memory_bytes: Annotated[int, Field(ge=1 << 20)] = 256 << 20
    """The engine's memory pool per statement (joins, aggregates, sorts); a statement
    that needs more is RESOURCE_EXHAUSTED. Nothing spills to disk."""
    flight_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """Arrow Flight SQL on this port, with the tokens and TLS of the gRPC port; 0: off."""


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
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    """The web console, served on ``http_port`` when that is on."""
    sql: SqlConfig = Field(default_factory=SqlConfig)
    """SQL over the maps' tables (gRPC, HTTP, Arrow Flight SQL)."""


MAX_HISTORY_SAMPLES = 1_000_000
"""The most samples a map's history may keep (``retention / interval``): about 100 MB of
Redis per map (docs/operations.md#history)."""


class HistoryConfig(_Model):
    """Each map's figures over time, for the web console's charts: ``materializer run``
    appends a sample per map every ``interval`` to the capped stream ``<map>:__history__``."""

    interval: NonNegativeDuration = timedelta(seconds=5)
    """How often each running map is sampled; 0 turns the history off."""
    retention: PositiveDuration = timedelta(hours=24)
    """How long samples are kept: the stream is capped at ``retention / interval`` samples
    (trimmed in whole nodes of the stream, so up to about 100 more are kept)."""

    @model_validator(mode="after")
    def _bounded(self) -> HistoryConfig:
        if self.interval == timedelta(0):
            return self
        if self.interval < timedelta(seconds=1):
            raise ValueError("interval: must be 0 (no history) or at least 1 second")
        if self.retention < self.interval:
            raise ValueError(
                f"retention: must be at least the interval ({self.interval.total_seconds():g} s)"
            )
        if self.max_len > MAX_HISTORY_SAMPLES:
            raise ValueError(
                f"retention / interval: {self.max_len} samples per map, more than "
                f"{MAX_HISTORY_SAMPLES}: keep less or sample less often"
            )
        return self

    @property
    def max_len(self) -> int:
        """The samples a map's history keeps; 0 when it is off."""
        if self.interval == timedelta(0):
            return 0
        return math.ceil(self.retention / self.interval)


class MetricsConfig(_Model):
    """Prometheus metrics of ``materializer run`` (batches, rows, lag, freshness) over HTTP."""

    host: str = "0.0.0.0"  # noqa: S104 - scraped from the pod network
    port: Annotated[int, Field(ge=0, le=65535)] = 9465
    """``/metrics`` on this port; 0 turns it off."""
    state_interval: PositiveDuration = timedelta(minutes=1)
    """How often each map's fold state is counted (a ``SCAN`` of the keyspace) for status and
    metrics."""
    history: HistoryConfig = HistoryConfig()
    """Each map's figures over time in Redis (docs/operations.md#history)."""
