"""Reference folds in plain Python: the independent answer that tests compare against."""

from __future__ import annotations

from collections.abc import Iterable
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
