"""Answers made in the query service from entities, in plain Python terms: a statement over
index candidates counts an entity read twice once, and a restore's table copy leaves out
what Redis already expired."""

from __future__ import annotations

import time

import orjson
import pyarrow as pa

from materializer.contract.index_entries import entry
from query_service.sql.indexed import _run
from query_service.tables.fallback import _Copy

READING = pa.schema([("_key", pa.string()), ("city", pa.string()), ("n", pa.int64())])


def test_an_entity_read_twice_across_rounds_counts_once_as_its_newest_read() -> None:
    def candidate(key: str, city: str, n: int) -> tuple[bytes, bytes]:
        return entry(city, key), orjson.dumps({"city": city, "n": n})

    entries = [candidate("a", "Oslo", 1), candidate("b", "Oslo", 2), candidate("a", "Rome", 5)]
    text = "SELECT count(*) AS c, sum(n) AS s FROM m WHERE city IN ('Oslo', 'Rome')"

    table = _run(text, [], "m", READING, entries, 10)

    assert table is not None and table.to_pylist() == [{"c": 2, "s": 7}]


def test_a_table_copy_leaves_out_the_rows_redis_expired() -> None:
    rows = pa.table({"_key": ["old", "new", "never"], "city": ["x", "y", None]})
    now_us = time.time_ns() // 1000
    copy = _Copy(3, None, rows, [now_us - 1, now_us + 60_000_000, -1])

    assert copy.entities(["old", "new", "never", "absent"]) == [
        None,
        b'{"city":"y"}',
        None,
        None,
    ]
    without_ttl = _Copy(3, None, rows, None)
    assert without_ttl.entities(["old", "absent"]) == [b'{"city":"x"}', None]
