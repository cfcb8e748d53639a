"""What rehydrate and verify expect of a map with a TTL: each key with what remains of it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.dataset as ds

from materializer.restore.changelog_tail import Tail
from materializer.restore.expected_state import ExpectedState

NOW_MS = 1_800_000_000_000
TTL_MS = 5_000


def _at(ms_ago: int | None) -> datetime | None:
    if ms_ago is None:
        return None
    return datetime.fromtimestamp(NOW_MS / 1000, UTC) - timedelta(milliseconds=ms_ago)


def state(table: pa.Table | None, tail: Tail, *, ttl_ms: int | None = TTL_MS) -> ExpectedState:
    dataset = None if table is None else ds.dataset(table)
    meta = ("_key", "_updated_at")
    return ExpectedState("m", 0, "uri", 1, 0, tail, dataset, meta, ttl_ms, lambda: NOW_MS)


def entities(expected: ExpectedState) -> tuple[dict[str, bytes], dict[str, int | None], int]:
    values: dict[str, bytes] = {}
    expiry: dict[str, int | None] = {}
    expired = 0
    for batch in expected.batches():
        keys = batch.keys.to_pylist()
        values.update(zip(keys, batch.values.to_pylist(), strict=True))
        ttls = batch.expiry_ms.to_pylist() if batch.expiry_ms is not None else [None] * len(keys)
        expiry.update(zip(keys, ttls, strict=True))
        expired += batch.expired
    return values, expiry, expired


def test_each_key_gets_what_remains_of_its_ttl_and_expired_ones_are_left_out():
    rows = {
        "fresh": (1_000, 1),
        "old": (9_000, 2),
        "unstamped": (None, 3),  # from before ttl.delta was set
        "overridden": (9_000, 4),  # the tail has a newer change
        "tail_deleted": (1_000, 5),
    }
    table = pa.table(
        {
            "_key": list(rows),
            "_updated_at": pa.array(
                [_at(ago) for ago, _ in rows.values()], pa.timestamp("us", "UTC")
            ),
            "n": [n for _, n in rows.values()],
        }
    )
    tail = Tail(
        "t",
        changes={
            "overridden": b'{"n":40}',
            "tail_deleted": None,
            "tail_new": b'{"n":6}',
            "tail_stale": b'{"n":7}',
            "tail_unstamped": b'{"n":8}',
        },
        timestamps={"overridden": NOW_MS - 500, "tail_new": NOW_MS - 2_000, "tail_stale": 0},
    )

    values, expiry, expired = entities(state(table, tail))

    assert values == {
        "fresh": b'{"n":1}',
        "unstamped": b'{"n":3}',
        "overridden": b'{"n":40}',
        "tail_new": b'{"n":6}',
        "tail_unstamped": b'{"n":8}',
    }
    assert expiry == {
        "fresh": 4_000,
        "unstamped": TTL_MS,
        "overridden": 4_500,
        "tail_new": 3_000,
        "tail_unstamped": TTL_MS,
    }
    assert expired == 2  # "old" and "tail_stale"; "overridden" and "tail_deleted" are not


def test_without_a_redis_ttl_nothing_expires_and_updated_at_is_no_entity_field():
    table = pa.table(
        {
            "_key": ["a"],
            "_updated_at": pa.array([_at(10**9)], pa.timestamp("us", "UTC")),
            "n": [1],
        }
    )
    values, expiry, expired = entities(state(table, Tail("t"), ttl_ms=None))
    assert values == {"a": b'{"n":1}'}
    assert expiry == {"a": None}
    assert expired == 0
