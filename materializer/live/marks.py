"""Table marks for the maps on the real-time path: what their Delta tables' commits can say
they hold (``contract.table_marks``), and so what a ``Query``, SQL or ``min_offsets`` wait
sees of them.

A micro-batch fold appends a mark beside each watermark it commits. The real-time path's
writers commit Kafka transactions instead, each with the map's positions in its live
group, and no watermark in Redis says which of its records are committed. So the run
appends their marks (``LiveMarks``): every ``MARK_EVERY_S``, per map, the positions its
live group has committed, *then* the changelog's log ends (high watermarks). In that
order the ends lie past every record of each transaction that committed those positions,
since it committed before they were read; records of transactions still open may lie
below them too, so a table waits a little longer for the mark, never claims too much.

A map whose Redis watermark stands where its last mark's positions stand has nothing to
mark: its writers commit only positions the watermark has passed. So each round reads the
watermarks from Redis first, in one round trip, and asks Kafka only about the maps that
moved. A map's group consumer is opened when it moves and closed once it has been still
for ``IDLE_CLOSE_S``: a hundred idle maps whose marks caught up with their watermarks
hold no Kafka client and cost Kafka nothing. (A map whose committed positions never come
to equal its watermark, say one whose source topics changed, is asked every round, as
every map was before.)
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from materializer.clients.group_positions import committed_by, group_consumer
from materializer.clients.kafka_offsets import (
    KAFKA_TIMEOUT_SECONDS,
    admin_client,
    offsets_of,
    partition_ids,
)
from materializer.clients.redis import client_for
from materializer.config import AppConfig
from materializer.config.names import changelog_topic
from materializer.contract.redis_layout import (
    TABLE_MARKS_MAX_LEN,
    meta_key,
    physical_name,
    table_marks_key,
)
from materializer.contract.table_marks import TableMark
from materializer.contract.watermark import Watermark
from materializer.live.positions import LIVE_APP, live_group

log = logging.getLogger(__name__)

MARK_EVERY_S = 1.0
"""How often a mark of each map on the path: its writers commit every
``spark.live_commit_interval`` (1 s), its Delta table every ``delta.trigger_interval`` (5 s)."""

IDLE_CLOSE_S = 30.0
"""How long a map's group consumer stays open after its last move: a map that moves keeps
it (opening one costs a coordinator lookup), a still one gives its threads back."""


@dataclass
class _Marked:
    """One map's marking: its copy, its partitions, its live group's consumer while it moves
    (``_consumer``), the positions of its last mark."""

    physical: str
    group: str
    sources: dict[str, list[int]]
    changelog: dict[str, list[int]]
    consumer: Any = None
    closing: ExitStack = field(default_factory=ExitStack)
    moved_at: float = 0.0
    """When its watermark was last seen ahead of its last mark (``time.monotonic``)."""
    last: dict[str, dict[int, int]] | None = None
    failing: bool = False


class LiveMarks:
    """The marks of the maps on the real-time path, on a thread of their own, which also
    reads each map's partitions as it joins: a hundred maps joining take the run's loop no
    time. Its consumers open and close under the lock that ``hold`` and ``leave`` take, so
    those may wait for a round of marks (a coordinator lookup per map that moved after
    being still)."""

    def __init__(self, config: AppConfig) -> None:
        self._config = config
        self._maps: dict[str, _Marked] = {}
        self._wanted: dict[str, tuple[int, AppConfig]] = {}
        """The maps to mark (name to the generation it folds and the config it runs on)."""
        self._refused: set[str] = set()
        """Maps whose marking could not open, said once."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._admin = admin_client(config.kafka)
        self._thread = threading.Thread(target=self._run, name="live-marks", daemon=True)
        self._thread.start()

    def hold(self, maps: dict[str, tuple[int, AppConfig]]) -> None:
        """Mark these maps (name to the generation it folds and the config it runs on) from
        now on; the others no more."""
        with self._lock:
            self._wanted = dict(maps)
            for name in list(self._maps):
                if self._maps[name].physical != self._physical(name):
                    self._drop(name)

    def leave(self, names: list[str]) -> None:
        """The maps left the path, their writers stopped: a last mark of each now (the one
        their Delta tables' next commits record), then no more, since their micro-batch
        folds append marks of their own from here on."""
        with self._lock:
            for name in names:
                wanted = self._wanted.pop(name, None)
                if name not in self._maps and wanted is not None:
                    self._refused.discard(name)  # its last mark: said if it cannot be made
                    opened = self._open_or_say(name, *wanted)
                    if opened is not None:
                        self._maps[name] = opened
                if name in self._maps:
                    self._mark(name, self._maps[name])
                    self._drop(name)

    def close(self) -> None:
        """Stop marking; close the consumers."""
        self._stop.set()
        self._thread.join(KAFKA_TIMEOUT_SECONDS * 2)
        with self._lock:
            self._wanted.clear()
            for name in list(self._maps):
                self._drop(name)

    def _run(self) -> None:
        while not self._stop.wait(MARK_EVERY_S):
            self._open_wanted()
            with self._lock:
                moved = self._moved()
                for name, marked in self._maps.items():
                    if self._stop.is_set():
                        return
                    if name in moved:
                        self._mark(name, marked)
                    elif marked.consumer is not None and (
                        time.monotonic() - marked.moved_at > IDLE_CLOSE_S
                    ):
                        self._close_consumer(name, marked)

    def _moved(self) -> set[str]:
        """The maps whose Redis watermark is not where their last mark stands (all of them
        when Redis does not answer: ``_mark`` then says why)."""
        names = list(self._maps)
        try:
            pipe = client_for(self._config.redis).pipeline(transaction=False)
            for name in names:
                pipe.hgetall(meta_key(self._maps[name].physical))
            replies = pipe.execute()
        except Exception:  # noqa: BLE001 - each map's mark says it, once
            return set(names)
        moved = set()
        for name, reply in zip(names, replies, strict=True):
            marked = self._maps[name]
            try:
                still = (w := Watermark.from_hash(reply)) is not None and w.offsets == marked.last
            except (ValueError, TypeError, AttributeError):  # unreadable: ``_mark`` asks Kafka
                still = False
            if not still:
                marked.moved_at = time.monotonic()
                moved.add(name)
        return moved

    def _open_wanted(self) -> None:
        """Open the maps wanted and not open yet, outside the lock (admin calls, which a slow
        Kafka makes long, would hold the run's loop in ``hold`` and ``leave``); keep each if
        it is still wanted as it was."""
        with self._lock:
            pending = {n: w for n, w in self._wanted.items() if n not in self._maps}
        for name, wanted in pending.items():
            if self._stop.is_set():
                return
            opened = self._open_or_say(name, *wanted)
            if opened is None:
                continue
            with self._lock:
                if self._wanted.get(name) == wanted and name not in self._maps:
                    self._maps[name] = opened
                    continue
            opened.closing.close()

    def _physical(self, name: str) -> str | None:
        wanted = self._wanted.get(name)
        return None if wanted is None else physical_name(name, wanted[0])

    def _open_or_say(self, name: str, generation: int, config: AppConfig) -> _Marked | None:
        try:
            opened = self._open(name, generation, config)
        except Exception as exc:  # noqa: BLE001 - a mark is an extra: tried again next time
            if name not in self._refused:
                log.warning("map %s: no table marks on the real-time path yet: %s", name, exc)
            self._refused.add(name)
            return None
        self._refused.discard(name)
        return opened

    def _open(self, name: str, generation: int, config: AppConfig) -> _Marked:
        changelog = changelog_topic(config, name, generation)
        return _Marked(
            physical=physical_name(name, generation),
            group=live_group(name),
            sources=partition_ids(self._admin, config.map(name).source.topics),
            changelog=partition_ids(self._admin, [changelog]),
        )

    def _consumer(self, marked: _Marked) -> Any:
        """The map's group consumer, opened if it is not."""
        if marked.consumer is None:
            marked.consumer = marked.closing.enter_context(
                group_consumer(self._config.kafka, marked.group)
            )
        return marked.consumer

    def _close_consumer(self, name: str, marked: _Marked) -> None:
        marked.consumer = None
        try:
            marked.closing.close()
        except Exception as exc:  # noqa: BLE001 - closing: nothing more to do with it
            log.debug("map %s: its marks' consumer did not close cleanly: %s", name, exc)

    def _drop(self, name: str) -> None:
        self._close_consumer(name, self._maps.pop(name))

    def _mark(self, name: str, marked: _Marked) -> None:
        """Committed positions first, the log ends after (the module's docstring)."""
        try:
            positions = committed_by(self._consumer(marked), marked.group, marked.sources, wait=0)
            if not positions or positions == marked.last:
                return
            ((_, ends),) = offsets_of(self._admin, marked.changelog, "latest").items()
            watermark = Watermark(
                batch_id=0,
                offsets=positions,
                updated_at_ms=int(time.time() * 1000),
                app_id=LIVE_APP,
            )
            client_for(self._config.redis).xadd(
                table_marks_key(marked.physical),
                TableMark(watermark, ends).to_entry(),  # type: ignore[arg-type]
                maxlen=TABLE_MARKS_MAX_LEN,
                approximate=True,
            )
            marked.last, marked.failing = positions, False
        except Exception as exc:  # noqa: BLE001 - a mark is an extra: the next one comes
            log.log(
                logging.DEBUG if marked.failing else logging.WARNING,
                "map %s: no table marks while Kafka or Redis does not answer: %s",
                name,
                exc,
            )
            marked.failing = True
