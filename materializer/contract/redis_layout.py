"""The Redis layout: the contract between the materializer and the query service.

Written down in docs/redis-layout.md and pinned by tests/unit/test_redis_layout.py.

- ``<map>:<key>``     string, the entity as compact JSON (UTF-8);
- ``<map>:__meta__``  hash, the watermark of the last batch written:
  ``batch_id`` (decimal), ``offsets`` (JSON ``{"topic": {"partition": next_offset}}``),
  ``updated_at_ms`` (UTC epoch milliseconds), ``app_id`` (the writing query);
- ``<map>:__changes__`` stream (capped), one entry per key a batch changed:
  ``key``, ``op`` (``upsert`` | ``delete``), ``batch_id``; and one per key
  ``ttl.redis`` expired: ``op`` ``expire``, ``batch_id`` ``-1`` (no batch made it);
- ``<map>:__status__`` hash, what the running materializer reports of the map;
- ``<map>:__history__`` stream (capped), the map's figures over time: a sample every
  ``metrics.history.interval`` (``materializer.contract.history``);
- ``<map>:__control__`` hash, what operators ask of it (pause, resume, restart);
- ``<map>:__operation__`` hash, the last operation asked of it (verify, rehydrate,
  rebuild) and the run's report of it (``materializer.contract.operations``);
- ``<map>:__generation__`` string, which generation of the map readers use;
- ``<map>:__definition__`` string, the catalog version of the definition a rebuild
  folded that generation by;
- ``<map>\\0m:`` string (on a Redis Cluster one per master, ``<map>\\0m:{<tag>}``),
  the *marker*: this server holds the map's copy whole (``marker_key``);
- ``<map>\\0o:{<map>:<key>}`` string, the fold's state of an entity, in its hash
  slot (``state_key``): ``latest``'s winning order, the other modes' JSON;
- ``<map>\\0w:`` string (tagged per master like the marker), the *owner's epoch*: the
  fencing token of the worker that owns the map in a worker group; the writing
  functions refuse a call that carries an older one (``owner_key``), and
  ``<map>\\0W:`` the map's last epoch handed out (``epoch_key``);
- ``<group>\\0g:`` hash, a worker group's work slots: map name to slot number
  (``slots_key``);
- ``\\0c:<digest>`` hash, a login session of the web console (``console_session_key``);
- ``<map>\\0t:{<map>:__meta__}`` stream (capped), the *table marks*: one per committed
  watermark, with where the changelog ended after its batch, from which the Delta query
  learns the source offsets its commits reflect (``table_marks_key``, ``TableMark``);
- ``<map>\\0e:`` sorted set and ``<map>\\0x:`` set (tagged per master like the
  marker), a map with ``ttl.redis`` only: keys by when they expire, and keys
  expired whose changelog tombstone is not yet sent (``expiry_index_key``).

A map's data (entities, ``__meta__``, ``__changes__``) lives under its
*physical* name: the map's own name for generation 0, ``<map>~<n>`` for the
generation a rebuild created. Status, control and the generation pointer stay
under the map's own name: they belong to the map, not to one copy of its data.

Offsets in the watermark are *next* offsets (exclusive ends, as Kafka commits
them): a record at offset ``o`` is reflected once the watermark's offset for its
partition is greater than ``o``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

META_SUFFIX = "__meta__"
CHANGES_SUFFIX = "__changes__"
STATUS_SUFFIX = "__status__"
CONTROL_SUFFIX = "__control__"
GENERATION_SUFFIX = "__generation__"
DEFINITION_SUFFIX = "__definition__"
OPERATION_SUFFIX = "__operation__"
HISTORY_SUFFIX = "__history__"
MAP_SUFFIXES = (
    STATUS_SUFFIX,
    CONTROL_SUFFIX,
    GENERATION_SUFFIX,
    DEFINITION_SUFFIX,
    OPERATION_SUFFIX,
    HISTORY_SUFFIX,
)
"""The bookkeeping keys of the map itself, under its own name whatever generation readers
use; ``__meta__`` and ``__changes__`` belong to each generation's copy of its data."""
RESERVED_KEYS = frozenset({META_SUFFIX, CHANGES_SUFFIX, *MAP_SUFFIXES})
"""Entity keys that would collide with a map's own bookkeeping keys."""


GENERATION_MARK = "~"
"""Joins a map's name and generation; map names cannot contain it, so no map shadows another."""


