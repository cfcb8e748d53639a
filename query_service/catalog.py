"""The query service's maps, kept up with the catalog; and the changes its admin API makes.

Every replica follows the catalog topic, so a map created through one replica is
served by all within a poll interval (``catalog.poll_interval``), and one deleted is
forgotten as soon. The catalog is read on a thread of its own: its reads block, and
Kafka out of reach must neither hold up the event loop nor a stop (the thread is a
daemon, and a stop does not wait for a read Kafka never answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable

from materializer.catalog.live import LiveMaps
from materializer.catalog.rule import Maps
from materializer.catalog.store import TIMEOUT_SECONDS, CatalogTopic, CatalogUnavailable
from materializer.config import AppConfig
from query_service.errors import FailedPrecondition, StoreUnavailable

log = logging.getLogger(__name__)

FIRST_READ_SECONDS = 5.0
"""How long a start waits for the catalog before serving the file's maps alone: lookups
need Redis only, so a Kafka out of reach must not keep a replica from serving them."""


class CatalogWatcher:
    """Follows the catalog on a thread and tells its listeners what is in force."""

    def __init__(self, live: LiveMaps) -> None:
        self.live = live
        self.ready = threading.Event()
        """Set once the catalog was read to its end (at once with the catalog off)."""
        self._lock = threading.Lock()  # the follower is not thread-safe
        self._changes = asyncio.Lock()  # one change at a time in this process
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[AppConfig], None]] = []
        if live.topic is None:
            self.ready.set()

    def on_change(self, listener: Callable[[AppConfig], None]) -> None:
        """Call ``listener`` (on the event loop) with the config in force when maps change."""
        self._listeners.append(listener)

    async def start(self, wait: float = FIRST_READ_SECONDS) -> None:
        """Follow the catalog; return once it was read to its end, or after ``wait`` s."""
        if self.live.topic is None or self._thread is not None:
            return
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._follow, args=(loop,), name="catalog", daemon=True
        )
        self._thread.start()
        await self.first_read(wait)

    async def first_read(self, wait: float) -> None:
        """Return once the catalog was read to its end, or after ``wait`` s."""
        deadline = asyncio.get_running_loop().time() + wait
        while not self.ready.is_set() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)

    def _follow(self, loop: asyncio.AbstractEventLoop) -> None:
        interval = self.live.file_config.catalog.poll_interval.total_seconds()
        # Until closed, or until its event loop is: a server whose owner never closes the
        # watcher (``create_server``) stops following with its loop.
        while not self._stop.is_set() and not loop.is_closed():
            with self._lock:
                if self.ready.is_set():
                    changed = self.live.refresh()
                else:
                    changed = self.live.start()
                    if changed:
                        self.ready.set()
            if changed and not self._stop.is_set():
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(self._changed)
            self._stop.wait(interval)

    def _changed(self) -> None:
        config = self.live.config
        log.info("maps in force: %s", ", ".join(sorted(config.maps)) or "none")
        for listener in self._listeners:
            listener(config)

    @contextlib.asynccontextmanager
    async def changing(self) -> AsyncIterator[tuple[Maps, CatalogTopic]]:
        """The maps in force, read to the catalog's end, and the topic to write a change to;
        no other change of this process interleaves."""
        topic = self.live.topic
        if topic is None:
            raise FailedPrecondition(
                "maps cannot be changed through the API: catalog.enabled is off in the "
                "query service's configuration"
            )
        async with self._changes:
            yield await asyncio.to_thread(self._caught_up), topic

    def _caught_up(self) -> Maps:
        with self._lock:
            try:
                self.live.catch_up(TIMEOUT_SECONDS)
            except CatalogUnavailable as exc:
                raise StoreUnavailable(str(exc)) from None
            self.ready.set()
            return self.live.maps

    async def written(self) -> None:
        """Take in a change this process just wrote, so its answer and the next call see it."""
        await asyncio.to_thread(self._caught_up)
        self._changed()

    async def close(self) -> None:
        """Stop following (a read in flight ends on its own)."""
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 1.0)
            if not self._thread.is_alive():
                self.live.close()
            self._thread = None
