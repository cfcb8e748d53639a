"""Streaming enrichments: a topic's events joined with the maps and written back to Kafka."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    model_validator,
)

from materializer.config.base import KAFKA_KEY, _Model
from materializer.config.maps import DeadLetterConfig, MapConfig, SourceConfig
from materializer.config.query_service import LookupConfig
from materializer.config.transforms import Transform


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