def generation_key(map_name: str) -> str:
    """The Redis string that names the generation readers use (absent: generation 0)."""
    return f"{map_name}:{GENERATION_SUFFIX}"


def definition_key(map_name: str) -> str:
    """The Redis string that holds the catalog version (``materializer.contract.map_catalog``)
    of the definition the generation readers use was folded by, when a rebuild made it."""
    return f"{map_name}:{DEFINITION_SUFFIX}"


def physical_name(map_name: str, generation: int) -> str:
    """Where one generation of a map keeps its data: in Redis, Delta and checkpoints."""
    return map_name if generation == 0 else f"{map_name}{GENERATION_MARK}{generation}"


def logical_name(physical: str) -> str:
    """The map a physical name (``physical_name``) belongs to."""
    return physical.split(GENERATION_MARK, 1)[0]


def parse_generation(raw: bytes | str | None) -> int:
    """``GET <map>:__generation__``; no key means the map was never rebuilt."""
    if raw is None:
        return 0
    return int(raw.decode() if isinstance(raw, bytes) else raw)


def entity_key(map_name: str, key: str) -> str:
    """The Redis key that holds one entity."""
    return f"{map_name}:{key}"


def changes_key(map_name: str) -> str:
    """The capped stream of a map's changes: one entry per key written, per batch."""
    return f"{map_name}:{CHANGES_SUFFIX}"


def change_entry(key: str, deleted: bool, batch_id: int) -> dict[str, str]:
    """The fields of one ``<map>:__changes__`` entry."""
    return {"key": key, "op": "delete" if deleted else "upsert", "batch_id": str(batch_id)}


READ_FUNCTION = "materializer_read_v3"
"""The Redis Function (library ``materializer``, loaded by every materializer start) that
returns the values of the keys in its arguments, read-only: readers may call it with
``FCALL_RO`` to read many keys of one Redis Cluster master, whatever their slots."""

EXPIRE_OP = "expire"
"""The ``op`` of a change entry for a key ``ttl.redis`` expired; its ``batch_id`` is ``-1``."""


MARKER_MARK = "\x00m:"
"""Joins a map's physical name and its marker's tag: no entity or state key holds it there."""


def marker_key(map_name: str, tag: str | None = None) -> str:
    """Where a server says it holds the map's copy whole: ``<map>\\0m:``, and on a Redis
    Cluster ``{<tag>}``, a hash tag of a slot the master owns (``slot_tag``).

    The materializer writes it once the copy is complete (a new map, or a copy
    restored from Delta and the changelog) and its writes refuse to run on a
    server without it, so a server restarted empty, or replaced by an empty
    one, is noticed before anything is folded onto nothing. Readers take a
    missing marker under a running map as "being restored", never "not found".
    """
    base = f"{map_name}{MARKER_MARK}"
    return base if tag is None else f"{base}{{{tag}}}"


OWNER_MARK = "\x00w:"
EPOCH_MARK = "\x00W:"
SLOTS_MARK = "\x00g:"


def owner_key(map_name: str, tag: str | None = None) -> str:
    """Where a server keeps the epoch of the worker that owns the map: ``<map>\\0w:``, and
    on a Redis Cluster ``{<tag>}`` as the marker (``marker_key``).

    A worker that takes a map over in a worker group raises it on every master
    before its first write, and every write carries the writer's epoch: the
    writing functions refuse one older than the key's (``MATERIALIZER_FENCED``),
    so a worker that lost the map while paused writes nothing more. No key:
    no owner recorded (a run outside a group), nothing refused.
    """
    base = f"{map_name}{OWNER_MARK}"
    return base if tag is None else f"{base}{{{tag}}}"


def epoch_key(map_name: str) -> str:
    """``<map>\\0W:``: the last owner's epoch handed out for the map, which the next
    owner's exceeds."""
    return f"{map_name}{EPOCH_MARK}"


def slots_key(group: str) -> str:
    """``<group>\\0g:``: a worker group's work slots, a hash of map name to slot number."""
    return f"{group}{SLOTS_MARK}"


CONSOLE_SESSION_MARK = "\x00c:"


