"""The ``merge`` fold: each event an RFC 7386 JSON merge patch onto its entity.

A merge patch touches the entity leaf by leaf: a member it sets replaces that
member (arrays and maps as a whole), a member it sets to ``null`` removes it,
a nested object merges member by member, and a member it leaves out stays. So
the entity's value at each leaf is the value of the *last event that mentions
that leaf*, unless, later, the leaf's object was removed (an explicit null on
an ancestor) or the entity was deleted. The state kept per key says exactly
that, and nothing else:

- per leaf, the order and value of the last event that mentions it;
- per nested object, the order of the last event that sets it to an object
  and of the last that sets it to null;
- the order of the last delete and of the last other event.

The entity is rebuilt from it: a leaf counts if it was mentioned after the
last delete or removal of any of its ancestors; an object exists if it was set
after those. Why this and not the entity itself: each part of the state is a
maximum by order, so folding an event twice, or events out of order, gives
the same state: a replayed batch changes nothing, and events of one key from
several partitions fold to the same entity whatever batch they come in. What
no longer counts (older than a removal) is dropped, so the state stays the
size of the schema.

Order: the event-time field if declared, then the micro-batch (its timestamp,
which a replay reuses; put in on the driver or executor, ``with_batch_time``),
then partition and offset. Kafka orders a partition
only, so events of one key from several topics fold in batch order, then by
partition and offset.

"Mentions": a non-null decoded value, or, for JSON values, a member present
with ``null`` in the raw value (a decoded record cannot tell null from absent,
the raw JSON can; Spark finds them, ``aux`` names them). A field renamed by a
transform is found only by its new name, so an explicit null under its old
name is not seen; other formats have no explicit nulls.

Values cross as the entity's JSON, parsed with ``orjson``; a schema with a
decimal anywhere is parsed keeping each number's text, as a double cannot
hold every decimal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING, Any

import orjson

from materializer import record_columns as c
from materializer.fold.base import Event, FoldMode

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType


@dataclass(frozen=True)
class Field:
    """A field of the entity: a leaf, or a nested object (``children`` not None)."""

    name: str
    path: tuple[str, ...]
    children: tuple[Field, ...] | None = None
    key: str = dataclass_field(init=False, compare=False)
    """The field's name in the state: its path as JSON."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", orjson.dumps(self.path).decode())


def fields_of(dtype: StructType, path: tuple[str, ...] = ()) -> tuple[Field, ...]:
    """The entity's fields: structs with fields are objects, everything else a leaf."""
    from pyspark.sql.types import StructType

    out = []
    for f in dtype.fields:
        inner = (*path, f.name)
        if isinstance(f.dataType, StructType) and f.dataType.fields:
            out.append(Field(f.name, inner, fields_of(f.dataType, inner)))
        else:
            out.append(Field(f.name, inner))
    return tuple(out)


def _flat(fields: tuple[Field, ...]) -> list[Field]:
    """Every field, depth first: the numbering ``aux`` uses."""
    out = []
    for f in fields:
        out.append(f)
        if f.children is not None:
            out.extend(_flat(f.children))
    return out


def _value(path: tuple[str, ...]) -> Column:
    from pyspark.sql import functions as F

    col = F.col(c.quote(path[0]))
    for name in path[1:]:
        col = col.getField(name)
    return col


def _members(path: tuple[str, ...]) -> Column | None:
    """The member names of the raw JSON object at ``path`` (the root when empty), or None
    when a name cannot be written in a JSON path.

    Only a value with ``null`` in its text can set a member to null: others are not parsed
    at all (their names are null, which ``aux`` reads as no explicit null). Most patches
    carry none, and parsing each one was most of what ``merge`` cost Spark beyond
    ``latest`` (docs/decisions/0032-the-live-path-in-real-time-mode.md)."""
    from pyspark.sql import functions as F

    if any("'" in p or "\\" in p for p in path):
        return None
    raw = F.col(c.VALUE).cast("string")
    json_path = "$" + "".join(f"['{p}']" for p in path)
    members = F.json_object_keys(F.get_json_object(raw, json_path) if path else raw)
    return F.when(raw.contains("null"), members)


