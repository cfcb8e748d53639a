"""The admin side of ``<map>:__status__`` / ``<map>:__control__`` / ``<map>:__operation__``,
and the source log ends.

The materializer reports each map's state and obeys the control hash
(``materializer.runtime.control_channel``); this store reads the one and writes the
other, on the query service's shared Redis client. Log end offsets come from
Kafka itself, so lag is measured against the log, not against what the
materializer last saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

from materializer.clients.kafka_offsets import (
    KAFKA_TIMEOUT_SECONDS,
    admin_client,
    partition_offsets,
)
from materializer.clients.redis import AsyncClient, get_many_async, where
from materializer.config import KafkaConfig
from materializer.contract.control import Control, control_fields
from materializer.contract.operations import REQUEST_SCRIPT, Operation
from materializer.contract.redis_layout import (
    control_key,
    generation_key,
    meta_key,
    operation_key,
    parse_generation,
    physical_name,
    status_key,
)
from materializer.contract.status import MapReport
from materializer.contract.watermark import Watermark
from query_service.stores.redis_errors import unavailable_on_connection_errors

log = logging.getLogger(__name__)


class MapSnapshot(NamedTuple):
    """What Redis says of one map: its watermark, last report and pending request."""

    watermark: Watermark | None
    report: MapReport | None
    control: Control


class ControlStore:
    """Reads reports and writes requests for the admin API."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._where = where(client)

    async def snapshot(self, names: Sequence[str]) -> dict[str, MapSnapshot]:
        """Watermark (of the map's current generation), report and control of each map.

        Two round trips: the generations, then everything else.
        """
        if not names:
            return {}
        async with unavailable_on_connection_errors(self._where):
            generations = await get_many_async(self._client, [generation_key(n) for n in names])
        async with (
            unavailable_on_connection_errors(self._where),
            self._client.pipeline(transaction=False) as pipe,
        ):
            for name, generation in zip(names, generations, strict=True):
                pipe.hgetall(meta_key(physical_name(name, parse_generation(generation))))
                pipe.hgetall(status_key(name))
                pipe.hgetall(control_key(name))
            replies = iter(await pipe.execute())
        return {
            name: MapSnapshot(
                Watermark.from_hash(next(replies)),
                MapReport.from_hash(next(replies)),
                Control.from_hash(next(replies)),
            )
            for name in names
        }

    async def request(
        self, name: str, *, desired: str | None = None, restart: bool = False
    ) -> None:
        """Ask the materializer to change a map's state (it obeys within one loop)."""
        fields = control_fields(desired, restart)
        async with unavailable_on_connection_errors(self._where):
            await self._client.hset(control_key(name), mapping=cast("Any", fields))

    async def start_operation(self, name: str, operation: Operation) -> Operation:
        """Store a request for an operation unless one is unfinished (one script, so two
        requests at once cannot both win); the record that stands: ``operation``, or the
        unfinished one that refused it."""
        async with unavailable_on_connection_errors(self._where):
            reply = await self._client.eval(
                REQUEST_SCRIPT, 1, operation_key(name), *operation.request_args()
            )
        standing = Operation.from_reply(reply)
        if standing is None:  # the script always leaves a record
            raise RuntimeError(f"no operation record for map {name!r} after a request")
        return standing

    async def operation(self, name: str) -> Operation | None:
        """The last operation asked of the map, as its run last reported it."""
        async with unavailable_on_connection_errors(self._where):
            raw = await self._client.hgetall(operation_key(name))
        return Operation.from_hash(raw)


class LogEnds:
    """Log end offsets of source partitions, asked of Kafka's admin API."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self._kafka = kafka
        self._admin: Any = None
        self._lock = threading.Lock()
        self._late: threading.Thread | None = None
        """A lookup that outstayed ``ENDS_WAIT_S`` and has not returned yet."""

    def _client(self) -> Any:
        with self._lock:
            if self._admin is None:
                self._admin = admin_client(self._kafka)
            return self._admin

    async def ends(self, topics: Sequence[str]) -> dict[str, dict[int, int]] | None:
        """Per topic and partition, the log end offset now; ``None`` when Kafka cannot say
        within ``ENDS_WAIT_S``.

        Asked on a daemon thread of its own, not the loop's executor: librdkafka's
        metadata call can outstay its own timeout while no broker answers, and a thread of
        the executor held by it would hold the service's stop too (the loop waits for its
        executor's threads as it closes). While such a lookup has not returned, statuses
        do not ask again (each would leave a thread behind); the next lookup after it
        takes a new client."""
        named = ", ".join(topics)
        late = self._late
        if late is not None and late.is_alive():
            log.warning("cannot read log end offsets of %s: Kafka has not answered", named)
            return None
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[dict[str, dict[int, int]]] = loop.create_future()
        admin = self._client()

        def ask() -> None:
            try:
                found = partition_offsets(admin, list(topics))
            except Exception as exc:  # reported to the waiting call, if it still waits
                _settle(loop, answer, exc)
            else:
                _settle(loop, answer, found)

        asking = threading.Thread(target=ask, name="log-ends", daemon=True)
        asking.start()
        try:
            return await asyncio.wait_for(answer, ENDS_WAIT_S)
        except TimeoutError:
            with self._lock:
                self._late, self._admin = asking, None
            log.warning("cannot read log end offsets of %s: no answer in %d s", named, ENDS_WAIT_S)
            return None
        except Exception as exc:  # Kafka down or slow: lag is unknown, status still answers
            log.warning("cannot read log end offsets of %s: %s", named, exc)
            return None


ENDS_WAIT_S = 3 * KAFKA_TIMEOUT_SECONDS
"""How long a status waits for the log ends before it answers with lag unknown: Kafka that
answers at all answers in a few of ``KAFKA_TIMEOUT_SECONDS``, one per request
``partition_offsets`` makes in turn (a metadata request per topic, then the offsets)."""


def _settle(loop: asyncio.AbstractEventLoop, answer: asyncio.Future[Any], outcome: Any) -> None:
    """Hands ``outcome`` (a result, or the exception raised) to ``answer`` on its loop,
    unless the call stopped waiting or the loop has closed."""

    def settle() -> None:
        if answer.done():
            return
        if isinstance(outcome, BaseException):
            answer.set_exception(outcome)
        else:
            answer.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
        loop.call_soon_threadsafe(settle)