def console_session_key(digest: str) -> str:
    """``\\0c:<digest>``: a web console login, by the SHA-256 (hex) of its cookie.

    It holds ``grant`` (the SHA-256 hex of the token that logged in, never the token),
    ``name`` (the token's name) and ``csrf`` (the session's form token), and expires when
    the session does. Keyed by a digest, so Redis holds no cookie a reader could replay;
    no map's key starts with a NUL, so none can clash with it.
    """
    return f"{CONSOLE_SESSION_MARK}{digest}"


EXPIRY_MARK = "\x00e:"
EXPIRED_MARK = "\x00x:"


def expiry_index_key(map_name: str, tag: str | None = None) -> str:
    """Where a server keeps the map's expiring keys by when they expire (sorted set of
    entity keys without the map's prefix, scored in epoch milliseconds), tagged as the
    marker is.

    Redis tells nobody when it expires a key, and a key once gone cannot be
    found by scanning: the index is how the materializer learns of an expiry,
    to send it to the change stream and the changelog. A score is a hint only:
    the key's own ``PTTL`` decides, so a score written early is harmless.
    """
    base = f"{map_name}{EXPIRY_MARK}"
    return base if tag is None else f"{base}{{{tag}}}"


def expired_key(map_name: str, tag: str | None = None) -> str:
    """The keys a server found expired whose changelog tombstones are not yet delivered
    (set), tagged as the marker is: a crash between the two sends them at the next sweep."""
    base = f"{map_name}{EXPIRED_MARK}"
    return base if tag is None else f"{base}{{{tag}}}"


STATE_MARK = b"\x00o:"
"""Joins a map's physical name and the rest of a state key: no entity key holds it there."""


def state_key(map_name: str, key: str) -> bytes:
    """Where an entity's fold state is kept (``latest``: its winning order; the other modes:
    their state as JSON): ``<map>\\0o:`` and a hash tag of the entity key's slot, so the
    fold of one key touches one slot.

    An entity key without a hash tag hashes whole, so the state key tags it
    whole; one with a tag (``{...}`` in the key) keeps that tag. State keys
    never match ``<map>:*``, so scans of a map's entities never see them.
    """
    return _beside(map_name, STATE_MARK, key)


def _beside(map_name: str, mark: bytes, key: str) -> bytes:
    """``<map><mark>`` and a hash tag of ``<map>:<key>``'s slot: that key's own tag when it
    has one (then ``key`` follows as it is), else the whole key in braces."""
    entity = entity_key(map_name, key).encode()
    start = entity.find(b"{")
    end = entity.find(b"}", start + 1) if start >= 0 else -1
    rest = key.encode() if start >= 0 and end > start + 1 else b"{" + entity + b"}"
    return map_name.encode() + mark + rest


def state_keys_pattern(map_name: str) -> bytes:
    """A ``SCAN`` pattern for a map's state keys (map names hold no glob characters)."""
    return map_name.encode() + STATE_MARK + b"*"


def meta_key(map_name: str) -> str:
    """The Redis hash that holds a map's watermark."""
    return f"{map_name}:{META_SUFFIX}"


TABLE_MARKS_MARK = b"\x00t:"
TABLE_MARKS_MAX_LEN = 1000
"""Marks kept (``XADD MAXLEN ~``): one a fold batch, so enough for a Delta table that trails
the fold by that many batches; one that trails further records an older mark meanwhile."""


def table_marks_key(map_name: str) -> bytes:
    """The capped stream of *table marks*: ``<map>\\0t:{<map>:__meta__}``, in the slot of the
    watermark, so one transaction on a Redis Cluster too appends a batch's mark with its
    watermark (``TableMark``). Never matches ``<map>:*``."""
    return _beside(map_name, TABLE_MARKS_MARK, META_SUFFIX)


def table_marks_pattern(map_name: str) -> bytes:
    """A ``SCAN`` pattern for a map's table marks (map names hold no glob characters)."""
    return map_name.encode() + TABLE_MARKS_MARK + b"*"


