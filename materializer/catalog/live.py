"""The maps in force in one process, kept up with the catalog as it changes."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Mapping

from materializer.catalog.rule import combine, log_left_out
from materializer.catalog.store import (
    TIMEOUT_SECONDS,
    CatalogFollower,
    CatalogTopic,
)
from materializer.config import AppConfig

log = logging.getLogger(__name__)


class LiveMaps:
    """The file's maps and the catalog's, as ``materializer.catalog.rule`` combines them.

    Kafka out of reach never stops a process: it goes on with the maps it knows and
    reads the changes it missed once Kafka answers again.
    """

    def __init__(self, file_config: AppConfig) -> None:
        self.file_config = file_config
        self.maps = combine(file_config, {})
        catalog = file_config.catalog
        self.topic = CatalogTopic(file_config.kafka, catalog) if catalog.enabled else None
        self._follower: CatalogFollower | None = None
        self._warned = False

    @property
    def config(self) -> AppConfig:
        """The config in force: the file's, with every map in force."""
        return self.maps.config

    def topics(self) -> Mapping[str, Collection[str]]:
        """Each map's source topics, as its definition in force says at each lookup."""
        return _Topics(self)

    def start(self, timeout: float = TIMEOUT_SECONDS) -> bool:
        """Read the catalog to its end, so a process starts with every map created so far;
        whether it could (else it goes on with the file's maps and tries again later)."""
        if self.topic is None:
            return True
        try:
            self.catch_up(timeout)
        except Exception as exc:  # noqa: BLE001 - Kafka's or the topic's: tried again later
            self._warn(exc)
            return False
        return True

    def catch_up(self, timeout: float = TIMEOUT_SECONDS) -> bool:
        """Read the catalog to its end as it is now, or ``CatalogUnavailable``: what a change
        is checked against. Whether the maps in force changed."""
        if self.topic is None:
            return False
        if self._follower is None:
            self._follower = self.topic.follower()
        self._follower.catch_up(timeout)
        return self._combine()

    def refresh(self, timeout: float = 0.0) -> bool:
        """Take in the catalog's new records; whether the maps in force changed."""
        if self.topic is None:
            return False
        try:
            if self._follower is None:
                self._follower = self.topic.follower()
            changed = self._follower.poll(timeout)
        except Exception as exc:  # noqa: BLE001 - Kafka's or the topic's: tried again later
            self._warn(exc)
            return False
        if self._warned:
            log.info("catalog.topic: reading %s again", self.topic.topic)
            self._warned = False
        return self._combine() if changed else False

    def _combine(self) -> bool:
        if self._follower is None:
            return False
        before = self.maps
        self.maps = combine(self.file_config, self._follower.last)
        log_left_out(before, self.maps)
        return self.maps.config != before.config or self.maps.stored != before.stored

    def _warn(self, exc: Exception) -> None:
        if not self._warned:
            log.error("%s; going on with the maps known so far", exc)
            self._warned = True

    def close(self) -> None:
        """Leave the topic; release the writer."""
        if self._follower is not None:
            self._follower.close()
            self._follower = None
        if self.topic is not None:
            self.topic.close()


def as_live(config: AppConfig | LiveMaps) -> LiveMaps:
    """Maps that follow the catalog, or a fixed config's maps (which never change)."""
    return config if isinstance(config, LiveMaps) else LiveMaps(config)


class _Topics(Mapping[str, Collection[str]]):
    def __init__(self, live: LiveMaps) -> None:
        self._live = live

    def __getitem__(self, name: str) -> Collection[str]:
        return self._live.config.maps[name].source.topics

    def __iter__(self) -> Iterator[str]:
        return iter(self._live.config.maps)

    def __len__(self) -> int:
        return len(self._live.config.maps)
