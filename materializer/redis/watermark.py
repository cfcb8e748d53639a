"""The Redis map's watermark: ``<map>:__meta__``, committed once a batch is applied.

The fold (``materializer.redis.sink``) puts a batch's entities in place, and on
one server their change entries in the same atomic call; the watermark goes
last, after every entity of the batch, so a reader that reads the watermark
first and an entity second sees an entity at least as new as the watermark.

Why a replay is safe: the watermark carries the batch's id and its query's app
id, and a commit whose key already holds that batch is skipped (``commit``),
with the batch's table mark: a replay appends none.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from materializer.batch import Batch, Sink
from materializer.clients.redis import TRANSIENT_ERRORS, client_for
from materializer.config import RedisConfig
from materializer.contract.redis_layout import TABLE_MARKS_MAX_LEN, meta_key, table_marks_key
from materializer.contract.table_marks import TableMark
from materializer.contract.watermark import Watermark

if TYPE_CHECKING:
    from collections.abc import Callable

WATERMARK_WAIT_S = 120.0
"""How long a batch's watermark waits for a Redis that does not answer (``WatermarkSink.write``)."""


class WatermarkSink(Sink):
    """``<map>:__meta__``, the batch's watermark, once the fold has put its entities and
    change entries in place (``materializer.redis.sink``).

    Named ``redis`` in logs, metrics and crash drills (``redis:N``), as it always was."""

    name = "redis"

    def __init__(
        self,
        config: RedisConfig,
        map_name: str,
        end_offsets: Callable[[int], dict[str, dict[int, int]]],
        changes_max_len: int = 100_000,
        changelog_ends: Callable[[int], dict[int, int] | None] | None = None,
    ) -> None:
        """``changelog_ends``: where the changelog ends after a batch
        (``RedisFoldSink.changelog_ends``); the batch's table mark goes with its watermark."""
        self.config = config
        self.map_name = map_name
        self.changes_max_len = changes_max_len
        self._end_offsets = end_offsets
        self._changelog_ends = changelog_ends

    def write(self, batch: Batch) -> None:
        """Commit the batch's watermark, waiting out a Redis that does not answer.

        By now the fold has sent the batch's changelog, so the batch must
        commit: failing it here would replay it onto a copy restored from
        that changelog, and an aggregate would count it twice. A server that
        restarted answers again within seconds (empty: the next batch then
        finds its marker gone and the copy is restored with this batch in
        it); only one that stays away longer than ``WATERMARK_WAIT_S`` fails
        the batch.
        """
        watermark = Watermark(
            batch_id=batch.batch_id,
            offsets=self._end_offsets(batch.batch_id),
            updated_at_ms=int(time.time() * 1000),
            app_id=batch.app_id,
        )
        ends = None if self._changelog_ends is None else self._changelog_ends(batch.batch_id)
        deadline = time.monotonic() + WATERMARK_WAIT_S
        while True:
            try:
                self.commit(watermark, ends)
                return
            except TRANSIENT_ERRORS:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def commit(self, watermark: Watermark, changelog_ends: dict[int, int] | None = None) -> None:
        """The watermark, once per (app id, batch id): one transaction on ``__meta__``,
        skipped when it already holds this batch or a later one of the same query.

        With ``changelog_ends`` the same transaction appends the batch's table mark
        (``TableMark``; its stream shares the watermark's slot), so a mark exists exactly
        for each watermark committed, and is fenced as the watermark is.
        """
        meta = meta_key(self.map_name)
        with client_for(self.config).pipeline(transaction=True) as pipe:
            pipe.watch(meta)
            if _holds(Watermark.from_hash(pipe.hgetall(meta)), watermark):
                return
            pipe.multi()
            fields: dict[Any, Any] = dict(watermark.to_hash())
            pipe.hset(meta, mapping=fields)
            if changelog_ends is not None:
                entry: dict[Any, Any] = TableMark(watermark, changelog_ends).to_entry()
                pipe.xadd(
                    table_marks_key(self.map_name),
                    entry,
                    maxlen=TABLE_MARKS_MAX_LEN,
                    approximate=True,
                )
            pipe.execute()


def _holds(current: Watermark | None, batch: Watermark) -> bool:
    """Whether a key already reflects this batch: same app id, same or later batch id."""
    return (
        current is not None
        and current.app_id == batch.app_id
        and current.batch_id >= batch.batch_id
    )