@dataclass(frozen=True)
class Watermark:
    """How far a map has been materialized: the batch and source offsets it reflects."""

    batch_id: int
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    updated_at_ms: int = 0
    app_id: str = ""
    """The writer's streaming query and map: tells a replayed batch from a new checkpoint's."""

    def to_hash(self) -> dict[str, str]:
        """The fields of ``<map>:__meta__``."""
        offsets = {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in self.offsets.items()}
        return {
            "batch_id": str(self.batch_id),
            "offsets": orjson.dumps(offsets, option=orjson.OPT_SORT_KEYS).decode(),
            "updated_at_ms": str(self.updated_at_ms),
            "app_id": self.app_id,
        }

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> Watermark | None:
        """Parse ``HGETALL <map>:__meta__``; ``None`` when the map has no batch yet."""
        fields = text_fields(raw)
        if "batch_id" not in fields:
            return None
        offsets = orjson.loads(fields.get("offsets", "{}"))
        return cls(
            batch_id=int(fields["batch_id"]),
            offsets={t: {int(p): int(o) for p, o in ps.items()} for t, ps in offsets.items()},
            updated_at_ms=int(fields.get("updated_at_ms", "0")),
            app_id=fields.get("app_id", ""),
        )


@dataclass(frozen=True)
class TableMark:
    """A committed watermark and where the changelog ended after its batch.

    The map's Delta table follows the changelog, not the sources: once the
    table has merged the changelog up to ``changelog`` (each partition's next
    offset at least as far), it holds every record the watermark covers
    (``materializer.contract.table_marks``). Each partition's offset is at or
    past the end of every changelog record of this batch and the ones before;
    it may be further (never nearer): a mark's table waits the longer, never
    claims too much.
    """

    watermark: Watermark
    changelog: dict[int, int]
    """Per changelog partition, a next offset past the batch's last record (all partitions)."""

    def to_entry(self) -> dict[str, str]:
        """The fields of one ``table_marks_key`` entry: the watermark's, and ``changelog``."""
        ends = {str(p): o for p, o in sorted(self.changelog.items())}
        return {**self.watermark.to_hash(), "changelog": orjson.dumps(ends).decode()}

    @classmethod
    def from_entry(cls, raw: Mapping[Any, Any]) -> TableMark | None:
        """Parse one entry (bytes or text); ``None`` for one without a watermark."""
        watermark = Watermark.from_hash(raw)
        if watermark is None:
            return None
        ends = orjson.loads(text_fields(raw).get("changelog", "{}"))
        return cls(watermark, {int(p): int(o) for p, o in ends.items()})

    def reached_by(self, changelog: Mapping[int, int]) -> bool:
        """Whether a reader of the changelog that reached ``changelog`` (next offsets per
        partition) has read every record of this mark's batch and the ones before."""
        return all(changelog.get(p, 0) >= end for p, end in self.changelog.items())


def text_fields(raw: Mapping[Any, Any]) -> dict[str, str]:
    """A hash or stream entry as Redis replied it (bytes, or text with decoding on), as
    text: every reader of this layout's hashes parses from this."""
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in raw.items()
    }


def status_key(map_name: str) -> str:
    """The Redis hash where the materializer reports a map's state."""
    return f"{map_name}:{STATUS_SUFFIX}"


def history_key(map_name: str) -> str:
    """The capped stream of a map's figures over time, one sample per interval of the run
    (``materializer.contract.history``); under the map's own name, as its status: a
    rebuild's new copy continues the same history."""
    return f"{map_name}:{HISTORY_SUFFIX}"


def control_key(map_name: str) -> str:
    """The Redis hash where operators ask the materializer to pause, resume or restart a map."""
    return f"{map_name}:{CONTROL_SUFFIX}"


def operation_key(map_name: str) -> str:
    """The Redis hash of the last operation asked of a map and the run's report of it."""
    return f"{map_name}:{OPERATION_SUFFIX}"


