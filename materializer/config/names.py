"""The names of what a map owns outside its tables: Kafka topics, its consumer group and
its checkpoint folders.

Every process that creates, reads, rebuilds or cleans them takes the names
from here, so a rename cannot leave a command looking in the old place.
"""

from __future__ import annotations

from materializer.config import AppConfig

MAP_GROUP = "materializer.{map}"
"""The consumer group a map's offsets are committed to; ``{map}`` stands for the map's name."""

LIVE_GROUP = "materializer.{map}.live"
"""The consumer group the real-time path commits a map's position to, in the same Kafka
transaction as the changelog's and dead letters' records (``materializer.live``)."""


def dead_letter_topic(config: AppConfig, map_name: str) -> str:
    """The configured dead-letter topic, or ``<map>.dlq``."""
    dead_letter = config.map(map_name).dead_letter
    return dead_letter.topic if dead_letter else f"{map_name}.dlq"


def enrichment_dead_letter_topic(config: AppConfig, name: str) -> str:
    """An enrichment's configured dead-letter topic, or ``<enrichment>.dlq``."""
    dead_letter = config.enrichments[name].dead_letter
    return dead_letter.topic if dead_letter else f"{name}.dlq"


def changelog_topic(config: AppConfig, map_name: str, generation: int = 0) -> str:
    """The configured changelog topic, or ``<map>.changelog``; ``.g<n>`` for a rebuilt generation.

    Each generation has its own, so a rebuild's replay never reaches the live table.
    """
    changelog = config.map(map_name).changelog
    topic = changelog.topic if changelog else f"{map_name}.changelog"
    return topic if generation == 0 else f"{topic}.g{generation}"


def checkpoint_path(config: AppConfig, map_name: str, query: str) -> str:
    """One checkpoint folder per query of a map."""
    return f"{config.spark.checkpoint_root.rstrip('/')}/{map_name}/{query}"
