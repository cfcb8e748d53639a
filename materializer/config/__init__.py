"""The YAML configuration: one file declares the connections and the maps.

Every model forbids unknown keys, so a typo is an error that names its key path
rather than a setting silently ignored.

The models live in modules by section; this package re-exports every public name, so
``from materializer.config import AppConfig`` keeps working.
"""

from __future__ import annotations

from materializer.config.app import AppConfig
from materializer.config.base import INTERNAL_PREFIX, KAFKA_KEY, MAP_NAME, FoldPath
from materializer.config.catalog import CatalogConfig
from materializer.config.connections import (
    OBJECT_STORE_SCHEMES,
    DeltaConfig,
    KafkaConfig,
    KafkaSecurity,
    ObjectStoreConfig,
    RedisConfig,
    SaslConfig,
    Secret,
    SparkConfig,
    read_config_file,
)
from materializer.config.durations import Duration, NonNegativeDuration, PositiveDuration
from materializer.config.enrichments import (
    EnrichmentConfig,
    EnrichmentLookupConfig,
    EnrichmentOutputConfig,
)
from materializer.config.loading import (
    ENV_OVERRIDES,
    config_problems,
    load_config,
    parse_config,
    parse_config_text,
    validate_text,
    with_maps,
)
from materializer.config.maps import (
    DOCUMENT,
    AggregateSpec,
    CatchUpConfig,
    ChangelogConfig,
    ChangesConfig,
    DeadLetterConfig,
    FoldConfig,
    IndexConfig,
    MapConfig,
    SourceConfig,
    TtlConfig,
    inferred_problems,
    is_inferred,
    realtime_problems,
)
from materializer.config.query_service import (
    AuthConfig,
    ConsoleConfig,
    EnrichProfileConfig,
    HistoryConfig,
    LookupConfig,
    MetricsConfig,
    NearCacheConfig,
    QueryConfig,
    SqlConfig,
    TlsConfig,
)
from materializer.config.transforms import (
    TRANSFORM_TYPES,
    CastTransform,
    ComputeTransform,
    DropTransform,
    ExtractFieldTransform,
    FilterTransform,
    FlattenTransform,
    InsertFieldTransform,
    KeepTransform,
    MaskTransform,
    RenameTransform,
    TimestampConvertTransform,
    Transform,
    ValueToKeyTransform,
)
from materializer.config.worker import WorkerConfig

__all__ = [
    "WorkerConfig",
    "AggregateSpec",
    "AppConfig",
    "AuthConfig",
    "CastTransform",
    "CatalogConfig",
    "CatchUpConfig",
    "ChangelogConfig",
    "ChangesConfig",
    "ComputeTransform",
    "DOCUMENT",
    "DeadLetterConfig",
    "DeltaConfig",
    "DropTransform",
    "Duration",
    "ENV_OVERRIDES",
    "EnrichProfileConfig",
    "EnrichmentConfig",
    "EnrichmentLookupConfig",
    "EnrichmentOutputConfig",
    "ExtractFieldTransform",
    "FilterTransform",
    "FlattenTransform",
    "FoldConfig",
    "INTERNAL_PREFIX",
    "InsertFieldTransform",
    "KAFKA_KEY",
    "KafkaConfig",
    "KafkaSecurity",
    "KeepTransform",
    "LookupConfig",
    "MAP_NAME",
    "MapConfig",
    "IndexConfig",
    "MaskTransform",
    "MetricsConfig",
    "HistoryConfig",
    "ConsoleConfig",
    "SqlConfig",
    "NearCacheConfig",
    "NonNegativeDuration",
    "OBJECT_STORE_SCHEMES",
    "ObjectStoreConfig",
    "PositiveDuration",
    "QueryConfig",
    "RedisConfig",
    "RenameTransform",
    "SaslConfig",
    "Secret",
    "SourceConfig",
    "SparkConfig",
    "TRANSFORM_TYPES",
    "TimestampConvertTransform",
    "TlsConfig",
    "Transform",
    "TtlConfig",
    "ValueToKeyTransform",
    "config_problems",
    "inferred_problems",
    "realtime_problems",
    "FoldPath",
    "is_inferred",
    "load_config",
    "parse_config",
    "parse_config_text",
    "read_config_file",
    "validate_text",
    "with_maps",
]