def _member_columns(fields: tuple[Field, ...]) -> dict[tuple[str, ...], str]:
    """Per object that has fields (the root included), the column ``MergeMode.shared``
    keeps its raw member names in."""
    parents = sorted({f.path[:-1] for f in _flat(fields)})
    return {parent: f"{c.PREFIX}members_{n}" for n, parent in enumerate(parents)}


def _contains_decimal(dtype: DataType) -> bool:
    return "decimal" in dtype.simpleString()


class MergeMode(FoldMode):
    """``merge``: the order has the batch in it; ``aux`` lists the explicit nulls."""

    batch_in_order = True

    def shared(self, records: DataFrame) -> tuple[DataFrame, list[str]]:
        """The member names of each object of the raw JSON that has fields: ``aux`` asks
        each for several fields. Parsed once per object, not once per field, the merge
        fold's own columns cost a little more than ``latest``'s, not several times as much
        (docs/decisions/0015-merge-null-search-once-per-object.md). A Debezium row needs
        none: its nulls are all explicit."""
        if c.UNAVAILABLE in records.columns:
            return records, []
        columns = {}
        for parent, name in _member_columns(fields_of(self.entity_type(records))).items():
            members = _members(parent)
            if members is not None:
                columns[name] = members
        return records.withColumns(columns), list(columns)

    def aux(self, records: DataFrame) -> Column | None:
        """The depth-first numbers of the fields the raw JSON sets to null, comma-separated;
        empty when none. ``records`` carry ``shared``'s columns."""
        from pyspark.sql import functions as F

        fields = fields_of(self.entity_type(records))
        if c.UNAVAILABLE in records.columns:
            return _row_nulls(fields)
        names = _member_columns(fields)
        nulls = []
        for i, f in enumerate(_flat(fields)):
            column = names[f.path[:-1]]
            if column not in records.columns:
                continue  # a name a JSON path cannot hold (``_members``)
            present = F.coalesce(F.array_contains(F.col(column), f.name), F.lit(False))
            nulls.append(F.when(present & _value(f.path).isNull(), F.lit(str(i))))
        return F.concat_ws(",", *nulls) if nulls else None

    def folder(self, records: DataFrame) -> MergeFolder:
        """The entity's fields; numbers kept as text when a decimal is among them."""
        entity = self.entity_type(records)
        return MergeFolder(fields_of(entity), exact=_contains_decimal(entity))


def _row_nulls(fields: tuple[Field, ...]) -> Column:
    """``aux`` of a row Debezium sent whole: every null field, but those it could not send."""
    from pyspark.sql import functions as F

    unavailable = F.col(c.UNAVAILABLE)
    nulls = [
        F.when(_value(f.path).isNull() & ~F.array_contains(unavailable, f.path[0]), F.lit(str(i)))
        for i, f in enumerate(_flat(fields))
    ]
    return F.concat_ws(",", *nulls)


SEED = ""
"""The order of what an entity held before its state was kept: below every event's."""


def _after(order: str | None, cutoff: str | None) -> bool:
    """``order > cutoff``, where no cutoff (nothing removed yet) lets any order count."""
    return order is not None and (cutoff is None or order > cutoff)


def _later(a: str | None, b: str | None) -> str | None:
    return a if b is None or (a is not None and a > b) else b


def _exact_loads(text: bytes | str) -> Any:
    """JSON with every number kept as its text (an integer of a decimal(38, 0) may be past
    what ``orjson`` writes as a number)."""
    return json.loads(text, parse_float=orjson.Fragment, parse_int=orjson.Fragment)


