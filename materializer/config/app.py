"""The whole file: connections, maps, enrichments, the query service."""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from materializer.config.base import MAP_NAME, FoldPath, _Model
from materializer.config.catalog import CatalogConfig
from materializer.config.connections import (
    OBJECT_STORE_SCHEMES,
    DeltaConfig,
    KafkaConfig,
    ObjectStoreConfig,
    RedisConfig,
    SparkConfig,
)
from materializer.config.enrichments import EnrichmentConfig
from materializer.config.maps import MapConfig, realtime_problems
from materializer.config.query_service import MetricsConfig, QueryConfig
from materializer.config.worker import WorkerConfig
from materializer.errors import ConfigError


class AppConfig(_Model):
    """The whole file."""

    kafka: KafkaConfig = KafkaConfig()
    redis: RedisConfig = RedisConfig()
    delta: DeltaConfig = DeltaConfig()
    spark: SparkConfig = SparkConfig()
    query: QueryConfig = QueryConfig()
    metrics: MetricsConfig = MetricsConfig()
    object_store: ObjectStoreConfig | None = None
    catalog: CatalogConfig = CatalogConfig()
    worker: WorkerConfig = WorkerConfig()
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
            if not MAP_NAME.match(name):
                raise ValueError(f"{kind} name {name!r} must match {MAP_NAME.pattern}")
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

    def fold_path(self, name: str) -> FoldPath:
        """How the map folds once caught up: its ``path``, else ``spark.path``; a map the
        real-time path cannot fold (``realtime_problems``, a Redis cluster) stays on
        micro-batches when the run's default asks for it."""
        map_config = self.map(name)
        if map_config.path is not None:
            return map_config.path
        if self.redis.cluster or realtime_problems(map_config):
            return "microbatch"
        return self.spark.path

    @model_validator(mode="after")
    def _realtime_on_one_server(self) -> AppConfig:
        """The real-time writer calls one Redis server; a map that asks for it needs one."""
        if self.redis.cluster:
            asking = [n for n, m in self.maps.items() if m.path == "realtime"]
            if asking:
                raise ValueError(
                    f"maps.{asking[0]}.path: realtime folds into one Redis server, "
                    "not a cluster (redis.cluster)"
                )
        return self

    def map(self, name: str) -> MapConfig:
        """The named map, or a ConfigError that lists the ones that exist."""
        try:
            return self.maps[name]
        except KeyError:
            known = ", ".join(sorted(self.maps)) or "none"
            raise ConfigError("", [f"maps.{name}: no such map (known: {known})"]) from None
