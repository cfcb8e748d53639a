"""The ``merge`` fold: each event an RFC 7386 JSON merge patch onto its entity, in the JVM.

A merge patch touches the entity leaf by leaf: a member it sets replaces that
member (arrays and maps as a whole), a member it sets to ``null`` removes it,
a nested object merges member by member, and a member it leaves out stays. So
the entity's value at each leaf is the value of the *last event that mentions
that leaf* — unless, later, the leaf's object was removed (an explicit null on
an ancestor) or the entity was deleted. That is a streaming aggregation with
built-in functions only, kept in the state store like ``latest``:

- per leaf, ``max_by((order, value), order if the event mentions the leaf)``;
- per nested object, the order of the last event that sets it to an object
  and of the last that sets it to null;
- per key, the order of the last delete and of the last other event.

The entity is then rebuilt: a leaf counts if it was mentioned after the last
delete or removal of any of its ancestors; an object exists if it was set
after those. No Python runs, and state per key is a few values per leaf.

Order: the event-time field if declared, then the micro-batch (its timestamp,
which a replay reuses), then partition and offset. Kafka orders a partition
only, so events of one key from several topics fold in batch order, then by
partition and offset.

"Mentions": a non-null decoded value, or — for JSON values — a member present
with ``null`` in the raw value (a decoded record cannot tell null from
absent, the raw JSON can). A field renamed by a transform is found only by
its new name, so an explicit null under its old name is not seen; other
formats have no explicit nulls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from materializer.config import FoldConfig
from materializer.pipeline import columns as c

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

_ORDER = "__order"
_LAST_DELETE = "__last_delete"
_LAST_EVENT = "__last_event"


@dataclass
class _Node:
    """A field of the entity: a leaf, or a nested object with children."""

    path: tuple[str, ...]
    dtype: DataType
    children: list[_Node] = field(default_factory=list)

    @property
    def is_object(self) -> bool:
        return bool(self.children)

    @property
    def tag(self) -> str:
        """A column-name-safe tag, unique per path."""
        return "__m" + "".join(f"_{len(p)}_{p}" for p in self.path).replace("`", "_")


def _nodes(dtype: DataType, path: tuple[str, ...]) -> list[_Node]:
    from pyspark.sql.types import StructType

    out = []
    for f in dtype.fields:  # type: ignore[attr-defined]
        node = _Node((*path, f.name), f.dataType)
        if isinstance(f.dataType, StructType) and f.dataType.fields:
            node.children = _nodes(f.dataType, node.path)
        out.append(node)
    return out


def _value(path: tuple[str, ...]) -> Column:
    from pyspark.sql import functions as F

    col = F.col(c.quote(path[0]))
    for name in path[1:]:
        col = col.getField(name)
    return col


def _json_path(path: tuple[str, ...]) -> str | None:
    """``$['a']['b']``, or None when a name cannot be written in a JSON path."""
    if any("'" in p or "\\" in p for p in path):
        return None
    return "$" + "".join(f"['{p}']" for p in path)


_ROOT_MEMBERS = "__members"


def _members(path: tuple[str, ...]) -> Column | None:
    """The member names of the raw JSON object at ``path`` (the root when empty)."""
    from pyspark.sql import functions as F

    raw = F.col(c.VALUE).cast("string")
    json_path = _json_path(path)
    if json_path is None:
        return None
    return F.json_object_keys(F.get_json_object(raw, json_path) if path else raw)


def _member_columns(nodes: list[_Node], root: bool = False) -> dict[str, Column]:
    """Each object's raw member names as a column of its own, parsed once per record."""
    out: dict[str, Column] = {}
    members = _members(()) if root else None
    if members is not None:
        out[_ROOT_MEMBERS] = members
    for node in nodes:
        if node.is_object:
            members = _members(node.path)
            if members is not None:
                out[node.tag + "_members"] = members
            out.update(_member_columns(node.children))
    return out


def _explicit_null(node: _Node, parent_members: str | None) -> Column:
    from pyspark.sql import functions as F

    if parent_members is None:
        return F.lit(False)
    present = F.coalesce(F.array_contains(F.col(parent_members), node.path[-1]), F.lit(False))
    return present & _value(node.path).isNull()


def _order(fold: FoldConfig) -> Column:
    from pyspark.sql import functions as F

    parts = [F.current_timestamp().alias("b"), F.col(c.PARTITION).alias("p")]
    parts.append(F.col(c.OFFSET).alias("o"))
    if fold.event_time:
        parts.insert(0, F.col(c.quote(fold.event_time)).alias("t"))
    return F.struct(*parts)


def _aggregates(nodes: list[_Node], parent_members: str | None, known: set[str]) -> list[Column]:
    """The state kept per key for ``nodes``, given the raw members of their parent object."""
    from pyspark.sql import functions as F

    order = F.col(_ORDER)
    live = ~F.col(c.DELETED)
    out = []
    for node in nodes:
        nulled = live & _explicit_null(node, parent_members)
        if node.is_object:
            set_as_object = live & _value(node.path).isNotNull()
            out.append(F.max(F.when(set_as_object, order)).alias(node.tag + "_obj"))
            out.append(F.max(F.when(nulled, order)).alias(node.tag + "_null"))
            members = node.tag + "_members"
            out.extend(_aggregates(node.children, members if members in known else None, known))
        else:
            mentioned = live & (_value(node.path).isNotNull() | nulled)
            last = F.struct(order.alias("o"), _value(node.path).alias("v"))
            out.append(F.max_by(last, F.when(mentioned, order)).alias(node.tag))
    return out


def _after(order: Column, cutoff: Column) -> Column:
    """``order > cutoff``, where a null cutoff (nothing removed yet) lets everything count."""
    from pyspark.sql import functions as F

    return F.coalesce(order > cutoff, order.isNotNull() & cutoff.isNull())


def _rebuild(nodes: list[_Node], cutoff: Column) -> list[Column]:
    """The entity's fields from the state: what was mentioned after ``cutoff`` counts."""
    from pyspark.sql import functions as F

    out = []
    for node in nodes:
        name = node.path[-1]
        if node.is_object:
            own_cutoff = F.greatest(cutoff, F.col(node.tag + "_null"))
            exists = _after(F.col(node.tag + "_obj"), own_cutoff)
            inner = F.struct(*_rebuild(node.children, own_cutoff))
            out.append(F.when(exists, inner).alias(name))
        else:
            last = F.col(node.tag)
            out.append(F.when(_after(last.getField("o"), cutoff), last.getField("v")).alias(name))
    return out


def fold_merge(records: DataFrame, fold: FoldConfig) -> DataFrame:
    """One row per key touched: ``__key``, ``__deleted``, ``__entity`` (the merged object)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    fields = [f for f in records.schema.fields if not c.is_internal(f.name)]
    nodes = _nodes(StructType(fields), ())
    members = _member_columns(nodes, root=True)
    prepared = records.withColumns({_ORDER: _order(fold), **members})
    state = prepared.groupBy(c.KEY).agg(
        F.max(F.when(F.col(c.DELETED), F.col(_ORDER))).alias(_LAST_DELETE),
        F.max(F.when(~F.col(c.DELETED), F.col(_ORDER))).alias(_LAST_EVENT),
        *_aggregates(nodes, _ROOT_MEMBERS, set(members)),
    )
    last_delete = F.col(_LAST_DELETE)
    alive = _after(F.col(_LAST_EVENT), last_delete)
    return state.select(
        c.KEY,
        (~alive).alias(c.DELETED),
        F.when(alive, F.struct(*_rebuild(nodes, last_delete))).alias(c.ENTITY),
    )