@dataclass(frozen=True)
class PartitionCatchUp:
    """How fast one source partition of a running map is being caught up, as the run
    measured it over its last half minute or so (``materializer.runtime.catch_up``)."""

    topic: str
    partition: int
    records_left: int
    """Records in the log beyond the map's watermark; -1: unknown."""
    catch_up_rate: float
    """Records per second the map's watermark advanced."""
    input_rate: float
    """Records per second the partition's log grew (what producers add)."""
    eta_seconds: float
    """``records_left / (catch_up_rate - input_rate)`` when that gap is positive (0 when
    nothing is left); -1: unknown, the map is not gaining on its log."""

    def to_json(self) -> dict[str, object]:
        """One entry of the report's ``catch_up_partitions``."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "records_left": self.records_left,
            "catch_up_rate": self.catch_up_rate,
            "input_rate": self.input_rate,
            "eta_seconds": self.eta_seconds,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PartitionCatchUp:
        """Parse one entry of ``catch_up_partitions``."""
        return cls(
            topic=str(doc["topic"]),
            partition=int(doc["partition"]),
            records_left=int(doc.get("records_left", -1)),
            catch_up_rate=float(doc.get("catch_up_rate", 0.0)),
            input_rate=float(doc.get("input_rate", 0.0)),
            eta_seconds=float(doc.get("eta_seconds", -1.0)),
        )


@dataclass(frozen=True)
class MapReport:
    """A map's state as the materializer last reported it, every second or so while it runs.

    A report older than a few intervals means the materializer is gone (killed,
    not stopped cleanly), whatever ``state`` says.
    """

    state: str
    error: str = ""
    reported_at_ms: int = 0
    input_rows_per_second: float = 0.0
    processed_rows_per_second: float = 0.0
    state_keys: int = -1
    """The fold's state keys when last measured (about once a minute); -1: not yet."""
    state_bytes: int = -1
    """Their Redis memory, estimated from a sample; -1: not yet."""
    worker: str = ""
    """The worker running the map (``worker.id``; ``""``: a run outside a worker group)."""
    records_left: int = -1
    """Records in the source logs beyond the map's watermark, as the run last measured them
    (about every second, while the map runs); -1: not measured (a map not running, Kafka
    not answering, or a report of a materializer from before these figures)."""
    catch_up_rate: float = 0.0
    """Records per second the watermark advanced over the last half minute or so."""
    input_rate: float = 0.0
    """Records per second the source logs grew over the same span."""
    eta_seconds: float = -1.0
    """When the map should have caught up, in seconds from the report: ``records_left /
    (catch_up_rate - input_rate)``, 0 with nothing left; -1: unknown."""
    catch_up_partitions: tuple[PartitionCatchUp, ...] = ()
    """The same figures per source partition."""

    def to_hash(self) -> dict[str, str]:
        """The fields of ``<map>:__status__``."""
        partitions = [p.to_json() for p in self.catch_up_partitions]
        return {
            "state": self.state,
            "error": self.error,
            "reported_at_ms": str(self.reported_at_ms),
            "input_rows_per_second": repr(self.input_rows_per_second),
            "processed_rows_per_second": repr(self.processed_rows_per_second),
            "state_keys": str(self.state_keys),
            "state_bytes": str(self.state_bytes),
            "worker": self.worker,
            "records_left": str(self.records_left),
            "catch_up_rate": repr(self.catch_up_rate),
            "input_rate": repr(self.input_rate),
            "eta_seconds": repr(self.eta_seconds),
            "catch_up_partitions": orjson.dumps(partitions).decode(),
        }

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> MapReport | None:
        """Parse ``HGETALL <map>:__status__``; ``None`` when nothing was reported yet."""
        fields = text_fields(raw)
        if "state" not in fields:
            return None
        return cls(
            state=fields["state"],
            error=fields.get("error", ""),
            reported_at_ms=int(fields.get("reported_at_ms", "0")),
            input_rows_per_second=float(fields.get("input_rows_per_second", "0")),
            processed_rows_per_second=float(fields.get("processed_rows_per_second", "0")),
            state_keys=int(fields.get("state_keys", "-1")),
            state_bytes=int(fields.get("state_bytes", "-1")),
            worker=fields.get("worker", ""),
            records_left=int(fields.get("records_left", "-1")),
            catch_up_rate=float(fields.get("catch_up_rate", "0")),
            input_rate=float(fields.get("input_rate", "0")),
            eta_seconds=float(fields.get("eta_seconds", "-1")),
            catch_up_partitions=tuple(
                PartitionCatchUp.from_json(p)
                for p in orjson.loads(fields.get("catch_up_partitions", "[]"))
            ),
        )


@dataclass(frozen=True)
class Control:
    """What operators ask of a map: ``desired`` state, and a restart when ``restart_id`` changes.

    The request is state, not a queue of commands: a materializer that starts
    later still finds a map paused, and two restarts asked at once are one.
    """

    desired: str = "running"
    restart_id: str = ""

    def to_hash(self) -> dict[str, str]:
        """The fields of ``<map>:__control__``."""
        return {"desired": self.desired, "restart_id": self.restart_id}

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> Control:
        """Parse ``HGETALL <map>:__control__``; no hash means run."""
        fields = text_fields(raw)
        desired = fields.get("desired", "running")
        return cls(
            desired=desired if desired in ("running", "paused") else "running",
            restart_id=fields.get("restart_id", ""),
        )
