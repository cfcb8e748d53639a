"""Where a map's data lives, for every process that reads or writes it (no Spark needed)."""

from __future__ import annotations

from materializer.config import AppConfig


def table_path(config: AppConfig, map_name: str) -> str:
    """The map's Delta table: ``<delta.root>/<map>``."""
    return f"{config.delta.root.rstrip('/')}/{map_name}"


def history_path(config: AppConfig, map_name: str) -> str:
    """The raw-event history table of a map."""
    return f"{table_path(config, map_name)}__events"


def checkpoint_path(config: AppConfig, map_name: str, query: str) -> str:
    """One checkpoint folder per query of a map."""
    return f"{config.spark.checkpoint_root.rstrip('/')}/{map_name}/{query}"
