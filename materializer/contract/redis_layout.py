"""The Redis layout's keys: the contract between the materializer and the query service.

Written down in docs/redis-layout.md and pinned by tests/unit/test_redis_layout.py.
This module names every key of the layout; what a hash or stream entry holds is
parsed by the module named after it, each reading Redis's replies through
``text_fields``: ``watermark`` (``__meta__``), ``status`` (``__status__``),
``control`` (``__control__``), ``operations`` (``__operation__``), ``history``
(``__history__``) and ``table_marks`` (the table marks). The names stay together
because they share one namespace: the reserved suffixes and the NUL marks are what
keep an entity, a map's bookkeeping, another map and the console's sessions from
ever clashing, which is checked by reading this one page.

- ``<map>:<key>``     string, the entity as compact JSON (UTF-8);
- ``<map>:__meta__``  hash, the watermark of the last batch written
  (``materializer.contract.watermark``): ``batch_id`` (decimal), ``offsets`` (JSON
  ``{"topic": {"partition": next_offset}}``), ``updated_at_ms`` (UTC epoch
  milliseconds), ``app_id`` (the writing query);
- ``<map>:__changes__`` stream (capped), one entry per key a batch changed:
  ``key``, ``op`` (``upsert`` | ``delete``), ``batch_id``; and one per key
  ``ttl.redis`` expired: ``op`` ``expire``, ``batch_id`` ``-1`` (no batch made it);
- ``<map>:__status__`` hash, what the running materializer reports of the map
  (``materializer.contract.status``);
- ``<map>:__history__`` stream (capped), the map's figures over time: a sample every
  ``metrics.history.interval`` (``materializer.contract.history``);
- ``<map>:__control__`` hash, what operators ask of it (pause, resume, restart)
  (``materializer.contract.control``);
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
  learns the source offsets its commits reflect (``table_marks_key``;
  ``materializer.contract.table_marks.TableMark``);
- ``<map>\\0f:`` hash, a map on the real-time path only: how fresh its records were when
  Redis held them, as its writers counted them since the run last took the counts
  (``live_freshness_key``; ``materializer.live.freshness``);
- ``<map>\\0e:`` sorted set and ``<map>\\0x:`` set (tagged per master like the
  marker), a map with ``ttl.redis`` only: keys by when they expire, and keys
  expired whose changelog tombstone is not yet sent (``expiry_index_key``);
- ``<map>\\0I:`` hash, ``<map>\\0i:<field>`` sorted set and ``<map>\\0j:`` hash (each
  tagged per master like the marker, the tag before the field), a map with ``indexes``
  only: the fields this server indexes (field to ``IndexState`` JSON), one index's
  entries (``materializer.contract.index_entries``), and what each expiring entity is
  indexed under (``index_keys``).

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
from typing import Any

# The map's own keys, ``<map>:...``: its entities and bookkeeping.

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


def entity_key(map_name: str, key: str) -> str:
    """The Redis key that holds one entity."""
    return f"{map_name}:{key}"


def meta_key(map_name: str) -> str:
    """The Redis hash that holds a map's watermark."""
    return f"{map_name}:{META_SUFFIX}"


def changes_key(map_name: str) -> str:
    """The capped stream of a map's changes: one entry per key written, per batch."""
    return f"{map_name}:{CHANGES_SUFFIX}"


def change_entry(key: str, deleted: bool, batch_id: int) -> dict[str, str]:
    """The fields of one ``<map>:__changes__`` entry."""
    return {"key": key, "op": "delete" if deleted else "upsert", "batch_id": str(batch_id)}


EXPIRE_OP = "expire"
"""The ``op`` of a change entry for a key ``ttl.redis`` expired; its ``batch_id`` is ``-1``."""


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


# Generations: which copy of a map's data readers use, and its physical name.

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


# Keys beside a map's data, joined by a NUL mark: never matched by ``<map>:*``.

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


def state_key_name(map_name: str, key: bytes) -> str:
    """The entity key's name of a state key of the map (``state_key``'s inverse)."""
    rest = key[len(map_name.encode() + STATE_MARK) :]
    entity = entity_key(map_name, "").encode()
    if rest.startswith(b"{" + entity) and rest.endswith(b"}"):
        return rest[len(entity) + 1 : -1].decode()
    return rest.decode()


def state_keys_pattern(map_name: str) -> bytes:
    """A ``SCAN`` pattern for a map's state keys (map names hold no glob characters)."""
    return map_name.encode() + STATE_MARK + b"*"


