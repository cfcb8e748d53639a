"""Where maps created at runtime are kept (``materializer.contract.map_catalog``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from pydantic import Field

from materializer.config.base import _Model
from materializer.config.durations import PositiveDuration


class CatalogConfig(_Model):
    """The map catalog: maps created, changed and deleted through the API.

    Every ``materializer run`` and every query service on the same ``catalog.topic``
    follows it, so a map created through one is run and served by all. Maps the
    file declares belong to the file: the API shows them and refuses to change them.
    """

    enabled: bool = True
    """Off: the file's maps only, and the API refuses to create, change or delete one."""
    topic: Annotated[str, Field(min_length=1)] = "materializer-maps"
    """A compacted topic with one partition, created on first use (like Kafka Connect's
    ``config.storage.topic``). Processes that share it share their maps."""
    replication_factor: Annotated[int, Field(ge=-1, le=32767)] = -1
    """Of the topic when it is created; -1 takes the broker's ``default.replication.factor``."""
    poll_interval: PositiveDuration = timedelta(milliseconds=500)
    """How often a running process looks for changes."""
