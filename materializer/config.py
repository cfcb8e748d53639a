"""The YAML configuration: one file declares the connections and the maps.

Every model forbids unknown keys, so a typo is an error that names its key path
rather than a setting silently ignored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from materializer.errors import ConfigError

KAFKA_KEY = "$kafka_key"
_MAP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaConfig(_Model):
    """Where the brokers are; ``properties`` pass to every Kafka client (security, timeouts)."""

    bootstrap_servers: str = "localhost:9092"
    properties: dict[str, str] = Field(default_factory=dict)


class RedisConfig(_Model):
    """The Redis server holding the maps."""

    url: str = "redis://localhost:6379/0"


class DeltaConfig(_Model):
    """Where the Delta tables live: ``<root>/<map>``."""

    root: str = "./warehouse"


class SparkConfig(_Model):
    """The Spark session and the streaming queries' cadence and checkpoints."""

    master: str = "local[*]"
    checkpoint_root: str = "./checkpoints"
    trigger_interval: str = "1 second"
    shuffle_partitions: Annotated[int, Field(ge=1)] = 4
    max_offsets_per_trigger: Annotated[int, Field(ge=1)] | None = None
    conf: dict[str, str] = Field(default_factory=dict)


class SourceConfig(_Model):
    """The topics a map folds and how their values decode."""

    topics: Annotated[list[str], Field(min_length=1)]
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    format: Literal["json"] = "json"
    schema_: Annotated[str, Field(alias="schema", min_length=1)]
    """Spark SQL DDL of the value, e.g. ``id STRING, name STRING, age INT``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class FoldConfig(_Model):
    """How events of one key combine into the entity."""

    mode: Literal["latest"] = "latest"


class DeadLetterConfig(_Model):
    """Where records that cannot be folded go."""

    topic: Annotated[str, Field(min_length=1)]


class MapConfig(_Model):
    """One materialized map: its source, key, fold and error handling."""

    source: SourceConfig
    key: Annotated[str, Field(min_length=1)]
    """A top-level field of the decoded value, or ``$kafka_key``."""
    fold: FoldConfig = FoldConfig()
    dead_letter: DeadLetterConfig | None = None


class AppConfig(_Model):
    """The whole file."""

    kafka: KafkaConfig = KafkaConfig()
    redis: RedisConfig = RedisConfig()
    delta: DeltaConfig = DeltaConfig()
    spark: SparkConfig = SparkConfig()
    maps: dict[str, MapConfig] = Field(default_factory=dict)

    @field_validator("maps")
    @classmethod
    def _map_names(cls, maps: dict[str, MapConfig]) -> dict[str, MapConfig]:
        for name in maps:
            if not _MAP_NAME.match(name):
                raise ValueError(f"map name {name!r} must match {_MAP_NAME.pattern}")
        return maps

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
}


def _key_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc)


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
        problems = [f"{_key_path(e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(source, problems) from None


def load_config(path: str | Path) -> AppConfig:
    """Read and validate a YAML file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), [f"<file>: cannot read: {exc.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(p), [f"<file>: not valid YAML: {exc}"]) from None
    return parse_config(data, str(p))
