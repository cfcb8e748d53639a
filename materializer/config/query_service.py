"""The query service's section: listening, auth, TLS, near cache, enrichment profiles, metrics."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal

from pydantic import (
    Field,
    model_validator,
)

from materializer.config.base import _Model
from materializer.config.durations import PositiveDuration


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