class MergeFolder:
    """Python side of ``merge``. State: ``{"d": last delete, "e": last event, "l": {leaf:
    [order, value]}, "o": {object: [set, nulled]}}``, fields named by ``Field.key``."""

    def __init__(self, fields: tuple[Field, ...], *, exact: bool) -> None:
        self.fields = fields
        self.exact = exact
        self._flat = _flat(fields)

    @property
    def _loads(self) -> Callable[[bytes | str], Any]:
        return _exact_loads if self.exact else orjson.loads

    def __call__(self, state: bytes | None, events: list[Event]) -> tuple[bytes, bytes | None]:
        """Each event's patch into the state, then the entity rebuilt from it."""
        loads = self._loads
        s = loads(state) if state else {"d": None, "e": None, "l": {}, "o": {}}
        leaves: dict[str, list[Any]] = s.setdefault("l", {})
        objects: dict[str, list[str | None]] = s.setdefault("o", {})
        for order, payload, nulls in events:
            if payload is None:
                s["d"] = _later(order, s.get("d"))
                continue
            s["e"] = _later(order, s.get("e"))
            self._patch(loads(payload), self.fields, order, leaves, objects)
            for i in nulls.split(",") if nulls else ():
                f = self._flat[int(i)]
                if f.children is None:
                    _set_leaf(leaves, f.key, order, None)
                else:
                    entry = objects.setdefault(f.key, [None, None])
                    entry[1] = _later(order, entry[1])
        entity = self._build(self.fields, s.get("d"), leaves, objects)
        if not leaves:
            del s["l"]
        if not objects:
            del s["o"]
        text = orjson.dumps(s)
        return text, (orjson.dumps(entity) if _after(s.get("e"), s.get("d")) else None)

    def lua_spec(self) -> list[tuple[str, str, int, bool]]:
        """The fields as the Redis Functions' merge fold reads them (``merge.lua``): per
        field, depth first, its name, its key in the state as the state's JSON writes it,
        its parent's place counted from 1 (0: the entity) and whether it is an object."""
        places = {f.path: n for n, f in enumerate(self._flat, 1)}
        return [
            (
                f.name,
                orjson.dumps(f.key).decode(),
                places.get(f.path[:-1], 0),
                f.children is not None,
            )
            for f in self._flat
        ]

    def seed(self, entity: bytes) -> bytes:
        """Every member of the entity set at the lowest order: any event sorts after it."""
        leaves: dict[str, list[Any]] = {}
        objects: dict[str, list[str | None]] = {}
        self._patch(self._loads(entity), self.fields, SEED, leaves, objects)
        return orjson.dumps({"d": None, "e": SEED, "l": leaves, "o": objects})

    def _patch(
        self,
        patch: dict[str, Any],
        fields: tuple[Field, ...],
        order: str,
        leaves: dict[str, list[Any]],
        objects: dict[str, list[str | None]],
    ) -> None:
        """Record what ``patch`` (the entity's JSON, nulls left out) sets, at ``order``."""
        for f in fields:
            if f.name not in patch:
                continue
            if f.children is None:
                leaf = leaves.get(f.key)
                if leaf is None or order > leaf[0]:
                    leaves[f.key] = [order, patch[f.name]]
            else:
                entry = objects.setdefault(f.key, [None, None])
                entry[0] = _later(order, entry[0])
                self._patch(patch[f.name], f.children, order, leaves, objects)

    def _build(
        self,
        fields: tuple[Field, ...],
        cutoff: str | None,
        leaves: dict[str, list[Any]],
        objects: dict[str, list[str | None]],
    ) -> dict[str, Any]:
        """The entity's members under ``fields``: what was set after ``cutoff``. Drops from
        the state what is not: no later event can bring it back."""
        out: dict[str, Any] = {}
        for f in fields:
            if f.children is None:
                leaf = leaves.get(f.key)
                if leaf is None:
                    continue
                if not _after(leaf[0], cutoff):
                    del leaves[f.key]
                elif leaf[1] is not None:
                    out[f.name] = leaf[1]
                continue
            entry = objects.get(f.key, [None, None])
            if not _after(entry[1], cutoff):
                entry[1] = None
            own = _later(entry[1], cutoff)
            if not _after(entry[0], own):
                entry[0] = None
            inner = self._build(f.children, own, leaves, objects)
            if entry[0] is not None:
                out[f.name] = inner
            elif f.key in objects and entry[1] is None:
                del objects[f.key]
        return out


def _set_leaf(leaves: dict[str, list[Any]], key: str, order: str, value: Any) -> None:
    current = leaves.get(key)
    if current is None or order > current[0]:
        leaves[key] = [order, value]
