"""Operations on a map asked through the AdminService and carried out by the run that folds it.

``<map>:__operation__`` (hash, ``redis_layout.operation_key``) holds the last
operation asked of the map: the request the query service writes (``id``,
``kind``, ``requested_by``, ``requested_at_ms``, ``state`` ``requested``) and
the report the run that holds the map adds as it goes (``state``, ``phase``,
progress, times, the result or the error). It stays after the operation ends,
until the next request replaces it. Docs: docs/redis-layout.md.

Both writes are single Lua scripts on the one key, so no read-then-write race
opens between a request and a report: a request replaces only a record that
ended (``REQUEST_SCRIPT``), and a report lands only on the operation it is about,
while it has not ended (``REPORT_SCRIPT``): a report of a run that lost the map
cannot overwrite the next operation, nor revive one marked failed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from materializer.contract.redis_layout import text_fields

KINDS = ("verify", "rehydrate", "rebuild")
"""What may be asked: compare Redis with Delta and the changelog, load Redis from them, or
fold the map again into a new generation and move readers to it."""

REQUESTED = "requested"
RUNNING = "running"
DONE = "done"
FAILED = "failed"
STATES = (REQUESTED, RUNNING, DONE, FAILED)
UNFINISHED = (REQUESTED, RUNNING)
"""A record in one of these states refuses a new request."""

INTERRUPTED = "interrupted by the run stopping"
"""The error of an operation its run stopped before it ended."""

REQUEST_SCRIPT = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'requested' and state ~= 'running' then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
return redis.call('HGETALL', KEYS[1])
"""
"""``EVAL REQUEST_SCRIPT 1 <map>:__operation__ field value ...``: write a new request unless
one is unfinished; returns the record that stands (the new one, or the one that refused it)."""

REPORT_SCRIPT = """
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'requested' and state ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
"""
"""``EVAL REPORT_SCRIPT 1 <map>:__operation__ id field value ...``: update the operation ``id``
while it is unfinished; 1 when written, 0 when the record is another's or has ended."""


def now_ms() -> int:
    """UTC epoch milliseconds, as the record's times are."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Operation:
    """The last operation asked of a map, and how far the run that holds the map took it.

    ``result`` is the summary of one that is done, by kind (docs/redis-layout.md):
    ``verify``: ``identical``, ``expected``, ``actual``, ``watermark_matches`` and
    ``missing``/``extra``/``different`` as ``{"count", "first"}``; ``rehydrate``:
    ``loaded``, ``removed``, ``expired``, ``seconds``; ``rebuild``: ``generation``
    (set at the switch of readers, before the old copy is dropped).
    """

    id: str
    kind: str
    requested_by: str
    requested_at_ms: int
    state: str = REQUESTED
    phase: str = ""
    """What it does now, in words (``waiting for the map to pause``, ``loading``, ...)."""
    done: int = 0
    total: int = 0
    """Progress: ``done`` of ``total`` units of its phase (rows, records); 0: unknown."""
    started_at_ms: int = 0
    finished_at_ms: int = 0
    worker: str = ""
    """The worker (``worker.id``, by default ``<host>-<pid>``) of the run carrying it out."""
    error: str = ""
    result: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def request(cls, kind: str, requested_by: str) -> Operation:
        """A new request with a fresh id, asked now."""
        return cls(uuid.uuid4().hex, kind, requested_by, now_ms())

    @property
    def unfinished(self) -> bool:
        """Requested or running: a new request is refused meanwhile."""
        return self.state in UNFINISHED

    def to_hash(self) -> dict[str, str]:
        """The fields of ``<map>:__operation__``."""
        return {
            "id": self.id,
            "kind": self.kind,
            "requested_by": self.requested_by,
            "requested_at_ms": str(self.requested_at_ms),
            "state": self.state,
            "phase": self.phase,
            "done": str(self.done),
            "total": str(self.total),
            "started_at_ms": str(self.started_at_ms),
            "finished_at_ms": str(self.finished_at_ms),
            "worker": self.worker,
            "error": self.error,
            "result": orjson.dumps(dict(self.result)).decode() if self.result else "",
        }

    def request_args(self) -> list[str]:
        """``REQUEST_SCRIPT``'s arguments: the request's own fields."""
        fields = self.to_hash()
        names = ("id", "kind", "requested_by", "requested_at_ms", "state")
        return [item for name in names for item in (name, fields[name])]

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> Operation | None:
        """Parse ``HGETALL <map>:__operation__``; ``None`` when no operation was asked."""
        fields = text_fields(raw)
        if "id" not in fields:
            return None
        return cls(
            id=fields["id"],
            kind=fields.get("kind", ""),
            requested_by=fields.get("requested_by", ""),
            requested_at_ms=int(fields.get("requested_at_ms") or 0),
            state=fields.get("state", REQUESTED),
            phase=fields.get("phase", ""),
            done=int(fields.get("done") or 0),
            total=int(fields.get("total") or 0),
            started_at_ms=int(fields.get("started_at_ms") or 0),
            finished_at_ms=int(fields.get("finished_at_ms") or 0),
            worker=fields.get("worker", ""),
            error=fields.get("error", ""),
            result=orjson.loads(fields["result"]) if fields.get("result") else {},
        )

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> Operation | None:
        """Parse ``REQUEST_SCRIPT``'s reply, the record as a flat field, value list."""
        return cls.from_hash(dict(zip(reply[::2], reply[1::2], strict=True)))


def report_args(operation_id: str, **fields: Any) -> list[str]:
    """``REPORT_SCRIPT``'s arguments: the operation's id, then the fields to set (``result``
    as its JSON, numbers in decimal)."""
    args = [operation_id]
    for name, value in fields.items():
        if name == "result":
            text = orjson.dumps(dict(value)).decode() if value else ""
        else:
            text = str(value)
        args += [name, text]
    return args
