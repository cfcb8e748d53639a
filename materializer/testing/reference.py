"""Reference folds in plain Python: the independent answer that tests compare against."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

Event = tuple[int, int, bytes | None, bytes | None]
"""(partition, offset, kafka key, value) of one produced record."""


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    return value


def fold_latest(
    events: Iterable[Event], key_field: str, fields: list[str]
) -> dict[str, dict[str, Any]]:
    """The last event per key in (partition, offset) order; tombstones delete.

    Records that are not JSON objects or lack the key are skipped, as the
    pipeline dead-letters them. Only ``fields`` (the declared schema) are kept,
    and null fields are left out, as in the pipeline's compact JSON.
    """
    state: dict[str, tuple[tuple[int, int], dict[str, Any] | None]] = {}
    for partition, offset, kafka_key, value in events:
        if value is None:
            if kafka_key is None:
                continue
            key = kafka_key.decode()
            entity: dict[str, Any] | None = None
        else:
            try:
                doc = orjson.loads(value)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(doc, dict) or doc.get(key_field) is None:
                continue
            key = str(doc[key_field])
            entity = _drop_nulls({f: doc.get(f) for f in fields})
        position = (partition, offset)
        if key not in state or state[key][0] < position:
            state[key] = (position, entity)
    return {k: e for k, (_, e) in state.items() if e is not None}


Deletes = Callable[[dict[str, Any]], bool]
"""Whether a decoded record deletes its entity (a map's ``fold.delete_when``)."""


def _keyed(
    kafka_key: bytes | None, value: bytes | None, key_field: str
) -> tuple[str, dict[str, Any] | None] | None:
    """(key, record) of an event, (key, None) for a tombstone, None for a skipped record."""
    if value is None:
        return None if kafka_key is None else (kafka_key.decode(), None)
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get(key_field) is None:
        return None
    return str(doc[key_field]), doc


def _in_order(events: Iterable[Event]) -> list[Event]:
    return sorted(events, key=lambda e: (e[0], e[1]))


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, written out as the RFC's pseudocode, without modifying its inputs."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = json_merge_patch(result.get(name), value)
    return result


def fold_merge(
    events: Iterable[Event],
    key_field: str,
    fields: list[str] | None = None,
    deletes: Deletes | None = None,
) -> dict[str, dict[str, Any]]:
    """Each record's JSON as an RFC 7386 merge patch onto its key's entity, in offset order.

    A tombstone (or a record for which ``deletes`` holds) removes the entity and
    the next record starts from an empty object. Skips records as
    ``fold_latest`` does; keeps only ``fields`` when given. Nulls cannot remain:
    a merge patch removes the members it sets to null.
    """
    state: dict[str, dict[str, Any]] = {}
    for _, _, kafka_key, value in _in_order(events):
        keyed = _keyed(kafka_key, value, key_field)
        if keyed is None:
            continue
        key, doc = keyed
        if doc is None or (deletes is not None and deletes(doc)):
            state.pop(key, None)
            continue
        state[key] = json_merge_patch(state.get(key, {}), doc)
    if fields is None:
        return state
    return {k: {f: e[f] for f in fields if f in e} for k, e in state.items()}


Aggregates = Mapping[str, tuple[str, str | None]]
"""``{name: (fn, field)}``, as a map's ``fold.aggregates`` declares them."""


def fold_aggregate(
    events: Iterable[Event],
    key_field: str,
    aggregates: Aggregates,
    deletes: Deletes | None = None,
) -> dict[str, dict[str, Any]]:
    """The declared aggregates per key over its records in offset order.

    ``count`` counts records (with a field, those where it is not null);
    ``sum`` / ``min`` / ``max`` skip nulls; ``first`` / ``last`` take the field
    of the first / latest record, null or not. A tombstone (or ``deletes``)
    removes the entity and the next record starts a new one. Null results are
    left out, as in the pipeline's compact JSON.
    """
    state: dict[str, list[dict[str, Any]]] = {}
    for _, _, kafka_key, value in _in_order(events):
        keyed = _keyed(kafka_key, value, key_field)
        if keyed is None:
            continue
        key, doc = keyed
        if doc is None or (deletes is not None and deletes(doc)):
            state.pop(key, None)
            continue
        state.setdefault(key, []).append(doc)
    return {
        key: _drop_nulls(
            {name: _aggregate(fn, field, docs) for name, (fn, field) in aggregates.items()}
        )
        for key, docs in state.items()
    }


def _aggregate(fn: str, field: str | None, docs: list[dict[str, Any]]) -> Any:
    """One aggregate over an entity's records, as SQL computes it."""
    if field is None:
        return len(docs)
    values = [d.get(field) for d in docs]
    present = [v for v in values if v is not None]
    if fn == "count":
        return len(present)
    if fn == "first":
        return _drop_nulls(values[0])
    if fn == "last":
        return _drop_nulls(values[-1])
    if not present:
        return None
    if fn == "sum":
        return sum(present)
    return min(present) if fn == "min" else max(present)