TABLE_MARKS_MARK = b"\x00t:"
TABLE_MARKS_MAX_LEN = 1000
"""Marks kept (``XADD MAXLEN ~``): one a fold batch, so enough for a Delta table that trails
the fold by that many batches; one that trails further records an older mark meanwhile."""


def table_marks_key(map_name: str) -> bytes:
    """The capped stream of *table marks*: ``<map>\\0t:{<map>:__meta__}``, in the slot of the
    watermark, so one transaction on a Redis Cluster too appends a batch's mark with its
    watermark (``table_marks.TableMark``). Never matches ``<map>:*``."""
    return _beside(map_name, TABLE_MARKS_MARK, META_SUFFIX)


def table_marks_pattern(map_name: str) -> bytes:
    """A ``SCAN`` pattern for a map's table marks (map names hold no glob characters)."""
    return map_name.encode() + TABLE_MARKS_MARK + b"*"


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


FRESHNESS_MARK = "\x00f:"


def live_freshness_key(map_name: str) -> str:
    """``<map>\\0f:``: the real-time path's freshness counts of the map (by its own name,
    whatever generation it folds), which its writers add to and the run takes away.

    The writers run in Spark's tasks, wherever the executors are, and a real-time
    batch reports its progress only when it ends, minutes apart: Redis, which every
    writer reaches, is where their counts meet the run's metrics.
    """
    return f"{map_name}{FRESHNESS_MARK}"


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


INDEXES_MARK = "\x00I:"
INDEX_MARK = "\x00i:"
INDEXED_MARK = "\x00j:"


def index_fields_key(map_name: str, tag: str | None = None) -> str:
    """Where a server lists the map's indexed fields (hash of field to ``IndexState`` JSON),
    tagged as the marker is: the fold's functions read it at each call, so an index
    declared or dropped while the map runs is kept, or no longer, from the next write on."""
    return f"{map_name}{INDEXES_MARK}" + ("" if tag is None else f"{{{tag}}}")


def index_key(map_name: str, field: str, tag: str | None = None) -> str:
    """One index's entries on a server (sorted set, every score 0: ordered by the entry's
    bytes, ``index_entries``): ``<map>\\0i:``, the marker's tag, then the field, so a brace
    in a field's name never moves the key's slot."""
    return f"{map_name}{INDEX_MARK}" + ("" if tag is None else f"{{{tag}}}") + field


def indexed_key(map_name: str, tag: str | None = None) -> str:
    """What each expiring entity on a server is indexed under (hash of key to its entries,
    MessagePack), for a map with ``ttl.redis`` and indexes: Redis expires an entity without
    a word, and its entries must still be found to be taken out."""
    return f"{map_name}{INDEXED_MARK}" + ("" if tag is None else f"{{{tag}}}")


def index_keys_pattern(map_name: str) -> str:
    """A ``SCAN`` pattern for every index key of a map (fields, entries, expiring records)."""
    return f"{map_name}\x00[Iij]:*"


# A worker group's keys: who owns a map, and the group's work slots.

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


# The web console's sessions.

CONSOLE_SESSION_MARK = "\x00c:"


def console_session_key(digest: str) -> str:
    """``\\0c:<digest>``: a web console login, by the SHA-256 (hex) of its cookie.

    It holds ``grant`` (the SHA-256 hex of the token that logged in, never the token),
    ``name`` (the token's name) and ``csrf`` (the session's form token), and expires when
    the session does. Keyed by a digest, so Redis holds no cookie a reader could replay;
    no map's key starts with a NUL, so none can clash with it.
    """
    return f"{CONSOLE_SESSION_MARK}{digest}"


# Reading the layout.

READ_FUNCTION = "materializer_read_v3"
"""The Redis Function (library ``materializer``, loaded by every materializer start) that
returns the values of the keys in its arguments, read-only: readers may call it with
``FCALL_RO`` to read many keys of one Redis Cluster master, whatever their slots."""


INDEX_READ_FUNCTION = "materializer_index_read_v1"
"""The Redis Function that reads one index's entries in spans (``index_entries``) with their
entities, read-only, in one atomic call on the master holding them (``FCALL_RO``)."""


def text_fields(raw: Mapping[Any, Any]) -> dict[str, str]:
    """A hash or stream entry as Redis replied it (bytes, or text with decoding on), as
    text: every reader of this layout's hashes parses from this."""
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in raw.items()
    }
